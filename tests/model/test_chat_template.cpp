// Chat templates other than the two in ../shared: each source is a published model's chat_template
// (TinyLlama-1.1B-Chat = zephyr, Llama-2-chat, SmolLM2, Qwen2.5, Mistral-7B-Instruct-v0.1, Llama 3.1
// with its tools branches left out), reproduced here; each expected rendering was produced by
// Python jinja2 3.1 configured as transformers configures it (trim_blocks, lstrip_blocks,
// raise_exception), with bos "<s>" and eos "</s>". std::nullopt: the template raises.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "text/chat_template.h"

using namespace tpcli::text;

namespace {

struct Case {
  std::string messages;  // JSON
  std::optional<std::string> rendered;
};

struct Published {
  std::string name, source;
  std::vector<Case> cases;
};

const std::vector<Published> PUBLISHED = {
    {"zephyr", R"~~~({% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>
'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %})~~~",
     {{R"~~~([{"role": "system", "content": "  Be brief. \n"}, {"role": "user", "content": " Hello\n there "}])~~~", R"~~~(<|system|>
  Be brief. 
</s>
<|user|>
 Hello
 there </s>
<|assistant|>
)~~~"},
      {R"~~~([{"role": "user", "content": "a"}, {"role": "assistant", "content": " b "}, {"role": "user", "content": "c"}])~~~", R"~~~(<|user|>
a</s>
<|assistant|>
 b </s>
<|user|>
c</s>
<|assistant|>
)~~~"}}},
    {"llama2", R"~~~({% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %})~~~",
     {{R"~~~([{"role": "system", "content": "  Be brief. \n"}, {"role": "user", "content": " Hello\n there "}])~~~", R"~~~(<s>[INST] <<SYS>>
  Be brief. 

<</SYS>>

 Hello
 there [/INST])~~~"},
      {R"~~~([{"role": "user", "content": "a"}, {"role": "assistant", "content": " b "}, {"role": "user", "content": "c"}])~~~", R"~~~(<s>[INST] a [/INST] b </s><s>[INST] c [/INST])~~~"}}},
    {"smollm", R"~~~({% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system
You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>
' }}{% endif %}{{'<|im_start|>' + message['role'] + '
' + message['content'] + '<|im_end|>' + '
'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant
' }}{% endif %})~~~",
     {{R"~~~([{"role": "system", "content": "  Be brief. \n"}, {"role": "user", "content": " Hello\n there "}])~~~", R"~~~(<|im_start|>system
  Be brief. 
<|im_end|>
<|im_start|>user
 Hello
 there <|im_end|>
<|im_start|>assistant
)~~~"},
      {R"~~~([{"role": "user", "content": "a"}, {"role": "assistant", "content": " b "}, {"role": "user", "content": "c"}])~~~", R"~~~(<|im_start|>system
You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>
<|im_start|>user
a<|im_end|>
<|im_start|>assistant
 b <|im_end|>
<|im_start|>user
c<|im_end|>
<|im_start|>assistant
)~~~"}}},
    {"qwen25", R"~~~({%- if tools %}
    {{- '<|im_start|>system\n' }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)~~~",
     {{R"~~~([{"role": "system", "content": "  Be brief. \n"}, {"role": "user", "content": " Hello\n there "}])~~~", R"~~~(<|im_start|>system
  Be brief. 
<|im_end|>
<|im_start|>user
 Hello
 there <|im_end|>
<|im_start|>assistant
)~~~"},
      {R"~~~([{"role": "user", "content": "a"}, {"role": "assistant", "content": " b "}, {"role": "user", "content": "c"}])~~~", R"~~~(<|im_start|>system
You are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>
<|im_start|>user
a<|im_end|>
<|im_start|>assistant
 b <|im_end|>
<|im_start|>user
c<|im_end|>
<|im_start|>assistant
)~~~"}}},
    {"mistral", R"~~~({{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %})~~~",
     {{R"~~~([{"role": "system", "content": "  Be brief. \n"}, {"role": "user", "content": " Hello\n there "}])~~~", std::nullopt},
      {R"~~~([{"role": "user", "content": "a"}, {"role": "assistant", "content": " b "}, {"role": "user", "content": "c"}])~~~", R"~~~(<s>[INST] a [/INST] b </s>[INST] c [/INST])~~~"}}},
    {"llama31", R"~~~({{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
)~~~",
     {{R"~~~([{"role": "system", "content": "  Be brief. \n"}, {"role": "user", "content": " Hello\n there "}])~~~", R"~~~(<s><|start_header_id|>system<|end_header_id|>

Cutting Knowledge Date: December 2023
Today Date: 26 Jul 2024

Be brief.<|eot_id|><|start_header_id|>user<|end_header_id|>

Hello
 there<|eot_id|><|start_header_id|>assistant<|end_header_id|>

)~~~"},
      {R"~~~([{"role": "user", "content": "a"}, {"role": "assistant", "content": " b "}, {"role": "user", "content": "c"}])~~~", R"~~~(<s><|start_header_id|>system<|end_header_id|>

Cutting Knowledge Date: December 2023
Today Date: 26 Jul 2024

<|eot_id|><|start_header_id|>user<|end_header_id|>

a<|eot_id|><|start_header_id|>assistant<|end_header_id|>

b<|eot_id|><|start_header_id|>user<|end_header_id|>

c<|eot_id|><|start_header_id|>assistant<|end_header_id|>

)~~~"}}},
};

std::vector<ChatMessage> parse(const std::string& json_text) {
  std::vector<ChatMessage> messages;
  for (const auto& m : nlohmann::json::parse(json_text)) messages.push_back({m["role"], m["content"]});
  return messages;
}

}  // namespace

TEST_CASE("chat templates: published sources are recognised and rendered as jinja2 renders them") {
  const std::vector<std::pair<std::string, ChatFormat>> expected_format = {
      {"zephyr", ChatFormat::Zephyr}, {"llama2", ChatFormat::Llama2},   {"smollm", ChatFormat::ChatML},
      {"qwen25", ChatFormat::ChatML}, {"mistral", ChatFormat::Mistral}, {"llama31", ChatFormat::Llama3Dated}};
  for (const Published& p : PUBLISHED) {
    INFO(p.name);
    const ChatTemplate t = recognise_chat_template(p.source);
    for (const auto& [name, format] : expected_format)
      if (name == p.name) CHECK(t.format == format);
    for (const Case& c : p.cases) {
      INFO(c.messages);
      if (c.rendered) {
        CHECK(render_chat(t, parse(c.messages), {"<s>", "</s>"}, true) == *c.rendered);
      } else {
        CHECK_THROWS_AS(render_chat(t, parse(c.messages), {"<s>", "</s>"}, true), std::invalid_argument);
      }
    }
  }
}

TEST_CASE("chat templates: an unknown source or name is an error that lists the known formats") {
  CHECK_THROWS_WITH(recognise_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}"),
                    Catch::Contains("not recognised") && Catch::Contains("--template"));
  CHECK_THROWS_WITH(chat_template_named("gemma"), Catch::Contains("gemma") && Catch::Contains("chatml"));
  for (const char* name : {"llama3", "llama3-dated", "chatml", "qwen3", "llama2", "mistral", "zephyr"})
    CHECK(chat_format_name(chat_template_named(name).format) == name);
}

TEST_CASE("chat templates: Qwen3's reasoning and tool turns as jinja2 renders its published template") {
  std::ifstream in(std::string(TPCLI_SHARED_DIR) + "/data/hf-tokenizers/qwen3/tokenizer_config.json");
  if (!in) {
    WARN("SKIPPED: qwen3 tokenizer_config.json is absent");
    return;
  }
  const ChatTemplate t = recognise_chat_template(nlohmann::json::parse(in)["chat_template"].get<std::string>());
  REQUIRE(t.format == ChatFormat::Qwen3);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"~~~([{"role": "system", "content": "S"}, {"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nb"}, {"role": "user", "content": "c"}])~~~", R"~~~(<|im_start|>system
S<|im_end|>
<|im_start|>user
a<|im_end|>
<|im_start|>assistant
b<|im_end|>
<|im_start|>user
c<|im_end|>
<|im_start|>assistant
)~~~"},
      {R"~~~([{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>\nr1\n</think>\n\nans"}])~~~", R"~~~(<|im_start|>user
q<|im_end|>
<|im_start|>assistant
<think>
r1
</think>

ans<|im_end|>
<|im_start|>assistant
)~~~"},
      {R"~~~([{"role": "user", "content": "q"}, {"role": "assistant", "content": "plain"}])~~~", R"~~~(<|im_start|>user
q<|im_end|>
<|im_start|>assistant
<think>

</think>

plain<|im_end|>
<|im_start|>assistant
)~~~"},
      {R"~~~([{"role": "user", "content": "weather?"}, {"role": "assistant", "content": "calling"}, {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "20C"}])~~~", R"~~~(<|im_start|>user
weather?<|im_end|>
<|im_start|>assistant
calling<|im_end|>
<|im_start|>user
<tool_response>
sunny
</tool_response>
<tool_response>
20C
</tool_response><|im_end|>
<|im_start|>assistant
)~~~"},
  };
  for (const auto& [messages, rendered] : cases) {
    INFO(messages);
    CHECK(render_chat(t, parse(messages), {"", "<|im_end|>"}, true) == rendered);
  }
}

TEST_CASE("chat templates: a source that resembles a known format but writes other markers is refused, naming the marker") {
  const std::string folder = std::string(TPCLI_SHARED_DIR) + "/reference/chat-templates/templates/";
  const auto source = [&](const std::string& name) {
    std::ifstream in(folder + name + ".jinja");
    if (!in) return std::string();
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  if (source("microsoft-Phi-3.5-mini-instruct").empty()) {
    WARN("SKIPPED: ../shared/reference/chat-templates is absent");
    return;
  }
  // Phi-3 writes <|end|> where zephyr writes eos_token; GLM-4.6 and Phi-4-mini are not zephyr either.
  CHECK_THROWS_WITH(recognise_chat_template(source("microsoft-Phi-3.5-mini-instruct")),
                    Catch::Contains("zephyr") && Catch::Contains("<|end|>") && Catch::Contains("--template"));
  CHECK_THROWS_WITH(recognise_chat_template(source("GLM-4.6")), Catch::Contains("<|observation|>"));
  CHECK_THROWS_WITH(recognise_chat_template(source("vllm-tool_chat_template_phi4_mini")), Catch::Contains("<|end|>"));
  CHECK_THROWS_WITH(recognise_chat_template(source("LFM2-8B-A1B")), Catch::Contains("chatml") && Catch::Contains("<|tool_list_start|>"));
  // What the formats write themselves stays recognised.
  CHECK(recognise_chat_template(source("meta-llama-Llama-3.1-8B-Instruct")).format == ChatFormat::Llama3Dated);
  CHECK(recognise_chat_template(source("meta-llama-Llama-3.2-3B-Instruct")).format == ChatFormat::Llama3Dated);
  CHECK(recognise_chat_template(source("Qwen-Qwen2.5-7B-Instruct")).format == ChatFormat::ChatML);
  CHECK(recognise_chat_template(source("Qwen-Qwen3-4B")).format == ChatFormat::Qwen3);
}

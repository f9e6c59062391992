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

#include "support/temp_dir.h"
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

TEST_CASE("chat templates: published sources render through the interpreter as jinja2 renders them") {
  for (const Published& p : PUBLISHED) {
    INFO(p.name);
    const ChatTemplate t = chat_template_from_source(p.source, p.name);
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

TEST_CASE("chat templates: each bundled template renders every case as jinja2 renders the published template it follows") {
  // tpcli's own sources for --template NAME against jinja2's renderings of the published ones.
  const std::vector<std::pair<std::string, std::string>> follows = {
      {"zephyr", "zephyr"}, {"llama2", "llama2"}, {"mistral", "mistral"}, {"llama3-dated", "llama31"}};
  int compared = 0;
  for (const auto& [bundled, published] : follows) {
    const ChatTemplate ours = chat_template_named(bundled);
    for (const Published& p : PUBLISHED) {
      if (p.name != published) continue;
      for (const Case& c : p.cases) {
        INFO(bundled << " against jinja2's " << p.name << ": " << c.messages);
        if (c.rendered) {
          CHECK(render_chat(ours, parse(c.messages), {"<s>", "</s>"}, true) == *c.rendered);
        } else {
          CHECK_THROWS_AS(render_chat(ours, parse(c.messages), {"<s>", "</s>"}, true), std::invalid_argument);
        }
        ++compared;
      }
    }
  }
  CHECK(compared >= 8);  // every published case of the four
}

TEST_CASE("chat templates: a name that is neither bundled nor a file is an error listing the bundled names, and a file is read") {
  CHECK_THROWS_WITH(chat_template_named("gemma"), Catch::Contains("gemma") && Catch::Contains("chatml"));
  for (const char* name : {"llama3", "llama3-dated", "chatml", "qwen3", "llama2", "mistral", "zephyr"})
    CHECK(chat_template_named(name).name == name);
  CHECK_THROWS_WITH(chat_template_from_source("{% for m in messages %}", "broken"), Catch::Contains("broken"));
  tpcli::testing::TempDir dir;
  const std::string path = dir.write("mine.jinja", "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}");
  CHECK(render_chat(chat_template_named(path), parse(R"([{"role": "user", "content": "hi"}])"), {}, true) == "[user] hi\n");
}

TEST_CASE("chat templates: the end-of-turn tokens are the markers the source writes, then EOS") {
  CHECK(end_of_turn_tokens(chat_template_named("llama3"), {"<s>", "</s>"}) == std::vector<std::string>{"<|eot_id|>", "</s>"});
  CHECK(end_of_turn_tokens(chat_template_named("chatml"), {"", "<|im_end|>"}) == std::vector<std::string>{"<|im_end|>"});
  CHECK(end_of_turn_tokens(chat_template_named("zephyr"), {"<s>", "</s>"}) == std::vector<std::string>{"</s>"});
}

TEST_CASE("chat templates: Qwen3's reasoning and tool turns as jinja2 renders its published template, and the bundled qwen3 alike") {
  std::ifstream in(std::string(TPCLI_SHARED_DIR) + "/data/hf-tokenizers/qwen3/tokenizer_config.json");
  if (!in) {
    WARN("SKIPPED: qwen3 tokenizer_config.json is absent");
    return;
  }
  const ChatTemplate t = chat_template_from_source(nlohmann::json::parse(in)["chat_template"].get<std::string>(), "qwen3");
  const ChatTemplate bundled = chat_template_named("qwen3");
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
    CHECK(render_chat(bundled, parse(messages), {"", "<|im_end|>"}, true) == rendered);
  }
}

TEST_CASE("chat templates: Phi-3.5's template renders its own <|end|>, which ends its turns") {
  const std::string folder = std::string(TPCLI_SHARED_DIR) + "/reference/chat-templates/templates/";
  std::ifstream in(folder + "microsoft-Phi-3.5-mini-instruct.jinja");
  if (!in) {
    WARN("SKIPPED: ../shared/reference/chat-templates is absent");
    return;
  }
  const ChatTemplate t = chat_template_from_source(std::string(std::istreambuf_iterator<char>(in), {}), "phi-3.5");
  const std::string text = render_chat(t, parse(R"([{"role": "user", "content": "Hi"}])"), {"<s>", "<|endoftext|>"}, true);
  CHECK(text == "<|user|>\nHi<|end|>\n<|assistant|>\n");
  CHECK(end_of_turn_tokens(t, {"<s>", "<|endoftext|>"}) == std::vector<std::string>{"<|end|>", "<|endoftext|>"});
}

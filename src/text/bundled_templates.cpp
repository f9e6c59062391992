// tpcli::text — the chat templates `--template NAME` picks, written for tpcli in the style of the
// published ones they follow (see bundled_templates.h). Every one renders through the Jinja
// interpreter like a template read from tokenizer_config.json.
#include "text/bundled_templates.h"

#include <array>
#include <utility>

namespace tpcli::text {

namespace {

// Llama 3: a header per message, the content trimmed, BOS before the first.
constexpr std::string_view LLAMA3 = R"jinja(
{%- for message in messages -%}
  {%- if loop.first -%}{{- bos_token -}}{%- endif -%}
  {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{%- endif -%}
)jinja";

// Llama 3.1 / 3.2: a system header that always carries the knowledge cut-off and a fixed date.
constexpr std::string_view LLAMA3_DATED = R"jinja(
{%- if messages and messages[0]['role'] == 'system' -%}
  {%- set system = messages[0]['content'] | trim -%}
  {%- set rest = messages[1:] -%}
{%- else -%}
  {%- set system = '' -%}
  {%- set rest = messages -%}
{%- endif -%}
{{- bos_token -}}
{{- '<|start_header_id|>system<|end_header_id|>\n\n' -}}
{{- 'Cutting Knowledge Date: ' + (knowledge_cutoff if knowledge_cutoff is defined else 'December 2023') + '\n' -}}
{{- 'Today Date: ' + (date_string if date_string is defined else '26 Jul 2024') + '\n\n' -}}
{{- system + '<|eot_id|>' -}}
{%- for message in rest -%}
  {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{%- endif -%}
)jinja";

// ChatML (Qwen 2.5, SmolLM): <|im_start|>role ... <|im_end|> per message.
constexpr std::string_view CHATML = R"jinja(
{%- for message in messages -%}
  {{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
)jinja";

// Qwen3: ChatML whose assistant turns after the last user query keep their reasoning in
// <think>...</think>; consecutive tool results share one user turn.
constexpr std::string_view QWEN3 = R"jinja(
{%- if messages and messages[0]['role'] == 'system' -%}
  {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' -}}
{%- endif -%}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) -%}
{%- for message in messages[::-1] -%}
  {%- set index = (messages|length - 1) - loop.index0 -%}
  {%- if ns.multi_step_tool and message['role'] == 'user' and not (message['content'].startswith('<tool_response>') and message['content'].endswith('</tool_response>')) -%}
    {%- set ns.multi_step_tool = false -%}
    {%- set ns.last_query_index = index -%}
  {%- endif -%}
{%- endfor -%}
{%- for message in messages -%}
  {%- if message['role'] == 'user' or (message['role'] == 'system' and not loop.first) -%}
    {{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}
  {%- elif message['role'] == 'assistant' -%}
    {%- set content = message['content'] -%}
    {%- set reasoning = '' -%}
    {%- if '</think>' in content -%}
      {%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') -%}
      {%- set content = content.split('</think>')[-1].lstrip('\n') -%}
    {%- endif -%}
    {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning) -%}
      {{- '<|im_start|>assistant\n<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') + '<|im_end|>\n' -}}
    {%- else -%}
      {{- '<|im_start|>assistant\n' + content + '<|im_end|>\n' -}}
    {%- endif -%}
  {%- elif message['role'] == 'tool' -%}
    {%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\n<tool_response>\n' + message['content'] + '\n</tool_response>' -}}
    {%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
)jinja";

// Llama 2 chat: the system message folded into the first user turn, roles alternating.
constexpr std::string_view LLAMA2 = R"jinja(
{%- if messages and messages[0]['role'] == 'system' -%}
  {%- set system = messages[0]['content'] -%}
  {%- set rest = messages[1:] -%}
{%- else -%}
  {%- set system = none -%}
  {%- set rest = messages -%}
{%- endif -%}
{%- for message in rest -%}
  {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
    {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}
  {%- endif -%}
  {%- if loop.first and system is not none -%}
    {%- set content = '<<SYS>>\n' + system + '\n<</SYS>>\n\n' + message['content'] -%}
  {%- else -%}
    {%- set content = message['content'] -%}
  {%- endif -%}
  {%- if message['role'] == 'user' -%}
    {{- bos_token -}}{{- '[INST] ' + content | trim + ' [/INST]' -}}
  {%- elif message['role'] == 'assistant' -%}
    {{- ' ' + content | trim + ' ' -}}{{- eos_token -}}
  {%- endif -%}
{%- endfor -%}
)jinja";

// Mistral 7B Instruct v0.1: [INST] turns, user and assistant only.
constexpr std::string_view MISTRAL = R"jinja(
{{- bos_token -}}
{%- for message in messages -%}
  {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
    {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}
  {%- endif -%}
  {%- if message['role'] == 'user' -%}
    {{- '[INST] ' + message['content'] + ' [/INST]' -}}
  {%- elif message['role'] == 'assistant' -%}
    {{- message['content'] -}}{{- eos_token -}}
  {%- else -%}
    {{- raise_exception('Only user and assistant roles are supported!') -}}
  {%- endif -%}
{%- endfor -%}
)jinja";

// Zephyr (TinyLlama chat): <|role|> lines, each turn closed by EOS.
constexpr std::string_view ZEPHYR = R"jinja(
{%- for message in messages -%}
  {%- if message['role'] in ['user', 'system', 'assistant'] -%}
    {{- '<|' + message['role'] + '|>\n' + message['content'] -}}{{- eos_token -}}{{- '\n' -}}
  {%- endif -%}
  {%- if loop.last and add_generation_prompt -%}{{- '<|assistant|>\n' -}}{%- endif -%}
{%- endfor -%}
)jinja";

constexpr std::array<std::pair<std::string_view, std::string_view>, 7> BUNDLED{{
    {"llama3", LLAMA3},
    {"llama3-dated", LLAMA3_DATED},
    {"chatml", CHATML},
    {"qwen3", QWEN3},
    {"llama2", LLAMA2},
    {"mistral", MISTRAL},
    {"zephyr", ZEPHYR},
}};

}  // namespace

std::optional<std::string_view> bundled_template(std::string_view name) {
  for (const auto& [known, source] : BUNDLED)
    if (known == name) return source.substr(1);  // the raw string's first newline is not the template's
  return std::nullopt;
}

std::string bundled_template_names() {
  std::string names;
  for (const auto& [known, source] : BUNDLED) names += (names.empty() ? "" : ", ") + std::string(known);
  return names;
}

}  // namespace tpcli::text

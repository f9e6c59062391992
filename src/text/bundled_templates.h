// tpcli::text — the chat templates tpcli carries, by name, for `--template NAME` (a model whose
// tokenizer_config.json has none, or to override it): llama3, llama3-dated (3.1/3.2), chatml (Qwen
// 2.5, SmolLM), qwen3, llama2, mistral (v0.1), zephyr (TinyLlama). Each is Jinja source, rendered as
// any template is (text/chat_template.h).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace tpcli::text {

// The Jinja source of the bundled template `name`; nullopt for a name tpcli does not carry.
std::optional<std::string_view> bundled_template(std::string_view name);
std::string bundled_template_names();  // "llama3, llama3-dated, ..." for messages

}  // namespace tpcli::text

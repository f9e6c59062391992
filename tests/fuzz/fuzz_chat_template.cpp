// libFuzzer target: a Jinja chat template parsed and rendered by tpcli::text (text/chat_template.h).
// The input is the template, optionally followed by a NUL and a JSON object of extra variables
// (merged over a small chat with tools). Every failure must be a TemplateError; the sandbox's
// limits are set low so that a hostile template (deep recursion, huge loops, exponential strings)
// ends within the fuzzer's time and memory budget instead of timing out.
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "text/jinja_template.h"

namespace {

const nlohmann::ordered_json& base_variables() {
  static const nlohmann::ordered_json v = nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi \u00e9"},
                 {"role": "assistant", "content": "", "tool_calls": [{"id": "abc123XYZ", "type": "function",
                  "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2, "metric": true}}}]},
                 {"role": "tool", "tool_call_id": "abc123XYZ", "content": "{\"t\": 21.5}"},
                 {"role": "user", "content": [{"type": "text", "text": "Thanks"}]}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"},
               "days": {"type": ["integer", "null"], "default": 1}}, "required": ["city"]}}}],
    "documents": null, "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})");
  return v;
}

tpcli::text::RenderOptions fuzz_options() {
  tpcli::text::RenderOptions options;
  std::tm t{};
  t.tm_year = 126, t.tm_mon = 6, t.tm_mday = 26;
  options.now = t;
  options.limits.max_steps = 200000;
  options.limits.max_output_bytes = size_t{1} << 20;
  return options;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string_view source = input.substr(0, nul);
  nlohmann::ordered_json variables = base_variables();
  if (nul != std::string_view::npos) {
    const auto extra = nlohmann::ordered_json::parse(input.substr(nul + 1), nullptr, false);
    if (extra.is_object())
      for (const auto& [k, v] : extra.items()) variables[k] = v;
  }
  static const tpcli::text::RenderOptions options = fuzz_options();
  try {
    const tpcli::text::JinjaTemplate chat(source);
    (void)chat.render(variables, options);
  } catch (const tpcli::text::TemplateError&) {
  }
  return 0;
}

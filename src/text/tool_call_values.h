// tpcli::text — the values inside tool calls: where a JSON (or Python literal) value ends in text
// still arriving, Python literals read as JSON (pythonic calls write True/None/'single quotes'), and
// arguments turned into the compact JSON object text OpenAI sends.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace tpcli::text::tool_values {

enum class ScanStatus { incomplete, complete, invalid };
struct ValueScan {
  ScanStatus status;
  size_t length = 0;  // bytes of the value when complete
};
// The value starting at text[0] (no leading whitespace): an object, array, tuple or string ends at
// its closing bracket or quote (strings in " or ', backslash escapes); a number or word at the first
// character that cannot continue it. `text_ended`: no more text will follow (a word at the end is complete).
ValueScan scan_value(std::string_view text, bool text_ended);

size_t skip_space(std::string_view text, size_t at);
std::string_view trim(std::string_view text);
bool is_space(char c);

// Strict JSON (a whole text, whitespace around allowed); nullopt when it does not parse.
std::optional<nlohmann::ordered_json> parse_json(std::string_view text);
// JSON, else a Python literal (True/False/None, 'strings', tuples, trailing commas) read as JSON.
std::optional<nlohmann::ordered_json> parse_literal(std::string_view text);

struct PythonCall {
  std::string name;
  nlohmann::ordered_json arguments;  // an object: keyword -> value
};
// `[f(a=1, b="x"), g()]` (the brackets included); nullopt unless every element is a call with
// keyword arguments only.
std::optional<std::vector<PythonCall>> parse_python_calls(std::string_view text);

// Arguments as OpenAI sends them: a JSON object's compact text. Absent or null -> "{}"; an object;
// a string holding a JSON object (templates that render arguments as a JSON string). Else nullopt.
std::optional<std::string> arguments_text(const nlohmann::ordered_json* arguments);

}  // namespace tpcli::text::tool_values

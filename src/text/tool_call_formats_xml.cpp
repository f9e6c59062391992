// The formats that write each argument as text between tags: qwen3_coder, seed_oss, glm4_5.
#include "text/tool_call_syntax.h"

namespace tpcli::text::tool_syntax {

using nlohmann::ordered_json;
using namespace tool_values;

namespace {

// ---- the XML formats: arguments written as text ----

// What a tool's schema says of parameter `key` of function `name`: nothing (no such tool among
// `tools`), undeclared (the tool has no such parameter), or its JSON type ("" when it gives none).
struct Declared {
  bool tool_known = false, parameter_known = false;
  std::string type;
};
Declared declared(const nlohmann::json& tools, std::string_view name, std::string_view key) {
  if (!tools.is_array()) return {};
  for (const auto& tool : tools) {
    const nlohmann::json& function = tool.contains("function") ? tool["function"] : tool;
    if (!function.is_object() || function.value("name", "") != name) continue;
    const nlohmann::json& parameters = function.value("parameters", nlohmann::json::object());
    const nlohmann::json& properties = parameters.is_object() ? parameters.value("properties", nlohmann::json::object()) : parameters;
    if (!properties.is_object() || !properties.contains(std::string(key))) return {true, false, ""};
    const nlohmann::json& type = properties[std::string(key)].value("type", nlohmann::json());
    if (type.is_string()) return {true, true, type.get<std::string>()};
    if (type.is_array() && !type.empty() && type[0].is_string()) return {true, true, type[0].get<std::string>()};
    return {true, true, ""};
  }
  return {};
}

// A parameter written as text: a string the schema declares, or a parameter the tool does not
// declare, stays text (as vLLM reads them); any other value is read as JSON (or a Python literal)
// where it parses, else it is text.
ordered_json typed_value(const nlohmann::json& tools, std::string_view function, std::string_view key, std::string_view raw) {
  const Declared d = declared(tools, function, key);
  if (d.type == "string" || (d.tool_known && !d.parameter_known)) return std::string(raw);
  if (auto value = parse_literal(raw)) return *value;
  return std::string(raw);
}

std::string_view strip_one_newline(std::string_view value) {
  if (!value.empty() && value.front() == '\n') value.remove_prefix(1);
  if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
  return value;
}

// <function=NAME><parameter=KEY>VALUE</parameter>...</function> (Qwen3-Coder, Seed-OSS).
std::optional<ParsedCall> xml_function(std::string_view text, const nlohmann::json& tools) {
  const size_t open = text.find("<function=");
  if (open == std::string_view::npos) return std::nullopt;
  const size_t name_end = text.find('>', open);
  if (name_end == std::string_view::npos) return std::nullopt;
  const std::string name(trim(text.substr(open + 10, name_end - open - 10)));
  if (name.empty()) return std::nullopt;
  const size_t function_end = std::min(text.find("</function>", name_end), text.size());
  ordered_json arguments = ordered_json::object();
  size_t at = name_end + 1;
  for (;;) {
    const size_t p = text.find("<parameter=", at);
    if (p == std::string_view::npos || p >= function_end) break;
    const size_t key_end = text.find('>', p);
    if (key_end == std::string_view::npos || key_end >= function_end) return std::nullopt;
    const std::string key(trim(text.substr(p + 11, key_end - p - 11)));
    // A value ends at its closer, or (vLLM reads it so) where the next parameter or the function ends.
    size_t value_end = std::min({text.find("</parameter>", key_end), text.find("<parameter=", key_end), function_end});
    const std::string_view value = strip_one_newline(text.substr(key_end + 1, value_end - key_end - 1));
    arguments[key] = typed_value(tools, name, key, value);
    at = value_end;
    if (text.substr(at, 12) == "</parameter>") at += 12;
  }
  return ParsedCall{name, *arguments_text(&arguments)};
}

Syntax xml_functions(std::string opener, std::string closer, bool bare_function_too) {
  std::vector<Opener> openers = {{opener}};
  if (bare_function_too) openers.push_back({"<function="});
  return {openers,
          [closer](std::string_view open, std::string_view block, bool ended) {
            return until_closer(block, open.size(), {open == "<function=" ? std::string_view("</function>") : std::string_view(closer)}, ended);
          },
          [](std::string_view open, std::string_view block, const nlohmann::json& tools) -> std::optional<ParsedBlock> {
            const std::string_view text = open == "<function=" ? block : block.substr(open.size());
            return one_call(xml_function(text, tools));
          }};
}

}  // namespace

// <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>...</tool_call>
Syntax glm4_5_syntax() {
  return {{{"<tool_call>"}},
          [](std::string_view opener, std::string_view block, bool ended) { return until_closer(block, opener.size(), {"</tool_call>"}, ended); },
          [](std::string_view opener, std::string_view block, const nlohmann::json& tools) -> std::optional<ParsedBlock> {
            const std::string_view body = inner(block, opener, {"</tool_call>"});
            const std::string name(trim(body.substr(0, body.find("<arg_key>"))));
            if (name.empty() || name.find_first_of("{}<>\n") != std::string::npos) return std::nullopt;
            const auto keys = between_all(body, "<arg_key>", "</arg_key>");
            const auto values = between_all(body, "<arg_value>", "</arg_value>");
            if (keys.size() != values.size()) return std::nullopt;
            ordered_json arguments = ordered_json::object();
            for (size_t i = 0; i < keys.size(); ++i)
              arguments[std::string(trim(keys[i]))] = typed_value(tools, name, trim(keys[i]), values[i]);
            return ParsedBlock{{{name, *arguments_text(&arguments)}}, ""};
          }};
}

Syntax qwen3_coder_syntax() { return xml_functions("<tool_call>", "</tool_call>", true); }
Syntax seed_oss_syntax() { return xml_functions("<seed:tool_call>", "</seed:tool_call>", false); }

}  // namespace tpcli::text::tool_syntax

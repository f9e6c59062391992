// The tool-call formats, one Syntax each: where a call block ends, and what calls it holds.
#include <map>

#include "text/tool_call_syntax.h"

namespace tpcli::text::tool_syntax {

namespace {

using nlohmann::ordered_json;
using namespace tool_values;

constexpr ValueScan INCOMPLETE{ScanStatus::incomplete};
constexpr ValueScan INVALID{ScanStatus::invalid};
ValueScan complete(size_t length) { return {ScanStatus::complete, length}; }

// ---- reading a block's text ----

// Does `text` at `at` start with `literal`? A text that ends inside it may still: incomplete.
ScanStatus expect(std::string_view text, size_t at, std::string_view literal, bool text_ended) {
  const std::string_view here = text.substr(std::min(at, text.size()));
  if (here.substr(0, literal.size()) == literal) return ScanStatus::complete;
  if (!text_ended && here.size() < literal.size() && literal.substr(0, here.size()) == here) return ScanStatus::incomplete;
  return ScanStatus::invalid;
}

// The block ends after the first of `closers` found from `from`; a call the text ends inside
// (generation stopped at its end-of-turn token before the closer) runs to the end.
ValueScan until_closer(std::string_view block, size_t from, std::initializer_list<std::string_view> closers, bool text_ended) {
  size_t best = std::string_view::npos, best_length = 0;
  for (std::string_view closer : closers) {
    const size_t at = block.find(closer, from);
    if (at < best) best = at, best_length = closer.size();
  }
  if (best != std::string_view::npos) return complete(best + best_length);
  return text_ended ? complete(block.size()) : INCOMPLETE;
}

// The text between the opener and the first closer (or the end).
std::string_view inner(std::string_view block, std::string_view opener, std::initializer_list<std::string_view> closers) {
  std::string_view body = block.substr(opener.size());
  for (std::string_view closer : closers)
    if (body.size() >= closer.size() && body.substr(body.size() - closer.size()) == closer) return body.substr(0, body.size() - closer.size());
  return body;
}

// One JSON value after whitespace from `at`: the end of the value.
ValueScan value_from(std::string_view block, size_t at, bool text_ended) {
  at = skip_space(block, at);
  if (at >= block.size()) return text_ended ? INVALID : INCOMPLETE;
  const ValueScan value = scan_value(block.substr(at), text_ended);
  return value.status == ScanStatus::complete ? complete(at + value.length) : value;
}

// Values separated by `separator` (';' for Llama's parallel calls), from `at`.
ValueScan separated_values(std::string_view block, size_t at, char separator, bool text_ended) {
  for (;;) {
    const ValueScan value = value_from(block, at, text_ended);
    if (value.status != ScanStatus::complete) return value;
    const size_t next = skip_space(block, value.length);
    if (next >= block.size()) return text_ended ? value : INCOMPLETE;  // a separator may follow
    if (block[next] != separator) return value;
    at = next + 1;
  }
}

// Splits `text` at top-level `separator`s into the values scan_value finds; nullopt if one is not a value.
std::optional<std::vector<std::string_view>> split_values(std::string_view text, char separator) {
  std::vector<std::string_view> values;
  size_t at = skip_space(text, 0);
  while (at < text.size()) {
    const ValueScan value = scan_value(text.substr(at), true);
    if (value.status != ScanStatus::complete) return std::nullopt;
    values.push_back(text.substr(at, value.length));
    at = skip_space(text, at + value.length);
    if (at < text.size() && text[at] != separator) return std::nullopt;
    if (at < text.size()) at = skip_space(text, at + 1);
  }
  return values;
}

bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' || static_cast<unsigned char>(c) >= 0x80;
}

// ---- calls out of values ----

// {"name": ..., "<one of argument_keys>": {...}} as a call.
std::optional<ParsedCall> call_from_object(const ordered_json& object, std::string_view name_key = "name",
                                           std::initializer_list<std::string_view> argument_keys = {"arguments", "parameters"}) {
  if (!object.is_object()) return std::nullopt;
  const auto name = object.find(std::string(name_key));
  if (name == object.end() || !name->is_string() || name->get<std::string>().empty()) return std::nullopt;
  const ordered_json* arguments = nullptr;
  for (std::string_view key : argument_keys)
    if (auto found = object.find(std::string(key)); found != object.end() && !arguments) arguments = &*found;
  auto text = arguments_text(arguments);
  if (!text) return std::nullopt;
  return ParsedCall{name->get<std::string>(), std::move(*text)};
}

// A list of call objects, or one object, as calls; nullopt if any is not a call.
std::optional<ParsedBlock> calls_from_value(const std::optional<ordered_json>& value, std::string_view name_key = "name",
                                            std::initializer_list<std::string_view> argument_keys = {"arguments", "parameters"}) {
  if (!value) return std::nullopt;
  ParsedBlock block;
  const ordered_json list = value->is_array() ? *value : ordered_json::array({*value});
  if (list.empty()) return std::nullopt;
  for (const ordered_json& item : list) {
    auto call = call_from_object(item, name_key, argument_keys);
    if (!call) return std::nullopt;
    block.calls.push_back(std::move(*call));
  }
  return block;
}

std::optional<ParsedCall> call_with_arguments(std::string name, std::string_view arguments_json) {
  name = std::string(trim(name));
  if (name.empty()) return std::nullopt;
  const auto arguments = parse_literal(trim(arguments_json));
  if (!arguments || !arguments->is_object()) return std::nullopt;
  return ParsedCall{std::move(name), *arguments_text(&*arguments)};
}

std::optional<ParsedBlock> one_call(std::optional<ParsedCall> call) {
  if (!call) return std::nullopt;
  return ParsedBlock{{std::move(*call)}, ""};
}

// ---- the XML formats: arguments written as text ----

// The JSON type a tool's schema gives parameter `key` of function `name` ("" when it gives none).
std::string declared_type(const nlohmann::json& tools, std::string_view name, std::string_view key) {
  if (!tools.is_array()) return "";
  for (const auto& tool : tools) {
    const nlohmann::json& function = tool.contains("function") ? tool["function"] : tool;
    if (!function.is_object() || function.value("name", "") != name) continue;
    const auto* properties = function.contains("parameters") && function["parameters"].is_object() &&
                                     function["parameters"].contains("properties")
                                 ? &function["parameters"]["properties"]
                                 : nullptr;
    if (!properties || !properties->is_object() || !properties->contains(std::string(key))) return "";
    const nlohmann::json& type = (*properties)[std::string(key)].value("type", nlohmann::json());
    if (type.is_string()) return type.get<std::string>();
    if (type.is_array() && !type.empty() && type[0].is_string()) return type[0].get<std::string>();
    return "";
  }
  return "";
}

// A parameter written as text: a declared string stays text; any other value is read as JSON
// (or a Python literal) where it parses, else it is text.
ordered_json typed_value(const nlohmann::json& tools, std::string_view function, std::string_view key, std::string_view raw) {
  if (declared_type(tools, function, key) == "string") return std::string(raw);
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

// ---- the formats ----

Syntax hermes() {
  return {{{"<tool_call>"}},
          [](std::string_view opener, std::string_view block, bool ended) { return until_closer(block, opener.size(), {"</tool_call>"}, ended); },
          [](std::string_view opener, std::string_view block, const nlohmann::json&) {
            return calls_from_value(parse_json(trim(inner(block, opener, {"</tool_call>"}))));
          }};
}

// After <|python_tag|>, Llama 3.1 writes JSON calls, a built-in tool's call (brave_search.call(query="x")),
// or code for its code interpreter (a call to "python", as llama.cpp reports it).
std::optional<ParsedBlock> llama_builtin_call(std::string_view body) {
  body = trim(body);
  for (std::string_view end : {"<|eom_id|>", "<|eot_id|>"})
    if (body.size() >= end.size() && body.substr(body.size() - end.size()) == end) body = trim(body.substr(0, body.size() - end.size()));
  if (auto calls = parse_python_calls("[" + std::string(body) + "]"); calls && calls->size() == 1 && calls->front().name.size() > 5 &&
                                                                     calls->front().name.substr(calls->front().name.size() - 5) == ".call") {
    auto& call = calls->front();
    return ParsedBlock{{{call.name.substr(0, call.name.size() - 5), *arguments_text(&call.arguments)}}, ""};
  }
  if (body.empty()) return std::nullopt;
  const ordered_json arguments = {{"code", std::string(body)}};
  return ParsedBlock{{{"python", *arguments_text(&arguments)}}, ""};
}

Syntax llama3_json() {
  return {{{"<|python_tag|>"}, {"{", true}},
          [](std::string_view opener, std::string_view block, bool ended) {
            const size_t at = skip_space(block, opener.size());
            if (opener != "{" && at < block.size() && block[at] != '{') return until_closer(block, at, {"<|eom_id|>", "<|eot_id|>"}, ended);
            return separated_values(block, opener == "{" ? 0 : opener.size(), ';', ended);
          },
          [](std::string_view opener, std::string_view block, const nlohmann::json&) -> std::optional<ParsedBlock> {
            const std::string_view body = block.substr(opener == "{" ? 0 : opener.size());
            if (opener != "{" && !trim(body).empty() && trim(body)[0] != '{') return llama_builtin_call(body);
            auto values = split_values(body, ';');
            if (!values || values->empty()) return std::nullopt;
            ParsedBlock parsed;
            for (std::string_view value : *values) {
              const auto object = parse_json(value);
              auto one = calls_from_value(object, "name", {"parameters", "arguments"});
              if (!one || !object->is_object()) return std::nullopt;
              parsed.calls.push_back(std::move(one->calls[0]));
            }
            return parsed;
          }};
}

// [TOOL_CALLS] [{"name", "arguments"}, ...]   or   [TOOL_CALLS]name[CALL_ID]id[ARGS]{...} (tokenizer v11+).
ValueScan mistral_end(std::string_view opener, std::string_view block, bool ended) {
  size_t at = skip_space(block, opener.size());
  if (at >= block.size()) return ended ? INVALID : INCOMPLETE;
  if (block[at] == '[' || block[at] == '{') return value_from(block, at, ended);
  while (at < block.size() && is_name_char(block[at])) ++at;
  if (at >= block.size()) return ended ? INVALID : INCOMPLETE;
  for (std::string_view tag : {std::string_view("[CALL_ID]"), std::string_view("[ARGS]")}) {
    const ScanStatus s = expect(block, at, tag, ended);
    if (s == ScanStatus::incomplete) return INCOMPLETE;
    if (s == ScanStatus::complete) {
      at += tag.size();
      if (tag == "[CALL_ID]") {
        while (at < block.size() && is_name_char(block[at])) ++at;
        if (at >= block.size()) return ended ? INVALID : INCOMPLETE;
      }
    }
  }
  return value_from(block, at, ended);
}

std::optional<ParsedBlock> mistral_parse(std::string_view opener, std::string_view block, const nlohmann::json&) {
  const std::string_view body = trim(block.substr(opener.size()));
  if (body.empty()) return std::nullopt;
  if (body[0] == '[' || body[0] == '{') return calls_from_value(parse_json(body));
  size_t name_end = 0;
  while (name_end < body.size() && is_name_char(body[name_end])) ++name_end;
  std::string_view rest = body.substr(name_end);
  if (rest.substr(0, 9) == "[CALL_ID]") {
    rest.remove_prefix(9);
    while (!rest.empty() && is_name_char(rest[0])) rest.remove_prefix(1);
  }
  if (rest.substr(0, 6) == "[ARGS]") rest.remove_prefix(6);
  return one_call(call_with_arguments(std::string(body.substr(0, name_end)), rest));
}

Syntax mistral() { return {{{"[TOOL_CALLS]"}}, mistral_end, mistral_parse}; }

// [f(a=1), g()]: a '[' opens a call list only if a name and '(' follow.
ValueScan python_list_end(std::string_view block, bool ended) {
  size_t at = skip_space(block, 1);
  if (at >= block.size()) return ended ? INVALID : INCOMPLETE;
  if (!(std::isalpha(static_cast<unsigned char>(block[at])) || block[at] == '_')) return INVALID;
  while (at < block.size() && (std::isalnum(static_cast<unsigned char>(block[at])) || block[at] == '_' || block[at] == '.')) ++at;
  at = skip_space(block, at);
  if (at >= block.size()) return ended ? INVALID : INCOMPLETE;
  if (block[at] != '(') return INVALID;
  return scan_value(block, ended);
}

Syntax pythonic() {
  return {{{"["}, {"<|python_start|>"}, {"<|tool_call_start|>"}},
          [](std::string_view opener, std::string_view block, bool ended) {
            if (opener == "[") return python_list_end(block, ended);
            return until_closer(block, opener.size(), {opener == "<|python_start|>" ? "<|python_end|>" : "<|tool_call_end|>"}, ended);
          },
          [](std::string_view opener, std::string_view block, const nlohmann::json&) -> std::optional<ParsedBlock> {
            const std::string_view list = opener == "[" ? block : trim(inner(block, opener, {"<|python_end|>", "<|tool_call_end|>"}));
            auto calls = parse_python_calls(list);
            if (!calls) return std::nullopt;
            ParsedBlock parsed;
            for (auto& call : *calls) parsed.calls.push_back({call.name, *arguments_text(&call.arguments)});
            return parsed;
          }};
}

Syntax functionary_v3_1() {
  return {{{"<function="}, {"<|python_tag|>"}},
          [](std::string_view opener, std::string_view block, bool ended) {
            if (opener == "<|python_tag|>") return ended ? complete(block.size()) : INCOMPLETE;  // code runs to the end
            return until_closer(block, opener.size(), {"</function>"}, ended);
          },
          [](std::string_view opener, std::string_view block, const nlohmann::json&) -> std::optional<ParsedBlock> {
            const std::string_view body = inner(block, opener, {"</function>"});
            if (opener == "<|python_tag|>") {
              const ordered_json arguments = {{"code", std::string(trim(body))}};
              return ParsedBlock{{{"python", arguments.dump()}}, ""};
            }
            const size_t name_end = body.find('>');
            if (name_end == std::string_view::npos) return std::nullopt;
            return one_call(call_with_arguments(std::string(body.substr(0, name_end)), body.substr(name_end + 1)));
          }};
}

// >>>name\n{...}; the generation prompt ends with ">>>", so the reply's first block opens bare.
// ">>>all\n" is text for the user.
Syntax functionary_v3_2() {
  return {{{"", true}, {">>>"}},
          [](std::string_view opener, std::string_view block, bool ended) {
            size_t at = opener.size();
            while (at < block.size() && is_name_char(block[at])) ++at;
            if (at >= block.size()) return ended ? INVALID : INCOMPLETE;
            if (block[at] != '\n' || at == opener.size()) return INVALID;
            const std::string_view name = block.substr(opener.size(), at - opener.size());
            if (name == "all" || name == "python") {
              const size_t next = block.find(">>>", at);
              if (next != std::string_view::npos) return complete(next);
              return ended ? complete(block.size()) : INCOMPLETE;
            }
            return value_from(block, at + 1, ended);
          },
          [](std::string_view opener, std::string_view block, const nlohmann::json&) -> std::optional<ParsedBlock> {
            const std::string_view body = block.substr(opener.size());
            const size_t newline = body.find('\n');
            const std::string name(body.substr(0, newline));
            const std::string_view rest = body.substr(newline + 1);
            if (name == "all") return ParsedBlock{{}, std::string(rest)};
            if (name == "python") {
              if (auto call = call_with_arguments(name, rest)) return one_call(std::move(call));
              const ordered_json arguments = {{"code", std::string(trim(rest))}};
              return ParsedBlock{{{"python", arguments.dump()}}, ""};
            }
            return one_call(call_with_arguments(name, rest));
          }};
}

// An opener followed by one JSON (or Python literal) value holding the calls.
Syntax opener_then_value(std::vector<Opener> openers, std::string_view name_key = "name",
                         std::initializer_list<std::string_view> argument_keys = {"arguments", "parameters"}) {
  std::string key(name_key);
  std::vector<std::string> keys(argument_keys.begin(), argument_keys.end());
  return {std::move(openers),
          [](std::string_view opener, std::string_view block, bool ended) { return value_from(block, opener.size(), ended); },
          [key, keys](std::string_view opener, std::string_view block, const nlohmann::json&) -> std::optional<ParsedBlock> {
            const auto value = parse_literal(trim(block.substr(opener.size())));
            if (!value) return std::nullopt;
            ParsedBlock parsed;
            const ordered_json list = value->is_array() ? *value : ordered_json::array({*value});
            if (list.empty()) return std::nullopt;
            for (const auto& item : list) {
              if (!item.is_object() || !item.contains(key) || !item[key].is_string()) return std::nullopt;
              const ordered_json* arguments = nullptr;
              for (const auto& k : keys)
                if (!arguments && item.contains(k)) arguments = &item[k];
              auto text = arguments_text(arguments);
              if (!text || item[key].get<std::string>().empty()) return std::nullopt;
              parsed.calls.push_back({item[key].get<std::string>(), std::move(*text)});
            }
            return parsed;
          }};
}

Syntax granite() { return opener_then_value({{"<|tool_call|>"}}); }

// functools[{...}, ...]; phi4_mini's published template renders the calls bare and comma-separated,
// with Python dicts for arguments ({"name": "f", "arguments": {'a': 1}},{...}), read as written.
Syntax functools(bool bare_list_at_start) {
  Syntax syntax = opener_then_value({{"functools"}});
  if (!bare_list_at_start) return syntax;
  syntax.openers.push_back({"{", true});
  auto value_end = syntax.block_end;
  syntax.block_end = [value_end](std::string_view opener, std::string_view block, bool ended) {
    return opener == "{" ? separated_values(block, 0, ',', ended) : value_end(opener, block, ended);
  };
  auto parse_value = syntax.parse;
  syntax.parse = [parse_value](std::string_view opener, std::string_view block, const nlohmann::json& tools) {
    if (opener != "{") return parse_value(opener, block, tools);
    const std::string as_list = "[" + std::string(block) + "]";
    return parse_value("", as_list, tools);
  };
  return syntax;
}

Syntax internlm2() {
  return {{{"<|action_start|>"}},
          [](std::string_view opener, std::string_view block, bool ended) { return until_closer(block, opener.size(), {"<|action_end|>"}, ended); },
          [](std::string_view opener, std::string_view block, const nlohmann::json&) -> std::optional<ParsedBlock> {
            std::string_view body = trim(inner(block, opener, {"<|action_end|>"}));
            if (body.substr(0, 10) != "<|plugin|>") return std::nullopt;
            return calls_from_value(parse_json(trim(body.substr(10))), "name", {"parameters", "arguments"});
          }};
}

// Action:\n```json\n[{"tool_name": ..., "parameters": {...}}]\n```   (or <|START_ACTION|>...<|END_ACTION|>).
Syntax command_r() {
  return {{{"Action:"}, {"<|START_ACTION|>"}},
          [](std::string_view opener, std::string_view block, bool ended) -> ValueScan {
            if (opener == "<|START_ACTION|>") return until_closer(block, opener.size(), {"<|END_ACTION|>"}, ended);
            size_t at = skip_space(block, opener.size());
            for (std::string_view fence : {std::string_view("```json"), std::string_view("```")}) {
              const ScanStatus s = expect(block, at, fence, ended);
              if (s == ScanStatus::incomplete) return INCOMPLETE;
              if (s == ScanStatus::complete) {
                at += fence.size();
                break;
              }
              if (fence == "```") return INVALID;
            }
            const ValueScan value = value_from(block, at, ended);
            if (value.status != ScanStatus::complete) return value;
            at = skip_space(block, value.length);
            const ScanStatus s = expect(block, at, "```", ended);
            if (s == ScanStatus::incomplete) return INCOMPLETE;
            return s == ScanStatus::complete ? complete(at + 3) : (ended ? complete(value.length) : INVALID);
          },
          [](std::string_view opener, std::string_view block, const nlohmann::json&) {
            std::string_view body = trim(inner(block, opener, {"<|END_ACTION|>", "```"}));
            if (body.substr(0, 7) == "```json") body.remove_prefix(7);
            else if (body.substr(0, 3) == "```") body.remove_prefix(3);
            return calls_from_value(parse_json(trim(body)), "tool_name", {"parameters", "arguments"});
          }};
}

// Every `begin`...`end` stretch of `text` (the last may be cut short by the end of the text).
std::vector<std::string_view> between_all(std::string_view text, std::string_view begin, std::string_view end) {
  std::vector<std::string_view> parts;
  for (size_t at = text.find(begin); at != std::string_view::npos; at = text.find(begin, at)) {
    at += begin.size();
    const size_t stop = std::min(text.find(end, at), text.size());
    parts.push_back(text.substr(at, stop - at));
    at = stop;
  }
  return parts;
}

constexpr std::string_view DS_CALLS_BEGIN = "<｜tool▁calls▁begin｜>", DS_CALLS_END = "<｜tool▁calls▁end｜>",
                           DS_CALL_BEGIN = "<｜tool▁call▁begin｜>", DS_CALL_END = "<｜tool▁call▁end｜>", DS_SEP = "<｜tool▁sep｜>";

// V3.1: name<｜tool▁sep｜>{...}; V3 and R1: function<｜tool▁sep｜>name\n```json\n{...}\n```.
Syntax deepseek_v3_1() {
  return {{{std::string(DS_CALLS_BEGIN)}},
          [](std::string_view opener, std::string_view block, bool ended) { return until_closer(block, opener.size(), {DS_CALLS_END}, ended); },
          [](std::string_view opener, std::string_view block, const nlohmann::json&) -> std::optional<ParsedBlock> {
            ParsedBlock parsed;
            for (std::string_view call : between_all(inner(block, opener, {DS_CALLS_END}), DS_CALL_BEGIN, DS_CALL_END)) {
              const size_t sep = call.find(DS_SEP);
              if (sep == std::string_view::npos) return std::nullopt;
              std::string name(trim(call.substr(0, sep)));
              std::string_view arguments = call.substr(sep + DS_SEP.size());
              if (const size_t fence = arguments.find("```json"); name == "function" && fence != std::string_view::npos) {
                name = std::string(trim(arguments.substr(0, fence)));
                arguments = arguments.substr(fence + 7);
                if (const size_t close = arguments.rfind("```"); close != std::string_view::npos) arguments = arguments.substr(0, close);
              }
              auto one = call_with_arguments(name, arguments);
              if (!one) return std::nullopt;
              parsed.calls.push_back(std::move(*one));
            }
            if (parsed.calls.empty()) return std::nullopt;
            return parsed;
          }};
}

// <|tool_call_begin|>functions.NAME:INDEX<|tool_call_argument_begin|>{...}<|tool_call_end|>
Syntax kimi_k2() {
  return {{{"<|tool_calls_section_begin|>"}},
          [](std::string_view opener, std::string_view block, bool ended) {
            return until_closer(block, opener.size(), {"<|tool_calls_section_end|>"}, ended);
          },
          [](std::string_view opener, std::string_view block, const nlohmann::json&) -> std::optional<ParsedBlock> {
            ParsedBlock parsed;
            for (std::string_view call : between_all(inner(block, opener, {"<|tool_calls_section_end|>"}), "<|tool_call_begin|>", "<|tool_call_end|>")) {
              constexpr std::string_view ARGS = "<|tool_call_argument_begin|>";
              const size_t sep = call.find(ARGS);
              if (sep == std::string_view::npos) return std::nullopt;
              std::string_view id = trim(call.substr(0, sep));
              if (id.substr(0, 10) == "functions.") id.remove_prefix(10);
              if (const size_t colon = id.rfind(':'); colon != std::string_view::npos) id = id.substr(0, colon);
              auto one = call_with_arguments(std::string(id), call.substr(sep + ARGS.size()));
              if (!one) return std::nullopt;
              parsed.calls.push_back(std::move(*one));
            }
            if (parsed.calls.empty()) return std::nullopt;
            return parsed;
          }};
}

// Harmony: messages "<|start|>assistant<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>json]<|message|>BODY<|end|>"
// (<|call|> after a call, <|return|> after the answer). A message to functions.NAME is a call; the
// final (and commentary) channel is content; analysis is reasoning, not content.
std::string_view header_word(std::string_view header, std::string_view key) {
  const size_t at = header.find(key);
  if (at == std::string_view::npos) return {};
  size_t end = at + key.size();
  while (end < header.size() && !is_space(header[end]) && header[end] != '<') ++end;
  return header.substr(at + key.size(), end - at - key.size());
}

Syntax gpt_oss() {
  return {{{"<|start|>"}, {"<|channel|>"}, {" to=", true}, {"to=", true}},
          [](std::string_view opener, std::string_view block, bool ended) {
            const size_t next_start = block.find("<|start|>", opener.size());
            const ValueScan closed = until_closer(block.substr(0, next_start), opener.size(), {"<|end|>", "<|call|>", "<|return|>"},
                                                  ended || next_start != std::string_view::npos);
            return closed;
          },
          [](std::string_view, std::string_view block, const nlohmann::json&) -> std::optional<ParsedBlock> {
            const size_t message = block.find("<|message|>");
            if (message == std::string_view::npos) return std::nullopt;
            const std::string_view header = block.substr(0, message);
            std::string_view body = block.substr(message + 11);
            for (std::string_view closer : {"<|end|>", "<|call|>", "<|return|>"})
              if (body.size() >= closer.size() && body.substr(body.size() - closer.size()) == closer) body.remove_suffix(closer.size());
            const std::string_view recipient = header_word(header, "to=");
            if (!recipient.empty()) {
              std::string_view name = recipient;
              if (name.substr(0, 10) == "functions.") name.remove_prefix(10);
              return one_call(call_with_arguments(std::string(name), body));
            }
            if (header_word(header, "<|channel|>") == "analysis") return ParsedBlock{};
            return ParsedBlock{{}, std::string(body)};
          }};
}

// <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>...</tool_call>
Syntax glm4_5() {
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

const Syntax& syntax_of(ToolCallFormat format) {
  static const std::map<ToolCallFormat, Syntax> SYNTAXES = {
      {ToolCallFormat::hermes, hermes()},
      {ToolCallFormat::llama3_json, llama3_json()},
      {ToolCallFormat::mistral, mistral()},
      {ToolCallFormat::pythonic, pythonic()},
      {ToolCallFormat::functionary_v3_1, functionary_v3_1()},
      {ToolCallFormat::functionary_v3_2, functionary_v3_2()},
      {ToolCallFormat::granite, granite()},
      {ToolCallFormat::phi4_mini, functools(true)},
      {ToolCallFormat::firefunction_v2, functools(false)},
      {ToolCallFormat::deepseek_v3_1, deepseek_v3_1()},
      {ToolCallFormat::qwen3_coder, xml_functions("<tool_call>", "</tool_call>", true)},
      {ToolCallFormat::command_r, command_r()},
      {ToolCallFormat::kimi_k2, kimi_k2()},
      {ToolCallFormat::internlm2, internlm2()},
      {ToolCallFormat::gpt_oss, gpt_oss()},
      {ToolCallFormat::glm4_5, glm4_5()},
      {ToolCallFormat::seed_oss, xml_functions("<seed:tool_call>", "</seed:tool_call>", false)},
  };
  return SYNTAXES.at(format);
}

}  // namespace tpcli::text::tool_syntax

// The formats that write calls as JSON after a marker: hermes, llama3_json, mistral, granite,
// phi4_mini / firefunction_v2 (functools), internlm2, command_r.
#include "text/tool_call_syntax.h"

namespace tpcli::text::tool_syntax {

using nlohmann::ordered_json;
using namespace tool_values;

namespace {

// "[" + text + "]" (written so to spare GCC 12 a false -Wrestrict alarm).
std::string bracketed(std::string_view text) {
  std::string list(1, '[');
  list.append(text);
  list.push_back(']');
  return list;
}

// After <|python_tag|>, Llama 3.1 writes JSON calls, a built-in tool's call (brave_search.call(query="x")),
// or code for its code interpreter (a call to "python", as llama.cpp reports it).
std::optional<ParsedBlock> llama_builtin_call(std::string_view body) {
  body = trim(body);
  for (std::string_view end : {"<|eom_id|>", "<|eot_id|>"})
    if (body.size() >= end.size() && body.substr(body.size() - end.size()) == end) body = trim(body.substr(0, body.size() - end.size()));
  if (auto calls = parse_python_calls(bracketed(body)); calls && calls->size() == 1 && calls->front().name.size() > 5 &&
                                                                     calls->front().name.substr(calls->front().name.size() - 5) == ".call") {
    auto& call = calls->front();
    return ParsedBlock{{{call.name.substr(0, call.name.size() - 5), *arguments_text(&call.arguments)}}, ""};
  }
  if (body.empty()) return std::nullopt;
  const ordered_json arguments = {{"code", std::string(body)}};
  return ParsedBlock{{{"python", *arguments_text(&arguments)}}, ""};
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

// [f(a=1), g()]: a '[' opens a call list only if a name and '(' follow.
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

}  // namespace

Syntax hermes_syntax() {
  return {{{"<tool_call>"}},
          [](std::string_view opener, std::string_view block, bool ended) { return until_closer(block, opener.size(), {"</tool_call>"}, ended); },
          [](std::string_view opener, std::string_view block, const nlohmann::json&) {
            return calls_from_value(parse_json(trim(inner(block, opener, {"</tool_call>"}))));
          }};
}

Syntax llama3_json_syntax() {
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

Syntax mistral_syntax() { return {{{"[TOOL_CALLS]"}}, mistral_end, mistral_parse}; }

Syntax granite_syntax() { return opener_then_value({{"<|tool_call|>"}}); }

// functools[{...}, ...]; phi4_mini's published template renders the calls bare and comma-separated,
// with Python dicts for arguments ({"name": "f", "arguments": {'a': 1}},{...}), read as written.
Syntax functools_syntax(bool bare_list_at_start) {
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
    const std::string as_list = bracketed(block);
    return parse_value("", as_list, tools);
  };
  return syntax;
}

Syntax internlm2_syntax() {
  return {{{"<|action_start|>"}},
          [](std::string_view opener, std::string_view block, bool ended) { return until_closer(block, opener.size(), {"<|action_end|>"}, ended); },
          [](std::string_view opener, std::string_view block, const nlohmann::json&) -> std::optional<ParsedBlock> {
            std::string_view body = trim(inner(block, opener, {"<|action_end|>"}));
            if (body.substr(0, 10) != "<|plugin|>") return std::nullopt;
            return calls_from_value(parse_json(trim(body.substr(10))), "name", {"parameters", "arguments"});
          }};
}

// Action:\n```json\n[{"tool_name": ..., "parameters": {...}}]\n```   (or <|START_ACTION|>...<|END_ACTION|>).
Syntax command_r_syntax() {
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

}  // namespace tpcli::text::tool_syntax

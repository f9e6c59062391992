// The pieces every format's Syntax is made of (tool_call_syntax.h).
#include "text/tool_call_syntax.h"

namespace tpcli::text::tool_syntax {

using nlohmann::ordered_json;
using namespace tool_values;

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

// ---- calls out of values ----

// {"name": ..., "<one of argument_keys>": {...}} as a call.
std::optional<ParsedCall> call_from_object(const ordered_json& object, std::string_view name_key,
                                           std::initializer_list<std::string_view> argument_keys) {
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
std::optional<ParsedBlock> calls_from_value(const std::optional<ordered_json>& value, std::string_view name_key,
                                            std::initializer_list<std::string_view> argument_keys) {
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
  if (!arguments || arguments->is_null()) return std::nullopt;  // "null" is no arguments object
  auto text = arguments_text(&*arguments);  // an object, or a string holding one
  if (!text) return std::nullopt;
  return ParsedCall{std::move(name), std::move(*text)};
}

std::optional<ParsedBlock> one_call(std::optional<ParsedCall> call) {
  if (!call) return std::nullopt;
  return ParsedBlock{{std::move(*call)}, ""};
}

}  // namespace tpcli::text::tool_syntax

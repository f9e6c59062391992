// The formats with their own call syntax: pythonic, functionary v3.1 / v3.2, DeepSeek V3.1, Kimi K2,
// gpt-oss (harmony).
#include "text/tool_call_syntax.h"

namespace tpcli::text::tool_syntax {

using nlohmann::ordered_json;
using namespace tool_values;

namespace {

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

// An opener followed by one JSON (or Python literal) value holding the calls.
constexpr std::string_view DS_CALLS_BEGIN = "<｜tool▁calls▁begin｜>", DS_CALLS_END = "<｜tool▁calls▁end｜>",
                           DS_CALL_BEGIN = "<｜tool▁call▁begin｜>", DS_CALL_END = "<｜tool▁call▁end｜>", DS_SEP = "<｜tool▁sep｜>";

// Harmony: messages "<|start|>assistant<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>json]<|message|>BODY<|end|>"
// (<|call|> after a call, <|return|> after the answer). A message to functions.NAME is a call; the
// final channel (and a commentary preamble) is content; analysis is reasoning, not content.
std::string_view header_word(std::string_view header, std::string_view key) {
  const size_t at = header.find(key);
  if (at == std::string_view::npos) return {};
  size_t end = at + key.size();
  while (end < header.size() && !is_space(header[end]) && header[end] != '<') ++end;
  return header.substr(at + key.size(), end - at - key.size());
}

constexpr std::string_view MESSAGE = "<|message|>";

bool is_message_end(std::string_view opener) { return opener == "<|end|>" || opener == "<|call|>" || opener == "<|return|>"; }

// A message for the user (final, or a commentary preamble): its header is a block of its own, and
// its text streams as content; the end marker after it is a block that yields nothing.
bool shows_user(std::string_view header) { return header_word(header, "to=").empty() && header_word(header, "<|channel|>") != "analysis"; }

}  // namespace

Syntax pythonic_syntax() {
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

Syntax functionary_v3_1_syntax() {
  return {{{"<function="}, {"<|python_tag|>"}},
          [](std::string_view opener, std::string_view block, bool ended) {
            if (opener == "<|python_tag|>") return ended ? complete(block.size()) : INCOMPLETE;  // code runs to the end
            return until_closer(block, opener.size(), {"</function>"}, ended);
          },
          [](std::string_view opener, std::string_view block, const nlohmann::json&) -> std::optional<ParsedBlock> {
            const std::string_view body = inner(block, opener, {"</function>"});
            if (opener == "<|python_tag|>") {
              const ordered_json arguments = {{"code", std::string(trim(body))}};
              return ParsedBlock{{{"python", *arguments_text(&arguments)}}, ""};
            }
            const size_t name_end = body.find('>');
            if (name_end == std::string_view::npos) return std::nullopt;
            return one_call(call_with_arguments(std::string(body.substr(0, name_end)), body.substr(name_end + 1)));
          }};
}

// >>>name\n{...}; the generation prompt ends with ">>>", so the reply's first block opens bare.
// ">>>all\n" opens text for the user: a block of its own, the text after it content.
Syntax functionary_v3_2_syntax() {
  return {{{"", true}, {">>>"}},
          [](std::string_view opener, std::string_view block, bool ended) {
            size_t at = opener.size();
            while (at < block.size() && is_name_char(block[at])) ++at;
            if (at >= block.size()) return ended ? INVALID : INCOMPLETE;
            if (block[at] != '\n' || at == opener.size()) return INVALID;
            const std::string_view name = block.substr(opener.size(), at - opener.size());
            if (name == "all") return complete(at + 1);  // the text after it is content, streamed as it comes
            if (name == "python") {
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
            if (name == "all") return ParsedBlock{};
            if (name == "python") {
              if (auto call = call_with_arguments(name, rest)) return one_call(std::move(call));
              const ordered_json arguments = {{"code", std::string(trim(rest))}};
              return ParsedBlock{{{"python", *arguments_text(&arguments)}}, ""};
            }
            return one_call(call_with_arguments(name, rest));
          }};
}

// V3.1: name<｜tool▁sep｜>{...}; V3 and R1: function<｜tool▁sep｜>name\n```json\n{...}\n```.
Syntax deepseek_v3_1_syntax() {
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
Syntax kimi_k2_syntax() {
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

Syntax gpt_oss_syntax() {
  return {{{"<|start|>"}, {"<|channel|>"}, {" to=", true}, {"to=", true}, {"<|end|>"}, {"<|call|>"}, {"<|return|>"}},
          [](std::string_view opener, std::string_view block, bool ended) -> ValueScan {
            if (is_message_end(opener)) return complete(opener.size());
            const size_t next_start = block.find("<|start|>", opener.size());
            const std::string_view message = block.substr(0, next_start);
            const ValueScan closed = until_closer(message, opener.size(), {"<|end|>", "<|call|>", "<|return|>"}, ended || next_start != std::string_view::npos);
            // The header runs to <|message|>, which must come before the message's end.
            const size_t body = message.substr(0, closed.status == ScanStatus::complete ? closed.length : message.size()).find(MESSAGE);
            if (body != std::string_view::npos && shows_user(message.substr(0, body))) return complete(body + MESSAGE.size());
            return closed;
          },
          [](std::string_view opener, std::string_view block, const nlohmann::json&) -> std::optional<ParsedBlock> {
            if (is_message_end(opener)) return ParsedBlock{};
            const size_t body_at = block.find(MESSAGE);
            if (body_at == std::string_view::npos) return std::nullopt;
            const std::string_view header = block.substr(0, body_at);
            if (shows_user(header) || header_word(header, "to=").empty()) return ParsedBlock{};  // analysis: reasoning, not content
            std::string_view body = block.substr(body_at + MESSAGE.size());
            for (std::string_view closer : {"<|end|>", "<|call|>", "<|return|>"})
              if (body.size() >= closer.size() && body.substr(body.size() - closer.size()) == closer) body.remove_suffix(closer.size());
            std::string_view name = header_word(header, "to=");
            if (name.substr(0, 10) == "functions.") name.remove_prefix(10);
            return one_call(call_with_arguments(std::string(name), body));
          }};
}

}  // namespace tpcli::text::tool_syntax

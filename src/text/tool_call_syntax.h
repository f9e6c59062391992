// tpcli::text — how each tool-call format sits in generated text, as the stream (tool_calls.cpp)
// reads it: blocks opened by a marker, which end where the format says, and hold calls.
//
// A block starts at one of the format's openers and includes it; block_end says, from the text seen
// so far, how long the block is (complete), that more text is needed (incomplete), or that this
// opener does not start a call after all (invalid: the opener is content). parse turns a complete
// block into calls, and content where a block holds some (harmony's final channel); nullopt: the
// block is malformed and stays content as written.
#pragma once

#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/tool_call_values.h"
#include "text/tool_calls.h"

namespace tpcli::text::tool_syntax {

using tool_values::ScanStatus;
using tool_values::ValueScan;

struct Opener {
  std::string text;
  bool at_start_only = false;  // only where nothing but whitespace precedes it in the reply
};

struct ParsedCall {
  std::string name;
  std::string arguments;  // compact JSON object text
};

struct ParsedBlock {
  std::vector<ParsedCall> calls;
  std::string content;
};

struct Syntax {
  std::vector<Opener> openers;
  // `block`: the text from the opener on (opener included), as far as it has arrived.
  std::function<ValueScan(std::string_view opener, std::string_view block, bool text_ended)> block_end;
  std::function<std::optional<ParsedBlock>(std::string_view opener, std::string_view block, const nlohmann::json& tools)> parse;
};

const Syntax& syntax_of(ToolCallFormat format);

// ---- the formats, by family ----

// tool_call_formats_json.cpp: JSON after a marker.
Syntax hermes_syntax();
Syntax llama3_json_syntax();
Syntax mistral_syntax();
Syntax granite_syntax();
Syntax functools_syntax(bool bare_list_at_start);  // phi4_mini (true), firefunction_v2
Syntax internlm2_syntax();
Syntax command_r_syntax();
// tool_call_formats_special.cpp: a syntax of their own.
Syntax pythonic_syntax();
Syntax functionary_v3_1_syntax();
Syntax functionary_v3_2_syntax();
Syntax deepseek_v3_1_syntax();
Syntax kimi_k2_syntax();
Syntax gpt_oss_syntax();
// tool_call_formats_xml.cpp: arguments as text between tags.
Syntax qwen3_coder_syntax();
Syntax seed_oss_syntax();
Syntax glm4_5_syntax();

// ---- pieces the formats share (tool_call_blocks.cpp) ----

inline constexpr ValueScan INCOMPLETE{ScanStatus::incomplete};
inline constexpr ValueScan INVALID{ScanStatus::invalid};
ValueScan complete(size_t length);

// Does `text` at `at` start with `literal`? A text that ends inside it may still: incomplete.
ScanStatus expect(std::string_view text, size_t at, std::string_view literal, bool text_ended);
// The block ends after the first of `closers` found from `from`; a call the text ends inside
// (generation stopped at its end-of-turn token before the closer) runs to the end.
ValueScan until_closer(std::string_view block, size_t from, std::initializer_list<std::string_view> closers, bool text_ended);
// The text between the opener and a closer that ends the block (or the end).
std::string_view inner(std::string_view block, std::string_view opener, std::initializer_list<std::string_view> closers);
// One JSON value after whitespace from `at`: the end of the value.
ValueScan value_from(std::string_view block, size_t at, bool text_ended);
// Values separated by `separator` (';' for Llama's parallel calls), from `at`.
ValueScan separated_values(std::string_view block, size_t at, char separator, bool text_ended);
// `text` split at top-level `separator`s into the values scan_value finds; nullopt if one is not a value.
std::optional<std::vector<std::string_view>> split_values(std::string_view text, char separator);
// Every `begin`...`end` stretch of `text` (the last may be cut short by the end of the text).
std::vector<std::string_view> between_all(std::string_view text, std::string_view begin, std::string_view end);
bool is_name_char(char c);

// {"name": ..., "<one of argument_keys>": {...}} as a call.
std::optional<ParsedCall> call_from_object(const nlohmann::ordered_json& object, std::string_view name_key = "name",
                                           std::initializer_list<std::string_view> argument_keys = {"arguments", "parameters"});
// A list of call objects, or one object, as calls; nullopt if any is not a call.
std::optional<ParsedBlock> calls_from_value(const std::optional<nlohmann::ordered_json>& value, std::string_view name_key = "name",
                                            std::initializer_list<std::string_view> argument_keys = {"arguments", "parameters"});
// A call from its name and its arguments' text (JSON or a Python literal; an object).
std::optional<ParsedCall> call_with_arguments(std::string name, std::string_view arguments_json);
std::optional<ParsedBlock> one_call(std::optional<ParsedCall> call);

}  // namespace tpcli::text::tool_syntax

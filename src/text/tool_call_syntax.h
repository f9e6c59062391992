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

}  // namespace tpcli::text::tool_syntax

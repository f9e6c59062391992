// tpcli::text — a model's chat template: its Jinja source (tokenizer_config.json's `chat_template`,
// a bundled one by name, or a .jinja file) compiled once and rendered as transformers'
// apply_chat_template renders it (text/jinja_template.h), with the variables it passes: the
// messages, `tools` and `documents` (none when absent), `add_generation_prompt`, the tokenizer's
// special tokens that have a value, and extra keyword arguments (`enable_thinking`, ...).
//
// The tokens that end an assistant's turn are read off the source: the end-of-turn markers it
// writes (END_OF_TURN_MARKERS), and the tokenizer's EOS.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/jinja_template.h"
#include "text/reasoning.h"
#include "text/tool_calls.h"

namespace tpcli::text {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool"
  std::string content;
};

struct ChatTemplate {
  std::string name;                            // a bundled name, a file's path, or where the source came from
  std::shared_ptr<const JinjaTemplate> jinja;  // compiled once, shared by copies
  std::vector<std::string> end_markers;        // the end-of-turn markers the source writes
  std::optional<ToolCallFormat> tool_format;   // how the source writes an assistant's tool calls (none: it writes none)
  std::optional<ReasoningMarkers> reasoning;   // the reasoning markers the source mentions (none: the model writes no reasoning)
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // more keyword arguments for every render
};

// Compiles `source`; std::runtime_error "NAME: template line N: ..." when it does not parse.
ChatTemplate chat_template_from_source(std::string_view source, std::string name);
// A bundled template by name, else a .jinja file at that path; std::invalid_argument naming the
// bundled names when it is neither.
ChatTemplate chat_template_named(std::string_view name_or_path);
std::string chat_template_names();  // the bundled names, for messages

struct ChatTokens {
  std::string bos, eos;  // the tokenizer's bos_token / eos_token text ("" = the tokenizer has none)
};

// The prompt for `messages` (each an object with at least "role"; content, tool_calls, ... as the
// template reads them), with the assistant's opening when `add_generation_prompt`; `tools` is an
// OpenAI tool list or null. Throws std::invalid_argument with the template's message where it
// raises (roles that do not alternate, ...) or fails.
std::string render_chat_json(const ChatTemplate& chat_template, const nlohmann::ordered_json& messages,
                             const nlohmann::ordered_json& tools, const ChatTokens& tokens, bool add_generation_prompt);
std::string render_chat(const ChatTemplate& chat_template, std::span<const ChatMessage> messages,
                        const ChatTokens& tokens, bool add_generation_prompt);

// The tokens that end an assistant turn: the template's end markers, then EOS.
std::vector<std::string> end_of_turn_tokens(const ChatTemplate& chat_template, const ChatTokens& tokens);

}  // namespace tpcli::text

// tpcli::cli — opening a tokenizer and its chat template from flags, shared by `tpcli tokenizer`
// and `tpcli chat`. A tokenizer path may be a GGUF file (its own tokenizer, formats/gguf_vocabulary.h). Bad paths, files and template names become UsageError (one line, exit 2).
#pragma once

#include <CLI/CLI.hpp>
#include <array>
#include <optional>
#include <string>
#include <vector>

#include "formats/open_model.h"
#include "text/chat_template.h"
#include "text/load_tokenizer.h"

namespace tpcli::cli {

text::LoadedTokenizer open_tokenizer(const std::string& path, std::optional<int> vocab_size = std::nullopt);
// The tokenizer at `path` for a model of `vocab_size` tokens: a llama2.c tokenizer.bin read at that
// size, a tokenizer.json (or a folder holding one) at its own, which must not exceed the model's.
text::LoadedTokenizer open_model_tokenizer(const std::string& path, int vocab_size);
// Whether `path` names a llama2.c tokenizer.bin (not a tokenizer.json, a folder nor a GGUF file).
bool is_llama2c_tokenizer(const std::string& path);
// The tokenizer a model runs with: `flag` (-z/--tokenizer) when given, else the model's own (a
// Hugging Face directory's, a GGUF file's, the one a checkpoint records); nullopt when it has none.
// UsageError for a GGUF file that carries no tokenizer.
std::optional<std::string> model_tokenizer_path(const std::string& flag, const formats::OpenedModel& opened);

// --template NAME|FILE, --chat-template-kwargs JSON and --tool-parser NAME, as every command that
// renders chats takes them.
struct ChatTemplateFlags {
  std::string name;         // a bundled template or a .jinja file ("" = tokenizer_config.json's)
  std::string kwargs;       // a JSON object of extra keyword arguments ("" = none)
  std::string tool_parser;  // the tool-call format ("" = the one the template writes)
  std::string reasoning_parser;  // the reasoning markers ("" = the ones the template mentions, "none" = no reasoning)
};
// Returns the first two options (a command may make them need another).
std::array<CLI::Option*, 2> add_chat_template_flags(CLI::App& sub, ChatTemplateFlags& flags);
// --reasoning-parser NAME|none, for the commands that split reasoning off answers (serve).
void add_reasoning_parser_flag(CLI::App& sub, ChatTemplateFlags& flags);

struct ChatFormatting {
  text::ChatTemplate chat_template;
  text::ChatTokens tokens;  // bos/eos text the template writes
};
// The template `flags` name (else tokenizer_config.json's chat_template) with their keyword arguments.
ChatFormatting chat_formatting(const text::LoadedTokenizer& loaded, const ChatTemplateFlags& flags);

// A JSON list of {"role": ..., "content": ...}; `origin` names the input in errors.
std::vector<text::ChatMessage> parse_messages(const std::string& json_text, const std::string& origin);

std::string read_all(std::FILE* in);

}  // namespace tpcli::cli

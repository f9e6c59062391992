// tpcli::cli — opening a tokenizer and its chat template from flags, shared by `tpcli tokenizer`
// and `tpcli chat`. Bad paths, files and template names become UsageError (one line, exit 2).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "text/chat_template.h"
#include "text/load_tokenizer.h"

namespace tpcli::cli {

text::LoadedTokenizer open_tokenizer(const std::string& path, std::optional<int> vocab_size = std::nullopt);
// The tokenizer at `path` for a model of `vocab_size` tokens: a llama2.c tokenizer.bin read at that
// size, a tokenizer.json (or a folder holding one) at its own, which must not exceed the model's.
text::LoadedTokenizer open_model_tokenizer(const std::string& path, int vocab_size);
// Whether `path` names a llama2.c tokenizer.bin (not a tokenizer.json nor a folder).
bool is_llama2c_tokenizer(const std::string& path);

struct ChatFormatting {
  text::ChatTemplate chat_template;
  text::ChatTokens tokens;  // bos/eos text the template writes
};
// `template_name` ("" = recognise tokenizer_config.json's chat_template) picks the format.
ChatFormatting chat_formatting(const text::LoadedTokenizer& loaded, const std::string& template_name);

// A JSON list of {"role": ..., "content": ...}; `origin` names the input in errors.
std::vector<text::ChatMessage> parse_messages(const std::string& json_text, const std::string& origin);

std::string read_all(std::FILE* in);

}  // namespace tpcli::cli

// tpcli::cli — opening a tokenizer and its chat template from flags, shared by `tpcli tokenizer`
// and `tpcli chat`. Bad paths, files and template names become UsageError (one line, exit 2).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "model/chat_template.h"
#include "model/load_tokenizer.h"

namespace tpcli::cli {

model::LoadedTokenizer open_tokenizer(const std::string& path, std::optional<int> vocab_size = std::nullopt);
// The tokenizer at `path` for a model of `vocab_size` tokens: a llama2.c tokenizer.bin read at that
// size, a tokenizer.json (or a folder holding one) at its own, which must not exceed the model's.
model::LoadedTokenizer open_model_tokenizer(const std::string& path, int vocab_size);
// Whether `path` names a llama2.c tokenizer.bin (not a tokenizer.json nor a folder).
bool is_llama2c_tokenizer(const std::string& path);

struct ChatFormatting {
  model::ChatTemplate chat_template;
  model::ChatTokens tokens;  // bos/eos text the template writes
};
// `template_name` ("" = recognise tokenizer_config.json's chat_template) picks the format.
ChatFormatting chat_formatting(const model::LoadedTokenizer& loaded, const std::string& template_name);

// A JSON list of {"role": ..., "content": ...}; `origin` names the input in errors.
std::vector<model::ChatMessage> parse_messages(const std::string& json_text, const std::string& origin);

std::string read_all(std::FILE* in);

}  // namespace tpcli::cli

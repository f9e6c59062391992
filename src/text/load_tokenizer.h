// tpcli::text — opens whichever tokenizer a path names: a Hugging Face tokenizer.json (with the
// tokenizer_config.json beside it, when there is one), a model directory holding those, or a
// llama2.c tokenizer.bin.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "text/tokenizer_interface.h"

namespace tpcli::text {

struct LoadedTokenizer {
  std::unique_ptr<TokenizerInterface> tokenizer;
  std::optional<std::string> chat_template;  // tokenizer_config.json's Jinja source, when present
  std::string path;                          // the file opened, for messages
};

// `vocab_size`: a llama2.c file must hold exactly that many tokens (nullopt: all it holds).
// Throws std::runtime_error naming the path: missing, a directory without tokenizer.json, or a file
// the chosen reader rejects.
LoadedTokenizer load_tokenizer(const std::string& path, std::optional<int> vocab_size = std::nullopt);

}  // namespace tpcli::text

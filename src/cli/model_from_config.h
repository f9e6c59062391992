// tpcli::cli — a [model] section (or models/*.toml file) as a validated model::LlamaConfig.
#pragma once

#include <optional>

#include "config/run_config.h"
#include "model/llama_config.h"

namespace tpcli::cli {

// Fills a LlamaConfig from the section: n_kv_heads defaults to n_heads, vocab_size to
// `tokenizer_vocab` (the corpus tokenizer's size) when the file leaves it out; every other dim is
// required. Then LlamaConfig::validate(). Errors are config::ConfigError naming the file and, where
// the field is known, its line: "models/tiny.toml:4:11: n_heads = 3 does not divide dim = 64".
model::LlamaConfig model_from_config(const config::ModelSection& section,
                                     std::optional<int> tokenizer_vocab = std::nullopt);

}  // namespace tpcli::cli

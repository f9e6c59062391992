// tpcli::config — a [model] section (or models/*.toml file) as a validated model::LlamaConfig.
#pragma once

#include <optional>

#include "config/run_config.h"
#include "model/llama_config.h"

namespace tpcli::config {

// Fills a LlamaConfig from the section: n_kv_heads defaults to n_heads, vocab_size to
// `tokenizer_vocab` (the corpus tokenizer's size) when the file leaves it out; every other dim is
// required. Then LlamaConfig::validate(). Errors are ConfigError naming the file and, where
// the field is known, its line: "models/tiny.toml:4:11: n_heads = 3 does not divide dim = 64".
model::LlamaConfig model_from_config(const ModelSection& section,
                                     std::optional<int> tokenizer_vocab = std::nullopt);

// Checks that `model` can be split over the run's tensor axis (model::check_tensor_devices: at most
// one device per query head, ...). Errors point at the tensor axis's size in the file or flag:
// "configs/x.toml:2:25: mesh.axes.model = 12: cannot split 8 heads over 12 devices ...".
void check_model_fits_mesh(const RunConfig& config, const model::LlamaConfig& model);

}  // namespace tpcli::config

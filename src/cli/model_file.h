// tpcli::cli — opening a model checkpoint of either format (llama2.c .bin or tpcli .safetensors)
// for infer and bench, with input errors as UsageError.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "model/weights.h"

namespace tpcli::cli {

struct OpenedModel {
  std::unique_ptr<model::WeightSource> weights;
  // The tokenizer recorded in a safetensors checkpoint's "tokenizer" metadata, resolved against
  // the checkpoint's folder (nullopt for llama2.c files, which record none).
  std::optional<std::string> tokenizer;
  std::map<std::string, std::string> metadata;  // a safetensors checkpoint's; empty for llama2.c
};

// ".safetensors" files (or files whose 9th byte starts a JSON header) as safetensors, anything else
// as llama2.c. Throws UsageError with the loader's one-line message.
OpenedModel open_model(const std::string& path);

}  // namespace tpcli::cli

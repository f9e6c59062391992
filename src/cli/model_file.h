// tpcli::cli — opening a model checkpoint of either format (llama2.c .bin or tpcli .safetensors)
// for infer and bench, with input errors as UsageError.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "dist/mesh.h"
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
// The same, for a run on `mesh`: also a UsageError when the model cannot be split over its tensor
// axis "model" (model::check_tensor_devices).
OpenedModel open_model(const std::string& path, const dist::Mesh& mesh);

}  // namespace tpcli::cli

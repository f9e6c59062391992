// tpcli::train — checkpoints from and into a device's shards: gathering every parameter and
// AdamW moment into full tensors for saving, and slicing a checkpoint's moments for resuming
// (train/checkpoint.h describes the file). The moments go through the same model code as the
// weights, so the sharding arithmetic stays in one place (model/llama_core.cpp), and through
// DataParallelOptimizer::moments(), so a checkpoint is the same whatever the mesh and whether the
// optimizer state is sharded.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/trainable_llama.h"
#include "model/weights.h"
#include "tensor/tensor.h"

namespace tpcli::model {
class TrainableLlama;
}
namespace tpcli::formats {
class SafetensorsFile;
}
namespace tpcli::dist {
class Group;
}

namespace tpcli::train {

struct TrainOptions;
class DataParallelOptimizer;

// Collective over the tensor group: full tensors of per-parameter local `shards` (one per
// llama.parameters() entry, in their local shapes), by parameter name.
model::TensorWeights gather_as_weights(model::TrainableLlama& llama, std::vector<tensor::Tensor>& shards);

struct SaveInfo {
  std::string path;
  int64_t step = 0;
  const TrainOptions* options = nullptr;
};

// Collective over the tensor group (gathers) and, sharded, the data axis; every device calls it,
// world rank 0 (writer) writes. Refuses (throws naming the tensor) to write non-finite values.
void save_checkpoint(model::TrainableLlama& llama, DataParallelOptimizer& optimizer, const SaveInfo& info, bool writer);

// A LoRA run saves latest.safetensors, then adapter/ beside it (PEFT's folder of the same adapters):
// a kill between the two leaves adapter/ one save behind. --resume rewrites adapter/ from the
// checkpoint it resumes (this function; device 0 only), so the two agree again before any step.
void rewrite_peft_adapter(const formats::SafetensorsFile& checkpoint, const TrainOptions& o);

// The moments stored in a checkpoint under `prefix`, sliced into this device's local shapes (one
// per llama.parameters() entry): a model built from them holds exactly the local slices.
std::vector<tensor::Tensor> load_moments(const formats::SafetensorsFile& file, const model::LlamaConfig& config,
                                         dist::Group& tensor_group, dist::Group& expert_group, const char* prefix);

// "train.step" of a checkpoint: a step count in [0, 2^40], else a one-line error naming it.
int64_t resume_step(const formats::SafetensorsFile& file);
// A LoRA run's checkpoint: "format" in its metadata; the base's config under "base." keys.
inline constexpr const char* LORA_FORMAT = "tpcli-lora";
// The model a checkpoint holds must be the one the config describes, or its tensors cannot be sliced;
// `lora`: the run trains these adapters, so the checkpoint must hold them (rank, alpha, blocks,
// targets), on that base.
void require_same_model(const formats::SafetensorsFile& file, const model::LlamaConfig& wanted,
                        const std::optional<model::LoraOptions>& lora = std::nullopt);

}  // namespace tpcli::train

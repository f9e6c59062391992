#include "train/checkpoint_io.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <stdexcept>

#include "files/atomic_file.h"
#include "formats/peft_adapter.h"
#include "formats/safetensors.h"
#include "model/lora_adapter.h"
#include "model/trainable_llama.h"
#include "train/checkpoint.h"
#include "train/data_parallel_optimizer.h"
#include "train/loop.h"

namespace tpcli::train {

namespace fs = std::filesystem;


// Every parameter's full tensor, for the moments: the moment buffers take the place of the values
// while the model gathers its "weights" (collective over the tensor group), so the sharding
// arithmetic stays in one place (the model).
model::TensorWeights gather_as_weights(model::TrainableLlama& llama, std::vector<tensor::Tensor>& shards) {
  auto params = llama.parameters();
  for (size_t i = 0; i < params.size(); ++i) std::swap(*params[i].value, shards[i]);
  model::TensorWeights full = [&] {
    try {
      return llama.gather_weights();
    } catch (...) {
      for (size_t i = 0; i < params.size(); ++i) std::swap(*params[i].value, shards[i]);
      throw;
    }
  }();
  for (size_t i = 0; i < params.size(); ++i) std::swap(*params[i].value, shards[i]);
  return full;
}

model::TensorWeights gather_gradients(model::TrainableLlama& llama) {
  std::vector<tensor::Tensor> grads;
  for (auto& p : llama.parameters()) grads.push_back(*p.grad);
  return gather_as_weights(llama, grads);
}

static void require_finite(std::span<const float> values, const std::string& path, int64_t step,
                           const std::string& name) {
  for (float x : values)
    if (!std::isfinite(x))
      throw std::runtime_error(path + ": not written at step " + std::to_string(step) + ": tensor " + name +
                               " holds non-finite values (the previous checkpoint is kept)");
}

// "wq,wk,...": the adapted linears, as a checkpoint's metadata records them.
static std::string lora_targets_text(const model::LoraOptions& lora) {
  std::string text;
  for (const std::string& t : lora.targets) text += (text.empty() ? "" : ",") + t;
  return text;
}

// A LoRA checkpoint's adapters as Hugging Face PEFT's folder, "adapter/" beside the checkpoint
// (what --adapter, export --fuse and peft.PeftModel read), replaced whole (files/atomic_file.h).
// The temporaries of a save killed before (adapter.tmp-XXXXXX, as big as the adapter) go first.
static void write_peft_beside(const std::string& checkpoint, const model::WeightSource& adapters, const TrainOptions& o) {
  model::LoraAdapterSet set;
  set.rank = o.lora->rank;
  set.alpha = o.lora->alpha;
  set.dropout = o.lora->dropout;
  set.base_model = o.base_name;
  for (const std::string& m : o.lora->targets) set.targets.push_back(*model::lora_hf_module_of(m));
  for (const auto& spec : model::lora_parameters(o.model, *o.lora))
    set.tensors.emplace(spec.name, tensor::Tensor(spec.shape, adapters.get(spec.name)));
  const fs::path dir = fs::path(checkpoint).parent_path() / "adapter";
  files::remove_stale_folder_temporaries(dir.string());
  files::replace_directory_atomically(dir.string(), [&](const std::string& tmp) { formats::save_peft_adapter(tmp, set, o.model); });
}

// Collective over the tensor group (gathers); every device calls it, world rank 0 writes.
void save_checkpoint(model::TrainableLlama& llama, DataParallelOptimizer& optimizer, const SaveInfo& info, bool writer) {
  model::TensorWeights weights = llama.gather_weights();
  std::vector<tensor::Tensor> exp_avg = optimizer.moments(0), exp_avg_sq = optimizer.moments(1);
  model::TensorWeights m = gather_as_weights(llama, exp_avg);
  model::TensorWeights v = gather_as_weights(llama, exp_avg_sq);
  if (!writer) return;
  const TrainOptions& o = *info.options;
  std::vector<model::ParamSpec> specs;  // the model's, or with LoRA the adapters'
  for (const auto& p : llama.parameters()) specs.push_back(*p.spec);
  // Never replace a good checkpoint with a bad one (the step's guard should have stopped first).
  for (const auto& spec : specs)
    for (const auto* source : {&weights, &m, &v})
      require_finite(source->get(spec.name), info.path, info.step,
                     source == &weights ? spec.name : (source == &m ? EXP_AVG_PREFIX : EXP_AVG_SQ_PREFIX) + spec.name);
  std::vector<formats::TensorView> tensors;
  std::vector<std::string> names;  // keeps the moment names alive
  names.reserve(specs.size() * 2);
  for (const auto& spec : specs) tensors.push_back({spec.name, spec.shape, weights.get(spec.name)});
  for (const auto& spec : specs) {
    names.push_back(EXP_AVG_PREFIX + spec.name);
    tensors.push_back({names.back(), spec.shape, m.get(spec.name)});
    names.push_back(EXP_AVG_SQ_PREFIX + spec.name);
    tensors.push_back({names.back(), spec.shape, v.get(spec.name)});
  }
  Metadata meta;
  meta["format"] = o.lora ? LORA_FORMAT : "tpcli";
  // A LoRA checkpoint names its base under "base.": it is not a model that loads on its own.
  Metadata config;
  formats::config_to_metadata(o.model, config);
  for (auto& [key, value] : config) meta[(o.lora ? "base." : "") + key] = value;
  tokenizer_to_metadata(*o.tokenizer, meta);
  meta["train.step"] = std::to_string(info.step);
  meta["train.seed"] = std::to_string(o.seed);
  meta["train.mesh"] = o.mesh.to_string();
  if (!o.metadata_note.empty()) meta["train.config"] = o.metadata_note;
  if (o.lora) {
    meta["lora.rank"] = std::to_string(o.lora->rank);
    meta["lora.alpha"] = std::to_string(o.lora->alpha);
    meta["lora.last_layers"] = std::to_string(o.lora->last_layers);
    meta["lora.targets"] = lora_targets_text(*o.lora);
  }
  formats::write_safetensors(info.path, tensors, meta);
  if (o.lora) write_peft_beside(info.path, weights, o);
}

void rewrite_peft_adapter(const formats::SafetensorsFile& checkpoint, const TrainOptions& o) {
  write_peft_beside(checkpoint.path(), checkpoint, o);
}

// The moments stored in a checkpoint, sliced into this device's shards: a model built from them
// (same config, same tensor group) holds exactly the local slices.
std::vector<tensor::Tensor> load_moments(const formats::SafetensorsFile& file, const model::LlamaConfig& config,
                                         dist::Group& tensor_group, dist::Group& expert_group, const char* prefix) {
  model::TensorWeights source(config);
  for (const auto& spec : model::llama_parameters(config)) {
    const std::string name = prefix + spec.name;
    if (!file.has(name)) throw std::runtime_error(file.path() + ": no optimizer state '" + name + "' to resume from");
    auto data = file.tensor(name).data;
    source.set(spec.name, tensor::Tensor(spec.shape, std::vector<float>(data.begin(), data.end())));
  }
  model::TrainableLlama shards(source, tensor_group, expert_group);
  std::vector<tensor::Tensor> out;
  // Copies: a value may be a view of its layer's storage (wq|wk|wv, w1|w3: nn/linear.h), which
  // `shards` takes with it.
  for (auto& p : shards.parameters()) out.emplace_back(*p.value);
  return out;
}

// "train.step" of a checkpoint: a step count in [0, MAX_STEPS], else a one-line error naming it.
int64_t resume_step(const formats::SafetensorsFile& file) {
  constexpr int64_t MAX_STEPS = int64_t{1} << 40;
  auto it = file.metadata().find("train.step");
  if (it == file.metadata().end()) throw std::runtime_error(file.path() + ": no train.step in the metadata");
  const std::string& text = it->second;
  int64_t step = -1;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), step);
  if (ec != std::errc() || end != text.data() + text.size() || step < 0 || step > MAX_STEPS)
    throw std::runtime_error(file.path() + ": metadata train.step = '" + text + "' is not a step count (an integer in [0, " +
                             std::to_string(MAX_STEPS) + "])");
  return step;
}

// The model a checkpoint holds must be the one the config describes, or its tensors cannot be sliced.
// A LoRA checkpoint's adapters must be the ones the config asks for (rank, alpha, blocks, targets):
// else they cannot be sliced, or some would be silently dropped.
static void require_same_adapters(const formats::SafetensorsFile& file, const model::LoraOptions& lora) {
  const std::pair<const char*, std::string> keys[] = {{"lora.rank", std::to_string(lora.rank)},
                                                      {"lora.alpha", std::to_string(lora.alpha)},
                                                      {"lora.last_layers", std::to_string(lora.last_layers)},
                                                      {"lora.targets", lora_targets_text(lora)}};
  for (const auto& [key, value] : keys) {
    const auto it = file.metadata().find(key);
    const std::string held = it == file.metadata().end() ? "(unset)" : it->second;
    if (held != value)
      throw std::runtime_error(file.path() + ": --resume: the checkpoint's adapters have " + key + " = " + held +
                               " but [train.lora] asks for " + value +
                               " (resume with the same [train.lora], or train into a new train.out_dir)");
  }
}

void require_same_model(const formats::SafetensorsFile& file, const model::LlamaConfig& wanted,
                        const std::optional<model::LoraOptions>& lora) {
  if (lora) require_same_adapters(file, *lora);
  const bool lora_run = lora.has_value();
  const auto format = file.metadata().find("format");
  const bool holds_lora = format != file.metadata().end() && format->second == LORA_FORMAT;
  if (holds_lora != lora_run)
    throw std::runtime_error(file.path() + ": --resume: the checkpoint holds " +
                             (holds_lora ? "LoRA adapters but the config has no [train.lora]"
                                         : "a whole model but the config trains LoRA adapters ([train.lora])") +
                             " (resume with the same settings, or train into a new train.out_dir)");
  formats::Metadata have, want;
  if (lora_run) {
    for (const auto& [key, value] : file.metadata())
      if (key.starts_with("base.")) have[key.substr(5)] = value;
  } else {
    formats::config_to_metadata(file.config(), have);
  }
  formats::config_to_metadata(wanted, want);
  for (const auto& [key, value] : want) {
    auto it = have.find(key);
    const std::string held = it == have.end() ? "(unset)" : it->second;
    if (held != value)
      throw std::runtime_error(file.path() + ": --resume: the checkpoint holds a model with " + key + " = " + held +
                               " but the config asks for " + value +
                               " (resume with the same [model] settings, or train into a new train.out_dir)");
  }
}

}  // namespace tpcli::train

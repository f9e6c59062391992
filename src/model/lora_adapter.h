// tpcli::model — LoRA adapters (issue 30): the in-memory set the trainer fills and the inference
// model applies unmerged, and the merge (`export --fuse`). PEFT's folder: formats/peft_adapter.h.
//
// Dimension legend: r rank, IN input features, OUT output features of the adapted matrix W [OUT, IN];
// C dim, Q q_dim, KV kv_dim, F hidden_dim.
//
// An adapted linear computes W x + scale * B (A x), scale = alpha / r (PEFT's default; no rsLoRA):
//   "layers.{l}.{m}.lora_a"  A [r, IN]     m: wq wk wv wo w1 w3 w2 (HF: q_proj k_proj v_proj o_proj
//   "layers.{l}.{m}.lora_b"  B [OUT, r]       gate_proj up_proj down_proj)
// full (unsharded) f32, rows and columns in tpcli's layout of W: B's rows of wq / wk are in
// llama2.c's interleaved RoPE order, as W's (formats/hf_names.h).
//
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "model/llama_config.h"
#include "model/weights.h"
#include "tensor/tensor.h"

namespace tpcli::model {

struct LoraAdapterSet {
  int rank = 8;
  double alpha = 16;                 // scale = alpha / rank
  double dropout = 0;                // recorded as lora_dropout (training only)
  std::vector<std::string> targets;  // HF module names: "q_proj", ..., "down_proj"
  std::string base_model;            // base_model_name_or_path
  // "layers.3.wq.lora_a" [r, IN], "layers.3.wq.lora_b" [OUT, r]: see the top of this file.
  std::map<std::string, tensor::Tensor> tensors;
  float scale() const { return static_cast<float>(alpha / rank); }
};

// "layers.{l}.{m}.lora_{a,b}" -> ({l, m}, 'a' | 'b') for a matrix LoRA adapts; nullopt otherwise.
struct LoraKey {
  BlockKey key;
  char side = 'a';
  int layer() const { return key.layer; }
  Matrix matrix() const { return key.matrix; }
};
std::optional<LoraKey> parse_lora_key(const std::string& name);
std::string lora_tensor_name(BlockKey key, char side);

// The tpcli matrices an adapter may target, in tpcli's order (wq wk wv wo w1 w3 w2), and the
// names between them: "q_proj" <-> "wq", ... nullopt for a name outside the seven.
const std::vector<std::string>& lora_matrices();
std::optional<std::string> lora_matrix_of(const std::string& hf_module);
std::optional<std::string> lora_hf_module_of(const std::string& matrix);

// Checks `set` against the model: rank >= 1, alpha finite, targets known and without repeats, every
// tensor named "layers.{l}.{m}.lora_{a,b}" with m a target and l < n_layers (a dense block for w1 w3
// w2), A [r, IN] and B [OUT, r] of that matrix's shape, finite; A and B in pairs. Throws
// std::invalid_argument "ORIGIN: ..." naming the tensor.
void validate_lora(const LoraAdapterSet& set, const LlamaConfig& config, const std::string& origin);

// W + scale * B @ A of matrix `name` ("layers.3.wq") [OUT, IN], in f32; `w` is W. The adapter must
// hold `name` (lora_adapts).
bool lora_adapts(const LoraAdapterSet& set, const std::string& name);

// The blocks holding any of `set`'s tensors, ascending.
std::vector<int> adapted_layers(const LoraAdapterSet& set);
std::vector<float> lora_merged(const LoraAdapterSet& set, const std::string& name, std::span<const float> w, int64_t OUT,
                               int64_t IN);

// A model with an adapter: the base's tensors unchanged (served by `base`), and adapter() for the
// inference model to apply unmerged (model/llama.h). `infer|chat|serve --adapter`.
class AdaptedWeights : public WeightSource {
 public:
  // Validates `set` against base's config (std::invalid_argument naming `origin`).
  AdaptedWeights(std::unique_ptr<WeightSource> base, LoraAdapterSet set, const std::string& origin);
  const LlamaConfig& config() const override { return base_->config(); }
  std::span<const float> get(const std::string& name) const override { return base_->get(name); }
  std::optional<StoredTensor> stored(const std::string& name) const override { return base_->stored(name); }
  std::optional<Quantization> quantization_of(const std::string& name) const override { return base_->quantization_of(name); }
  void release_conversions() const override { base_->release_conversions(); }
  void release_pages(const std::string& name) const override { base_->release_pages(name); }
  void release_all_pages() const override { base_->release_all_pages(); }
  const LoraAdapterSet* adapter() const override { return &set_; }

 private:
  std::unique_ptr<WeightSource> base_;
  LoraAdapterSet set_;
};

// The merged model (`export --fuse`): get() of an adapted matrix is lora_merged of the base's f32
// (a quantized base dequantized), made once and kept; everything else is the base's. stored() is
// nullopt for the adapted matrices and for any tensor of a quantized base, and the config has no
// quantization, so readers take get()'s f32.
class LoraMergedWeights : public WeightSource {
 public:
  // Validates `set` against base's config (std::invalid_argument naming `origin`).
  LoraMergedWeights(const WeightSource& base, const LoraAdapterSet& set, const std::string& origin);
  const LlamaConfig& config() const override { return config_; }
  std::span<const float> get(const std::string& name) const override;
  std::optional<StoredTensor> stored(const std::string& name) const override;
  void release_conversions() const override;
  void release_pages(const std::string& name) const override { base_.release_pages(name); }
  void release_all_pages() const override { base_.release_all_pages(); }

 private:
  const WeightSource& base_;
  const LoraAdapterSet& set_;
  LlamaConfig config_;
  mutable std::mutex merged_mutex_;
  mutable std::map<std::string, std::vector<float>> merged_;
};

}  // namespace tpcli::model

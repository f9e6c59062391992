// tpcli::formats — safetensors files (tpcli's own checkpoints, and Hugging Face's): read through
// mmap, write atomically. dtypes F32, F16, BF16 (floats) and U32, U8 (quantized words and scales).
//
// Layout: u64 little-endian N, then N bytes of JSON
//   {"__metadata__": {"key": "value", ...}, "NAME": {"dtype": "F32", "shape": [..],
//    "data_offsets": [begin, end]}, ...}
// (padded with spaces so the data starts 8-byte aligned), then the data; offsets are relative to
// the start of the data.
//
// Metadata keys used by tpcli (all values are strings):
//   "format"                      "tpcli"                 who wrote it
//   "model.dim", "model.hidden_dim", "model.n_layers", "model.n_heads", "model.n_kv_heads",
//   "model.vocab_size", "model.seq_len"                     integers (decimal)
//   "model.head_dim"              integer; absent when the head size is dim / n_heads
//   "model.shared_classifier"     "true" | "false"
//   "model.norm_eps", "model.rope_theta", "model.moe_aux_loss"   floats, "%.9g"
//   "model.n_experts", "model.top_k", "model.expert_hidden_dim"  integers
//   "model.capacity_factor"       float; absent when unset
//   "model.rope_scaling.factor", ".low_freq_factor", ".high_freq_factor"   floats, and
//   "model.rope_scaling.original_max_position"   integer: Llama 3's rope_scaling; absent when unset
//   "model.rope_freq_factors"     comma-separated floats [HS/2]: the same scaling as a GGUF stores it
//                                 (LlamaConfig::rope_freq_factors); absent when unset
//   "quant.bits", "quant.group_size", "quant.mode"   a quantized checkpoint (LlamaConfig::quantization):
//                                 a quantized parameter NAME [R, K] is stored as NAME (U32 [R, K*bits/32],
//                                 MLX packing), NAME.scales and NAME.biases (F32 [R, K/group_size]; for
//                                 mxfp8 only NAME.scales, U8 E8M0). ../shared/QUANT.md.
//   "tokenizer"                   path of the llama2.c tokenizer.bin the model was trained with,
//                                 absolute or relative to the checkpoint's folder (`tpcli infer`
//                                 uses it when -z is not given)
// Parameter tensors are named as in llama_parameters() ("tok_embeddings", "layers.0.wq", ...); other
// tensors (optimizer state, ...) may sit beside them under other names. Training state keys are the
// training code's business ("train.*" is suggested).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "formats/llama2c.h"  // MappedFile
#include "model/llama_config.h"
#include "model/weights.h"
#include "tensor/tensor.h"

namespace tpcli::formats {

using Metadata = std::map<std::string, std::string>;

// LlamaConfig <-> "model.*" metadata keys. from: throws std::runtime_error naming `origin` and the
// missing or malformed key; validates the config.
void config_to_metadata(const model::LlamaConfig& config, Metadata& metadata);
model::LlamaConfig config_from_metadata(const Metadata& metadata, const std::string& origin);

struct TensorView {
  std::string name;
  tensor::Shape shape;
  std::span<const float> data;  // numel(shape) floats, row-major
};

// Writes tensors + metadata (temp file + rename). Throws std::invalid_argument for a tensor whose
// data size does not match its shape or a duplicate name, std::runtime_error for I/O failures.
void write_safetensors(const std::string& path, const std::vector<TensorView>& tensors, const Metadata& metadata);
// The same for tensors of any dtype (16-bit exports): each data holds numel(shape) elements of its dtype.
struct NamedTensor {
  std::string name;
  model::StoredTensor tensor;
};
void write_stored_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors, const Metadata& metadata);
// Every parameter of `weights` plus its config in the metadata (merged over `metadata`); parameters
// stored other than f32 (WeightSource::stored()) are written as stored, quantized ones with their
// NAME.scales / NAME.biases.
void write_safetensors(const std::string& path, const model::WeightSource& weights, Metadata metadata = {});

// A safetensors file, mapped. Header errors are one line naming the file and what is wrong;
// tensors whose data_offsets overlap are refused, naming both.
class SafetensorsFile : public model::WeightSource {
 public:
  explicit SafetensorsFile(const std::string& path);

  const Metadata& metadata() const { return metadata_; }
  bool has(const std::string& name) const { return stored_.count(name) != 0; }
  // An F32 tensor; throws std::out_of_range naming it when absent, std::runtime_error when it is
  // stored in another dtype (get() converts, stored() gives it as it is).
  const TensorView& tensor(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted
  const std::string& path() const { return map_.path(); }

  // WeightSource: needs the "model.*" metadata keys. When "model.dim" is present, the constructor
  // reads the config and checks every parameter's presence and shape; config() throws
  // std::runtime_error when the file has no model config.
  bool has_model_config() const { return config_.has_value(); }
  const model::LlamaConfig& config() const override;
  // F32 tensors: a view into the map. F16/BF16 (and quantized parameters, dequantized): converted on the first call, kept for later calls
  // (thread-safe: the devices of a run share one file). Any tensor name, not only parameters.
  std::span<const float> get(const std::string& name) const override;
  // Every tensor as stored (a view into the map); nullopt when absent.
  std::optional<model::StoredTensor> stored(const std::string& name) const override;
  void release_conversions() const override;
  void release_pages(const std::string& name) const override;
  void release_all_pages() const override { map_.release_all_pages(); }

 private:
  void refuse_overlaps(const std::byte* data) const;
  void check_packed_parameter(const model::ParamSpec& p) const;
  MappedFile map_;
  Metadata metadata_;
  std::map<std::string, model::StoredTensor> stored_;  // every tensor
  std::map<std::string, TensorView> tensors_;   // the F32 ones
  std::optional<model::LlamaConfig> config_;
  mutable std::mutex converted_mutex_;
  mutable std::map<std::string, std::vector<float>> converted_;  // 16-bit tensors as f32, by name
};

}  // namespace tpcli::formats

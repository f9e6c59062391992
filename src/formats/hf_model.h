// tpcli::formats — Hugging Face model directories (the architectures of formats/hf_config.h): read in
// place (mmap, no conversion step) and written by `tpcli export --to hf`.
//
// A directory holds config.json (+ optional generation_config.json) and either model.safetensors
// or shards model-0000k-of-0000N.safetensors listed by model.safetensors.index.json. Which tensor
// holds which parameter: formats/hf_names.h.
// MLX-quantized models (config.json "quantization": {"group_size", "bits", "mode"}) store a
// quantized module P as P.weight (U32 words), P.scales, P.biases (../shared/QUANT.md section 5):
// they are stored("NAME"), stored("NAME.scales"), stored("NAME.biases") here.
//
// Dimension legend: C dim (hidden_size), F hidden_dim (intermediate_size), NH/NKV query/kv heads,
// HS head size, V vocab_size.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "formats/hf_config.h"
#include "formats/hf_names.h"
#include "formats/safetensors.h"
#include "model/llama_config.h"
#include "model/weights.h"

namespace tpcli::formats {

// A Hugging Face model directory as a WeightSource. Every tensor stays in its mmapped file:
// stored() gives F32/F16/BF16 (and quantized U32 words, scales, biases) as stored, a fused
// tensor's segment as a view of its rows, except q/k projections (rows reordered) and stacked
// experts, which are assembled once into a copy of the same dtype. get() gives f32: F32 tensors
// as views into the map (or into their assembled copy), others converted (dequantized) once per
// parameter on first use and kept, so the devices of a run share one conversion and each copies
// only its own rows. release_pages drops a tensor's file pages; copies live until release_conversions.
class HfModelDir : public model::WeightSource {
 public:
  // Opens the files and checks every parameter's presence, dtype and shape. Throws
  // std::runtime_error naming the file for a bad directory.
  explicit HfModelDir(const std::string& dir);
  ~HfModelDir() override;

  const model::LlamaConfig& config() const override { return hf_.llama; }
  const HfConfig& hf_config() const { return hf_; }
  const std::string& dir() const { return dir_; }
  std::span<const float> get(const std::string& name) const override;
  std::optional<model::StoredTensor> stored(const std::string& name) const override;
  std::optional<model::Quantization> quantization_of(const std::string& name) const override;
  void release_conversions() const override;
  void release_pages(const std::string& name) const override;
  void release_all_pages() const override;

 private:
  struct Part {
    const SafetensorsFile* file = nullptr;
    std::string hf_name;
  };
  struct Source {
    std::vector<Part> parts;  // one tensor, or the experts stacked
    HfTensorRef ref;
    std::string key;          // the conversion caches' (tied parameters share one)
    bool stacked = false;     // experts read from ref.stacked_module: one tensor [E, ...]
    bool view() const { return parts.size() == 1 && ref.rope_heads == 0; }  // stored() without a copy
  };
  void open_files();
  void map_parameters();
  // The source of `name` + `suffix` (".scales"...) from ref's tensors MODULE.KIND (or MODULE + suffix).
  const Source& add_source(const std::string& name, const HfTensorRef& ref, const std::string& suffix);
  void check_float_source(const model::ParamSpec& p, const Source& s) const;
  void check_quantized_source(const model::ParamSpec& p, const Source& s, const HfTensorRef& ref, const model::Quantization& q);
  const Source& source(const std::string& name) const;
  model::StoredTensor assembled(const Source& s) const;
  std::vector<float> dequantized(const std::string& name) const;

  std::string dir_;
  HfConfig hf_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> file_of_;  // Hugging Face tensor name -> its file
  std::map<std::string, Source> sources_;                  // tpcli name (and NAME.scales/.biases)
  // get() holds converted_mutex_ while it converts and may then take assembled_mutex_ (stored()).
  mutable std::mutex converted_mutex_, assembled_mutex_;
  mutable std::map<std::string, std::vector<float>> converted_;      // get() results, by source key
  mutable std::map<std::string, std::vector<std::byte>> assembled_;  // stored() copies: reordered q/k, stacked experts
};

struct HfExportOptions {
  model::DType dtype = model::DType::BF16;  // F32, F16 or BF16
  int shards = 1;             // > 1: model-0000k-of-0000N.safetensors + model.safetensors.index.json
  std::optional<int> bos_token_id = 1;  // llama2.c's tokenizer: <s> = 1, </s> = 2
  std::vector<int> eos_token_ids = {2};
};

// Writes config.json, generation_config.json and the safetensors file(s) of `weights` (a dense
// model) into `dir` (created when missing; every file written atomically). q/k rows are reordered
// for rotate_half. Throws std::invalid_argument for a model the format cannot hold (MoE),
// std::runtime_error for I/O failures.
void write_hf_model(const std::string& dir, const model::WeightSource& weights, const HfExportOptions& options);

}  // namespace tpcli::formats

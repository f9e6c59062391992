// tpcli::model — Hugging Face model directories (LlamaForCausalLM, MistralForCausalLM): read in
// place (mmap, no conversion step) and written by `tpcli export --to hf`.
//
// A directory holds config.json (+ optional generation_config.json) and either model.safetensors
// or shards model-0000k-of-0000N.safetensors listed by model.safetensors.index.json.
//
// Tensor names, Hugging Face -> tpcli (llama_parameters):
//   model.embed_tokens.weight                        tok_embeddings
//   model.layers.{i}.input_layernorm.weight          layers.{i}.attention_norm
//   model.layers.{i}.self_attn.{q,k,v,o}_proj.weight layers.{i}.w{q,k,v,o}
//   model.layers.{i}.post_attention_layernorm.weight layers.{i}.ffn_norm
//   model.layers.{i}.mlp.{gate,down,up}_proj.weight  layers.{i}.w{1,2,3}
//   model.norm.weight                                norm
//   lm_head.weight                                   output (absent when tie_word_embeddings)
// MLX-quantized models (config.json "quantization": {"group_size", "bits", "mode"}) store a
// quantized module P as P.weight (U32 words), P.scales, P.biases (../shared/QUANT.md section 5):
// they are stored("NAME"), stored("NAME.scales"), stored("NAME.biases") here.
//
// RoPE layout. Within a head of HS rows, tpcli (like llama2.c) rotates the pairs of rows (2i, 2i+1);
// Hugging Face's q_proj/k_proj are stored for rotate_half, which pairs rows (i, i + HS/2). The rows
// are reordered on the way in and out (convert_llama_weights_to_hf.py's permute, llama2.c's
// export.py's permute_reverse):  HF row h*HS + j*HS/2 + i  <->  tpcli row h*HS + 2i + j.
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

#include "model/llama_config.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace tpcli::model {

// What config.json (and generation_config.json) say beyond the LlamaConfig.
struct HfConfig {
  LlamaConfig llama;
  std::string architecture;   // "LlamaForCausalLM" | "MistralForCausalLM"
  std::string torch_dtype;    // "bfloat16", "float16", "float32" or "" when absent
  std::optional<int> bos_token_id;
  std::vector<int> eos_token_ids;  // config.json's, overridden by generation_config.json's
};

// True when `path` is a directory holding a config.json.
bool is_hf_model_dir(const std::string& path);

// Reads DIR/config.json and DIR/generation_config.json. Throws std::runtime_error
// "DIR/config.json: ..." naming the key for a missing file, an unknown architecture, a missing,
// mistyped or unsupported key.
HfConfig read_hf_config(const std::string& dir);

// Reorders the rows of a q/k projection [heads * HS, row_bytes] between the two RoPE layouts
// (see the top of this file). out and in must not overlap.
void rope_rows_from_hf(std::byte* out, const std::byte* in, int heads, int head_size, size_t row_bytes);
void rope_rows_to_hf(std::byte* out, const std::byte* in, int heads, int head_size, size_t row_bytes);

// A Hugging Face model directory as a WeightSource. Every tensor stays in its mmapped file:
// stored() gives F32/F16/BF16 (and quantized U32 words, scales, biases) as stored, except q/k
// projections, whose rows are reordered once into a copy of the same dtype. get() gives f32:
// F32 tensors as views into the map, others converted (dequantized) once per tensor on first use
// and kept, so the devices of a run share one conversion and each copies only its own rows.
class HfModelDir : public WeightSource {
 public:
  // Opens the files and checks every parameter's presence, dtype and shape. Throws
  // std::runtime_error naming the file for a bad directory.
  explicit HfModelDir(const std::string& dir);
  ~HfModelDir() override;

  const LlamaConfig& config() const override { return hf_.llama; }
  const HfConfig& hf_config() const { return hf_; }
  const std::string& dir() const { return dir_; }
  std::span<const float> get(const std::string& name) const override;
  std::optional<StoredTensor> stored(const std::string& name) const override;
  void release_conversions() const override;

 private:
  struct Source {
    const SafetensorsFile* file = nullptr;
    std::string hf_name;
    int rope_heads = 0;  // q/k rows to reorder, head by head (0: none)
  };
  void open_files();
  void map_parameters();
  void add_source(const std::string& name, const std::string& hf_name, int rope_heads);
  const Source& source(const std::string& name) const;
  std::vector<float> dequantized(const std::string& name) const;

  std::string dir_;
  HfConfig hf_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> file_of_;  // Hugging Face tensor name -> its file
  std::map<std::string, Source> sources_;                  // tpcli name (and NAME.scales/.biases)
  // get() holds converted_mutex_ while it converts and may then take reordered_mutex_ (stored()).
  mutable std::mutex converted_mutex_, reordered_mutex_;
  mutable std::map<std::string, std::vector<float>> converted_;      // get() results, by file name
  mutable std::map<std::string, std::vector<std::byte>> reordered_;  // stored() q/k copies
};

struct HfExportOptions {
  DType dtype = DType::BF16;  // F32, F16 or BF16
  int shards = 1;             // > 1: model-0000k-of-0000N.safetensors + model.safetensors.index.json
  std::optional<int> bos_token_id = 1;  // llama2.c's tokenizer: <s> = 1, </s> = 2
  std::vector<int> eos_token_ids = {2};
};

// Writes config.json, generation_config.json and the safetensors file(s) of `weights` (a dense
// model) into `dir` (created when missing; every file written atomically). q/k rows are reordered
// for rotate_half. Throws std::invalid_argument for a model the format cannot hold (MoE),
// std::runtime_error for I/O failures.
void write_hf_model(const std::string& dir, const WeightSource& weights, const HfExportOptions& options);

}  // namespace tpcli::model

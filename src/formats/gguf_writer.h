// tpcli::formats — writing GGUF files (llama.cpp's format, version 3), the mirror of
// formats/gguf_file.h (the container) and formats/gguf_model.h (a model in it).
//
// GgufWriter lays out what gguf_file.h reads: the header, the metadata in the order it was added,
// the tensor descriptions, then each tensor's data at an offset that is a multiple of
// general.alignment (32, written as a key). Tensor data is produced one tensor at a time while
// writing, so a model is never held twice in memory.
//
// write_gguf_model writes a model::WeightSource under llama.cpp's names (model/block_matrices.h's
// gguf column) as the architecture it was read as: `llama` (dense, or Mixtral's stacked experts),
// `qwen2` (q/k/v biases) or `phi3` (q|k|v fused as attn_qkv, gate|up as ffn_up). tpcli holds q/k
// rows in interleaved RoPE pairs, as llama.cpp's llama architecture does; for qwen2 and phi3,
// whose RoPE is rotate-half (NEOX), the rows are reordered as formats/hf_names.h does for Hugging
// Face. Matrices are written in the chosen type; 1-D tensors (norms, biases) and the MoE router
// stay F32 as llama.cpp's converter keeps them; a Q8_0 matrix whose rows are not a multiple of 32
// falls back to F16, as convert_hf_to_gguf.py's does. A tied classifier writes no output.weight
// (llama.cpp then uses token_embd), except for phi3, whose llama.cpp requires one (a copy).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "formats/gguf_file.h"
#include "formats/gguf_keys.h"
#include "model/weights.h"

namespace tpcli::formats {

namespace gguf {

Value string_value(std::string text);
Value u32_value(uint32_t v);
Value f32_value(float v);
Value bool_value(bool v);
Value strings_value(const std::vector<std::string>& items);
Value f32s_value(const std::vector<float>& items);
Value i32s_value(const std::vector<int32_t>& items);

// A tensor to write: its GGUF name, ggml's shape (ne[0] the row length), its type, and the
// function that gives its values in f32, row-major (ne[0] fastest), when the data is written.
struct TensorToWrite {
  std::string name;
  std::vector<uint64_t> ne;
  TensorType type = TensorType::F32;
  std::function<std::vector<float>()> values;
};

class GgufWriter {
 public:
  GgufWriter();  // general.alignment 32 comes first
  // std::invalid_argument naming the key or tensor for a duplicate, or a tensor whose rows are no
  // whole number of its type's blocks, or a type tensor/ggml_blocks.h cannot write.
  void add(const std::string& key, Value value);
  void add_tensor(TensorToWrite tensor);
  // The whole file; the stream's failure is the caller's to check.
  void write(std::ostream& out) const;

  const std::vector<std::pair<std::string, Value>>& metadata() const { return metadata_; }
  const std::vector<TensorToWrite>& tensors() const { return tensors_; }

 private:
  std::vector<std::pair<std::string, Value>> metadata_;
  std::vector<TensorToWrite> tensors_;
};

}  // namespace gguf

// A tokenizer as llama.cpp's GGUF keys hold it (gguf_keys.h): model "llama" (SentencePiece:
// tokens with scores) or "gpt2" (byte-level BPE: tokens, merges and the pre-tokenizer's name).
struct GgufVocabulary {
  std::string model;                  // "llama" | "gpt2"
  std::optional<std::string> pre;     // tokenizer.ggml.pre ("gpt2" models)
  std::vector<std::string> tokens;    // [V]
  std::vector<float> scores;          // [V] or empty
  std::vector<int32_t> token_types;   // [V] gguf_keys::TokenType
  std::vector<std::string> merges;    // "left right", in rank order ("gpt2" only)
  std::optional<uint32_t> bos_id, eos_id, unknown_id, padding_id;
  std::optional<bool> add_bos, add_eos;
  std::optional<std::string> chat_template;
};

struct GgufExportOptions {
  tensor::GgmlType type = tensor::GgmlType::F16;  // F32, F16, BF16 or Q8_0
  std::string name = "tpcli";                     // general.name
  std::optional<GgufVocabulary> vocabulary;
};

// The GGUF architecture a model is written as ("llama", "qwen2", "phi3"), from its Hugging Face
// architecture; std::invalid_argument naming what GGUF (as tpcli reads it) cannot hold.
std::string gguf_architecture_of(const model::LlamaConfig& c);

// The file's metadata and tensors, in the order they are written.
// `fallbacks` (when given) receives the Q8_0 matrices kept F16.
gguf::GgufWriter gguf_model_writer(const model::WeightSource& weights, const GgufExportOptions& options,
                                   std::vector<std::string>* fallbacks = nullptr);

// Writes `path` atomically (a temporary renamed into place: a failure leaves no file). Returns the
// names of the Q8_0 matrices kept F16 for rows that are not a multiple of 32.
std::vector<std::string> write_gguf_model(const std::string& path, const model::WeightSource& weights, const GgufExportOptions& options);

}  // namespace tpcli::formats

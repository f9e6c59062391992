// tpcli::formats — a GGUF file (llama.cpp's) as the weights of a model.
//
// The architecture comes from the metadata under general.architecture's prefix ("llama.block_count",
// "llama.embedding_length", ...), the parameters from llama.cpp's tensor names: token_embd,
// output_norm, output (absent: the classifier is the embedding), and blk.{l}.NAME as
// model/block_matrices.h's table gives NAME. The llama architecture's q/k rows are stored for
// interleaved RoPE pairs (llama.cpp's converter permutes Hugging Face's), as tpcli holds them.
//
// Supported so far: the `llama` architecture, dense or with experts (Mixtral: ffn_{gate,up,down}_exps
// stacked [E, out, in], the router ffn_gate_inp; rope_freqs, Llama 3's RoPE scaling as a divisor of
// each pair's frequency, read into config().rope_freq_factors); and
// `qwen2` (q/k/v biases), whose q/k rows llama.cpp keeps in Hugging Face's rotate-half order (its
// NEOX RoPE): they are reordered on the way in, as from a Hugging Face directory; and `phi3`
// (rotate-half too; q|k|v fused in attn_qkv, gate|up in ffn_up, read as rows of those tensors; the
// context cut to attention.sliding_window, as its Hugging Face config is read). Every
// tensor type of tensor/ggml_blocks.h is read: stored() gives 16-bit and quantized matrices as
// stored, for the kernels that read ggml's blocks; get() dequantizes to f32 on first use as ggml's
// reference dequantizer computes it. Another architecture, a missing tensor, a tensor of the wrong shape or
// a type that cannot be read is a one-line std::runtime_error naming the file and the key or tensor.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "formats/gguf_file.h"
#include "model/weights.h"

namespace tpcli::formats {

class GgufModel : public model::WeightSource {
 public:
  explicit GgufModel(const std::string& path);

  const model::LlamaConfig& config() const override { return config_; }
  std::span<const float> get(const std::string& name) const override;
  // A 16-bit or quantized matrix as the file stores it (its rows reordered where get() reorders
  // them); nullopt for f32 tensors and vectors, which get() maps.
  std::optional<model::StoredTensor> stored(const std::string& name) const override;
  void release_conversions() const override;
  void release_pages(const std::string& name) const override;
  void release_all_pages() const override;

  const gguf::GgufFile& file() const { return file_; }
  const std::string& architecture() const { return architecture_; }

 private:
  model::LlamaConfig read_config() const;
  // rope_freqs.weight's [head_size / 2] factors; empty when the file has none.
  std::vector<float> rope_frequency_factors(int head_size) const;
  // Where parameter `name` lives: a tensor, or rows of one (Phi-3's fused q|k|v and gate|up).
  struct TensorSlice {
    std::string tensor;
    int64_t first_row = 0, rows = 0;  // rows 0: the whole tensor
  };
  TensorSlice slice_of(const std::string& name) const;
  const TensorSlice& slice(const std::string& name) const;  // checked against its shape when the model opened
  void check_tensors() const;
  // Heads of q/k rows (or biases, norms) stored for rotate-half RoPE, to reorder; 0: none.
  int rope_heads_to_reorder(const std::string& name) const;

  gguf::GgufFile file_;
  std::string architecture_;
  model::LlamaConfig config_;
  std::map<std::string, TensorSlice> slices_;  // parameter -> where it lives
  mutable std::mutex mutex_;
  mutable std::map<std::string, std::vector<float>> dequantized_;
  mutable std::map<std::string, std::vector<std::byte>> reordered_;  // stored() rows in tpcli's RoPE order
};

// Whether `path` is read as GGUF: a regular file whose first four bytes are "GGUF".
bool looks_like_gguf(const std::string& path);

}  // namespace tpcli::formats

// tpcli::formats — llama2.c checkpoints (`.bin`): read through mmap, write atomically.
//
// Layout (llama2.c "version 0"): a header of 7 int32
//   dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
// (vocab_size < 0 means an unshared classifier follows), then f32 arrays in llama_parameters()
// order, except that the precomputed RoPE tables freq_cis_real and freq_cis_imag (each
// seq_len x HS/2 floats, unused: RoPE is recomputed) sit between the final norm and the optional
// classifier.
//
// Dimension legend: C dim, F hidden_dim, L n_layers, NH n_heads, NKV n_kv_heads, HS head size,
// V vocab_size, S seq_len.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>

#include "model/llama_config.h"
#include "model/weights.h"

namespace tpcli::formats {

// A read-only memory map of a whole file (RAII). Throws std::runtime_error naming the file.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  // Drops the pages holding [begin, begin + bytes) (a range of this map) from the process's
  // memory: a device that has copied its shard of a tensor no longer needs the file's copy
  // resident. The map stays valid: a later read of the range faults the pages in again from the
  // file (the map is read-only, so there is nothing to lose). Pages that hold other bytes too are
  // dropped as well, for the same reason.
  void release_pages(const void* begin, size_t bytes) const;
  void release_all_pages() const { release_pages(data_, size_); }

 private:
  std::string path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// The header as stored, and the config it implies. Throws std::runtime_error
// "PATH: FIELD = VALUE ..." for zero/negative/absurd dims or dims that don't fit together.
model::LlamaConfig llama2c_config_from_header(const std::string& path, const int32_t header[7]);

// Bytes a llama2.c file of this config occupies (header + all arrays).
uint64_t llama2c_file_size(const model::LlamaConfig& config);

// A llama2.c checkpoint, mapped; get() hands out spans into the map (no copy), so a device that
// slices its shard copies only that shard.
class Llama2cFile : public model::WeightSource {
 public:
  // Validates the header and the file size against it (one-line errors naming file and field).
  explicit Llama2cFile(const std::string& path);

  const model::LlamaConfig& config() const override { return config_; }
  std::span<const float> get(const std::string& name) const override;
  void release_pages(const std::string& name) const override;
  void release_all_pages() const override { map_.release_all_pages(); }
  const std::string& path() const { return map_.path(); }

 private:
  MappedFile map_;
  model::LlamaConfig config_;
  std::map<std::string, std::span<const float>> tensors_;  // views into map_
};

// Writes `weights` as a llama2.c checkpoint at `path` (temp file + rename, so a crash never
// leaves a half-written checkpoint). The RoPE tables are written as llama2.c's export does
// (cos/sin of pos * theta^(-2i/HS)). Throws std::runtime_error naming the file on I/O failure,
// std::invalid_argument if the config cannot be expressed in the format (MoE, non-default
// norm_eps or rope_theta are not stored: they are llama2.c's fixed values).
void write_llama2c(const std::string& path, const model::WeightSource& weights);

}  // namespace tpcli::formats

#include "files/atomic_file.h"
#include "files/regular_file.h"
#include "formats/llama2c.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <vector>

namespace tpcli::formats {

using files::require_regular_file;
using files::write_atomically;
using model::MAX_DIM;
using model::MAX_HEADS;
using model::MAX_HIDDEN_DIM;
using model::MAX_KV_HEADS;
using model::MAX_LAYERS;
using model::MAX_SEQ_LEN;
using model::MAX_VOCAB;

// ---- MappedFile ----

MappedFile::MappedFile(const std::string& path) : path_(path) {
  require_regular_file(path, "a model file");
  // O_NONBLOCK: should the path become a FIFO after the check, open returns instead of waiting.
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw std::runtime_error(path + ": not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      throw std::runtime_error(path + ": mmap failed: " + std::strerror(err));
    }
    data_ = static_cast<const std::byte*>(p);
  }
  ::close(fd);  // the mapping stays valid
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
}

void MappedFile::release_pages(const void* begin, size_t bytes) const {
  if (!data_ || bytes == 0) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto map_begin = reinterpret_cast<uintptr_t>(data_), map_end = map_begin + size_;
  const auto first = reinterpret_cast<uintptr_t>(begin), last = first + bytes;
  if (first < map_begin || last > map_end)
    throw std::logic_error(path_ + ": release_pages of a range outside the map");
  const uintptr_t from = first / page * page, to = (last + page - 1) / page * page;  // the map's last page is whole
  // MADV_DONTNEED cannot fail on a range of a live map; should it, the pages merely stay resident.
  ::madvise(reinterpret_cast<void*>(from), to - from, MADV_DONTNEED);
}

// ---- header ----

namespace {

constexpr int HEADER_INTS = 7;
constexpr uint64_t HEADER_BYTES = HEADER_INTS * sizeof(int32_t);

// The header's fields, in order, with model/llama_config.h's limits.
constexpr model::ConfigLimit LIMITS[HEADER_INTS] = {MAX_DIM,      MAX_HIDDEN_DIM, MAX_LAYERS, MAX_HEADS,
                                             MAX_KV_HEADS, MAX_VOCAB,      MAX_SEQ_LEN};

uint64_t rope_table_floats(const model::LlamaConfig& c) {
  return static_cast<uint64_t>(c.seq_len) * static_cast<uint64_t>(c.head_size() / 2);
}

}  // namespace

model::LlamaConfig llama2c_config_from_header(const std::string& path, const int32_t header[7]) {
  for (int i = 0; i < HEADER_INTS; ++i) {
    int64_t v = header[i];
    if (i == 5) v = v < 0 ? -v : v;  // vocab_size: the sign is the shared-classifier flag
    if (v < 1 || v > LIMITS[i].max)
      throw std::runtime_error(path + ": header field " + LIMITS[i].field + " = " + std::to_string(header[i]) +
                               " is not in [1, " + std::to_string(LIMITS[i].max) + "] (not a llama2.c checkpoint?)");
  }
  model::LlamaConfig c;
  c.dim = header[0];
  c.hidden_dim = header[1];
  c.n_layers = header[2];
  c.n_heads = header[3];
  c.n_kv_heads = header[4];
  c.vocab_size = std::abs(header[5]);
  c.shared_classifier = header[5] > 0;
  c.seq_len = header[6];
  try {
    c.validate();
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": header: " + e.what());
  }
  return c;
}

uint64_t llama2c_file_size(const model::LlamaConfig& config) {
  uint64_t floats = 2 * rope_table_floats(config);
  for (const auto& p : llama_parameters(config)) floats += static_cast<uint64_t>(tensor::numel(p.shape));
  return HEADER_BYTES + floats * sizeof(float);
}

// ---- Llama2cFile ----

Llama2cFile::Llama2cFile(const std::string& path) : map_(path) {
  if (map_.size() < HEADER_BYTES)
    throw std::runtime_error(path + ": file is " + std::to_string(map_.size()) + " bytes, shorter than the " +
                             std::to_string(HEADER_BYTES) + "-byte llama2.c header");
  int32_t header[HEADER_INTS];
  std::memcpy(header, map_.data(), HEADER_BYTES);
  config_ = llama2c_config_from_header(path, header);

  const uint64_t expected = llama2c_file_size(config_);
  if (map_.size() != expected) {
    const char* what = map_.size() < expected ? "truncated" : "oversized";
    throw std::runtime_error(path + ": file size " + std::to_string(map_.size()) + " bytes is " + what +
                             ": the header (dim " + std::to_string(config_.dim) + ", n_layers " +
                             std::to_string(config_.n_layers) + ", vocab_size " + std::to_string(config_.vocab_size) +
                             (config_.shared_classifier ? ", shared classifier" : ", unshared classifier") +
                             ") implies " + std::to_string(expected) + " bytes");
  }

  // The map is page-aligned and the header is 28 bytes, so every array is float-aligned.
  const float* cursor = reinterpret_cast<const float*>(map_.data() + HEADER_BYTES);
  for (const auto& p : llama_parameters(config_)) {
    if (p.name == "output") cursor += 2 * rope_table_floats(config_);  // skip freq_cis_real/imag
    const auto n = static_cast<size_t>(tensor::numel(p.shape));
    tensors_.emplace(p.name, std::span<const float>(cursor, n));
    cursor += n;
  }
}

std::span<const float> Llama2cFile::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it != tensors_.end()) return it->second;
  if (name == "output" && config_.shared_classifier) return tensors_.at("tok_embeddings");
  throw std::out_of_range(path() + ": no parameter named '" + name + "'");
}

void Llama2cFile::release_pages(const std::string& name) const {
  const std::span<const float> values = get(name);
  map_.release_pages(values.data(), values.size_bytes());
}

// ---- writing ----

namespace {

void write_floats(std::ostream& out, std::span<const float> values) {
  out.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size_bytes()));
}

}  // namespace

void write_llama2c(const std::string& path, const model::WeightSource& weights) {
  const model::LlamaConfig& c = weights.config();
  c.validate();
  if (c.is_moe()) throw std::invalid_argument(path + ": llama2.c checkpoints cannot hold a mixture-of-experts model");
  if (const std::string feature = c.beyond_llama_feature(); !feature.empty())
    throw std::invalid_argument(path + ": llama2.c checkpoints cannot hold a model with " + feature);
  if (c.norm_eps != 1e-5f || c.rope_theta != 10000.0f)
    throw std::invalid_argument(path + ": llama2.c checkpoints fix norm_eps = 1e-5 and rope_theta = 10000 (model has " +
                                std::to_string(c.norm_eps) + ", " + std::to_string(c.rope_theta) + ")");
  if (c.q_dim() != c.dim)
    throw std::invalid_argument(path + ": llama2.c checkpoints need head size dim / n_heads (model has head_dim " +
                                std::to_string(c.head_size()) + ")");
  if (c.rope_scaling || !c.rope_freq_factors.empty())
    throw std::invalid_argument(path + ": llama2.c checkpoints cannot hold rope_scaling (llama3) or RoPE frequency factors");

  write_atomically(path, [&](std::ostream& out) {
    const int32_t header[HEADER_INTS] = {c.dim,        c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads,
                                         c.shared_classifier ? c.vocab_size : -c.vocab_size, c.seq_len};
    out.write(reinterpret_cast<const char*>(header), sizeof(header));
    for (const auto& p : llama_parameters(c)) {
      if (p.name == "output") break;  // written after the RoPE tables
      auto values = weights.get(p.name);
      if (static_cast<int64_t>(values.size()) != tensor::numel(p.shape))
        throw std::invalid_argument(path + ": parameter " + p.name + " has " + std::to_string(values.size()) +
                                    " values, expected " + tensor::to_string(p.shape));
      write_floats(out, values);
    }
    // freq_cis_real then freq_cis_imag, [S, HS/2], as llama2.c's export.py writes them.
    const int hs = c.head_size();
    std::vector<float> real(rope_table_floats(c)), imag(rope_table_floats(c));  // [S, HS/2] each
    for (int pos = 0; pos < c.seq_len; ++pos)
      for (int i = 0; i < hs / 2; ++i) {
        const double freq = 1.0 / std::pow(static_cast<double>(c.rope_theta), (2.0 * i) / hs);
        real[static_cast<size_t>(pos) * (hs / 2) + i] = static_cast<float>(std::cos(pos * freq));
        imag[static_cast<size_t>(pos) * (hs / 2) + i] = static_cast<float>(std::sin(pos * freq));
      }
    write_floats(out, real);
    write_floats(out, imag);
    if (!c.shared_classifier) write_floats(out, weights.get("output"));
  });
}

}  // namespace tpcli::formats

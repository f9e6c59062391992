// Test support: stories260K (../shared) with its classifier unshared (llama2.c's negative
// vocab_size, the embedding table copied to the file's end as the classifier) and +inf in one
// element of embedding row `token`. The sequences that feed `token` overflow; every other one gets
// stories260K's logits exactly.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>

#include "support/shared_data.h"

namespace tpcli::testing {

inline void write_poisoned_stories260k(int token, const std::string& path) {
  std::ifstream in(shared_path("data/stories260K.bin"), std::ios::binary);
  std::string bytes(std::istreambuf_iterator<char>(in), {});
  int32_t header[7];
  if (bytes.size() < sizeof header) throw std::runtime_error("stories260K.bin is not readable");
  std::memcpy(header, bytes.data(), sizeof header);
  const size_t dim = static_cast<size_t>(header[0]), vocab = static_cast<size_t>(header[5]);
  if (header[5] <= 0) throw std::runtime_error("stories260K.bin's classifier is expected shared");
  header[5] = -header[5];
  std::memcpy(bytes.data(), header, sizeof header);
  bytes.append(bytes, sizeof header, vocab * dim * sizeof(float));  // the classifier: the clean embedding
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(bytes.data() + sizeof header + (static_cast<size_t>(token) * dim + 3) * sizeof(float), &inf, sizeof inf);
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace tpcli::testing

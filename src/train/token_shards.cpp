#include "train/token_shards.h"

#include <glob.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "files/atomic_file.h"
#include "files/regular_file.h"
#include "formats/llama2c.h"

namespace tpcli::train {

int shard_token_bytes(int64_t vocab_size) { return vocab_size <= SHARD_U16_MAX_VOCAB ? 2 : 4; }

// ---- writing ----

void write_token_shard(const std::string& path, std::span<const int> tokens, int64_t vocab_size) {
  if (tokens.size() > static_cast<size_t>(INT32_MAX))
    throw std::runtime_error(path + ": " + std::to_string(tokens.size()) +
                             " tokens do not fit one shard (the header counts them in an int32)");
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab_size)
      throw std::runtime_error(path + ": token " + std::to_string(tokens[i]) + " at position " + std::to_string(i) +
                               " is outside the vocabulary of " + std::to_string(vocab_size));
  const int bytes = shard_token_bytes(vocab_size);
  int32_t header[SHARD_HEADER_INTS] = {};  // little-endian on every machine tpcli builds for (x86-64)
  header[0] = bytes == 2 ? SHARD_MAGIC_U16 : SHARD_MAGIC_U32;
  header[1] = bytes == 2 ? SHARD_VERSION_U16 : SHARD_VERSION_U32;
  header[2] = static_cast<int32_t>(tokens.size());
  files::write_atomically(path, [&](std::ostream& out) {
    out.write(reinterpret_cast<const char*>(header), sizeof header);
    if (bytes == 2) {
      std::vector<uint16_t> packed(tokens.begin(), tokens.end());
      out.write(reinterpret_cast<const char*>(packed.data()), static_cast<std::streamsize>(packed.size() * 2));
    } else {
      std::vector<uint32_t> packed(tokens.begin(), tokens.end());
      out.write(reinterpret_cast<const char*>(packed.data()), static_cast<std::streamsize>(packed.size() * 4));
    }
  });
}

// ---- one shard ----

TokenShard::TokenShard(const std::string& path) {
  files::require_regular_file(path, "a token shard");
  map_ = std::make_unique<formats::MappedFile>(path);
  const auto file_bytes = static_cast<int64_t>(map_->size());
  if (file_bytes < SHARD_HEADER_BYTES)
    throw std::runtime_error(path + ": not a token shard: " + std::to_string(file_bytes) +
                             " bytes, shorter than the 1024-byte header (write shards with tpcli tokenize)");
  int32_t header[3];
  std::memcpy(header, map_->data(), sizeof header);
  if (header[0] == SHARD_MAGIC_U16 && header[1] == SHARD_VERSION_U16) {
    token_bytes_ = 2;
  } else if (header[0] == SHARD_MAGIC_U32 && header[1] == SHARD_VERSION_U32) {
    token_bytes_ = 4;
  } else {
    throw std::runtime_error(path + ": not a token shard: magic " + std::to_string(header[0]) + " version " +
                             std::to_string(header[1]) + " (expected 20240520 version 1 or 20240801 version 7)");
  }
  tokens_ = header[2];
  const int64_t expected = SHARD_HEADER_BYTES + tokens_ * token_bytes_;
  if (tokens_ < 0 || expected != file_bytes)
    throw std::runtime_error(path + ": the header counts " + std::to_string(header[2]) + " tokens of " +
                             std::to_string(token_bytes_) + " bytes (" + std::to_string(expected) +
                             " bytes with the header) but the file has " + std::to_string(file_bytes) +
                             " bytes (truncated or not a shard)");
}

TokenShard::~TokenShard() = default;
TokenShard::TokenShard(TokenShard&&) noexcept = default;
TokenShard& TokenShard::operator=(TokenShard&&) noexcept = default;

const std::string& TokenShard::path() const { return map_->path(); }

int64_t TokenShard::token(int64_t i) const {
  const std::byte* at = map_->data() + SHARD_HEADER_BYTES + i * token_bytes_;
  if (token_bytes_ == 2) {
    uint16_t t;
    std::memcpy(&t, at, 2);
    return t;
  }
  uint32_t t;
  std::memcpy(&t, at, 4);
  return t;
}

void TokenShard::read(int64_t offset, std::span<int> out) const {
  if (offset < 0 || offset + static_cast<int64_t>(out.size()) > tokens_)
    throw std::out_of_range(path() + ": read past the end of the shard");
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<int>(token(offset + static_cast<int64_t>(i)));
}

// ---- a split ----

std::vector<std::string> glob_files(const std::string& pattern) {
  glob_t found{};
  std::vector<std::string> paths;
  if (::glob(pattern.c_str(), 0, nullptr, &found) == 0)
    for (size_t i = 0; i < found.gl_pathc; ++i) paths.emplace_back(found.gl_pathv[i]);
  ::globfree(&found);
  std::sort(paths.begin(), paths.end());
  return paths;
}

ShardTokens::ShardTokens(const std::string& pattern, int64_t vocab_size) : vocab_size_(vocab_size) {
  const std::vector<std::string> paths = glob_files(pattern);
  if (paths.empty()) throw std::runtime_error(pattern + ": matches no token shard (write them with tpcli tokenize)");
  starts_.push_back(0);
  for (const std::string& path : paths) {
    shards_.emplace_back(path);
    starts_.push_back(starts_.back() + shards_.back().size());
  }
}

void ShardTokens::read(int64_t offset, std::span<int> out) const {
  if (offset < 0 || offset + static_cast<int64_t>(out.size()) > size())
    throw std::out_of_range("token shards: read past the end of the split");
  // The shard holding `offset`: the last start <= offset.
  auto k = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), offset) - starts_.begin() - 1);
  size_t done = 0;
  while (done < out.size()) {
    const TokenShard& shard = shards_[k];
    const int64_t local = offset + static_cast<int64_t>(done) - starts_[k];
    const auto n = static_cast<size_t>(std::min<int64_t>(shard.size() - local, static_cast<int64_t>(out.size() - done)));
    std::span<int> part = out.subspan(done, n);
    shard.read(local, part);
    for (size_t i = 0; i < n; ++i)
      if (part[i] >= vocab_size_)
        throw std::runtime_error(shard.path() + ": token " + std::to_string(part[i]) + " at position " +
                                 std::to_string(local + static_cast<int64_t>(i)) + " is outside the model's vocabulary of " +
                                 std::to_string(vocab_size_) + " (shards written with another tokenizer?)");
    done += n;
    ++k;
  }
}

}  // namespace tpcli::train

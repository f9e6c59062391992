// tpcli::train — token shards in llm.c's format: written by `tpcli tokenize`, read by training
// ([data] format = "shards") through a memory map, a window at a time.
//
// Dimension legend: N tokens in a shard (or in the concatenation of a split's shards), V vocabulary.
//
// A shard is a 256-int32 little-endian header, then its N tokens:
//   header[0] = 20240520 (magic), header[1] = 1 (version), header[2] = N: tokens are uint16 (V <= 65536)
//   header[0] = 20240801 (magic), header[1] = 7 (version), header[2] = N: tokens are uint32 (larger V)
// (llm.c's dev/data/data_common.py writes the first for GPT-2, the second for Llama 3.) The rest of
// the header is zero. A split of several shards is their concatenation in sorted path order: a
// window may start in one shard and end in the next.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "train/data.h"

namespace tpcli::formats {
class MappedFile;
}

namespace tpcli::train {

constexpr int SHARD_HEADER_INTS = 256;
constexpr int64_t SHARD_HEADER_BYTES = SHARD_HEADER_INTS * 4;
constexpr int32_t SHARD_MAGIC_U16 = 20240520, SHARD_VERSION_U16 = 1;
constexpr int32_t SHARD_MAGIC_U32 = 20240801, SHARD_VERSION_U32 = 7;
constexpr int64_t SHARD_U16_MAX_VOCAB = 65536;

// Bytes per token a shard of a vocabulary of `vocab_size` tokens stores: 2 up to 65536, else 4.
int shard_token_bytes(int64_t vocab_size);

// Writes tokens (N,) as one shard, atomically (files/atomic_file.h). Throws naming `path` when a
// token is negative or not below vocab_size, or the file cannot be written.
void write_token_shard(const std::string& path, std::span<const int> tokens, int64_t vocab_size);

// One shard, memory-mapped; its header is checked on opening: one-line errors naming the file
// (not a shard: magic/version, a token count that disagrees with the file size).
class TokenShard {
 public:
  explicit TokenShard(const std::string& path);
  ~TokenShard();
  TokenShard(TokenShard&&) noexcept;
  TokenShard& operator=(TokenShard&&) noexcept;

  const std::string& path() const;
  int64_t size() const { return tokens_; }             // N
  int token_bytes() const { return token_bytes_; }     // 2 or 4
  int64_t token(int64_t i) const;                      // the i-th token, 0 <= i < N
  // Tokens [offset, offset + out.size()) into out.
  void read(int64_t offset, std::span<int> out) const;

 private:
  std::unique_ptr<formats::MappedFile> map_;
  int64_t tokens_ = 0;
  int token_bytes_ = 2;
};

// The files a glob pattern matches, sorted (glob(3)); empty when none.
std::vector<std::string> glob_files(const std::string& pattern);

// A split: the concatenation of its shards. Reads check every token against the model's
// vocabulary (a shard written with another tokenizer fails with the file and the position).
class ShardTokens : public TokenSource {
 public:
  // `pattern`: a glob (data.path, data.val_path). Throws one line when nothing matches or a
  // shard is bad. vocab_size: tokens must be below it.
  ShardTokens(const std::string& pattern, int64_t vocab_size);
  int64_t size() const override { return starts_.back(); }
  void read(int64_t offset, std::span<int> out) const override;
  const std::vector<TokenShard>& shards() const { return shards_; }

 private:
  std::vector<TokenShard> shards_;
  std::vector<int64_t> starts_;  // (shards + 1,): shard k holds tokens [starts_[k], starts_[k+1]) of the split
  int64_t vocab_size_;
};

}  // namespace tpcli::train

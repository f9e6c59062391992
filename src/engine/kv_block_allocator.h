// tpcli::engine — the bookkeeping of a KV pool (Llama::new_kv_pool): which blocks are free, how
// many sequences hold each, and which full blocks are kept for their tokens so that a later
// prompt starting with the same tokens reuses them (prefix sharing, vLLM's automatic prefix
// caching). A block's key is its tokens and the key of the block before it, so a match always
// covers the whole prefix; blocks nobody holds stay cached until a fresh block is needed, then the
// least recently released goes first.
//
// Host-side and deterministic: every device of a mesh makes the same calls in the same order and
// gets the same block numbers, so a step's block tables need no communication.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <span>
#include <utility>
#include <vector>

namespace tpcli::engine {

class KvBlockAllocator {
 public:
  KvBlockAllocator(int blocks, int block_size);

  int block_size() const { return block_size_; }
  int total() const { return static_cast<int>(blocks_.size()); }
  int free() const;    // held by no sequence (fresh, or cached for their tokens)
  int cached() const;  // held by no sequence, kept for their tokens

  // The longest run of cached full blocks that `tokens` starts with, at most max_blocks, each now
  // held once more by the caller.
  std::vector<int32_t> match_prefix(std::span<const int> tokens, int max_blocks);
  // A block held once by the caller, or -1 when every block is held. Takes a never-keyed block
  // first, then evicts the least recently released cached one.
  int32_t allocate();
  // The caller stops holding each of `blocks`; a block nobody holds is cached if keyed, else free.
  void release(std::span<const int32_t> blocks);
  // `block` now holds the keys and values of the full block `tokens` [block_size] that follows
  // `parent` (-1: the sequence's first block) in a sequence: key it, so match_prefix finds it.
  // Nothing happens when the parent is not keyed or the same tokens already have a block.
  void publish(int32_t block, int32_t parent, std::span<const int> tokens);

 private:
  using Key = std::pair<uint64_t, std::vector<int>>;  // (parent's serial, 0 for none; the block's tokens)
  struct Block {
    int holders = 0;
    uint64_t serial = 0;                       // 0: not keyed
    std::map<Key, int32_t>::iterator key;      // valid when keyed
    std::list<int32_t>::iterator in_released;  // valid when keyed and held by nobody
  };
  void forget_key(int32_t b);

  int block_size_;
  std::vector<Block> blocks_;
  std::vector<int32_t> fresh_;       // never keyed and held by nobody (a stack: the lowest ids first)
  std::list<int32_t> released_;      // keyed and held by nobody, least recently released first
  std::map<Key, int32_t> by_key_;
  uint64_t next_serial_ = 1;
};

}  // namespace tpcli::engine

// tpcli::engine — KV pool bookkeeping (see kv_block_allocator.h).
#include "engine/kv_block_allocator.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace tpcli::engine {

KvBlockAllocator::KvBlockAllocator(int blocks, int block_size) : block_size_(block_size), blocks_(static_cast<size_t>(std::max(blocks, 0))) {
  if (blocks < 1 || block_size < 1)
    throw std::invalid_argument("kv block allocator: " + std::to_string(blocks) + " blocks of " + std::to_string(block_size) + " positions");
  for (int32_t b = blocks - 1; b >= 0; --b) fresh_.push_back(b);
}

int KvBlockAllocator::free() const { return static_cast<int>(fresh_.size() + released_.size()); }

int KvBlockAllocator::cached() const { return static_cast<int>(released_.size()); }

std::vector<int32_t> KvBlockAllocator::match_prefix(std::span<const int> tokens, int max_blocks) {
  std::vector<int32_t> found;
  uint64_t parent = 0;
  const size_t bs = static_cast<size_t>(block_size_);
  for (size_t i = 0; static_cast<int>(i) < max_blocks && (i + 1) * bs <= tokens.size(); ++i) {
    const auto it = by_key_.find({parent, std::vector<int>(tokens.begin() + i * bs, tokens.begin() + (i + 1) * bs)});
    if (it == by_key_.end()) break;
    Block& b = blocks_[static_cast<size_t>(it->second)];
    if (b.holders++ == 0) released_.erase(b.in_released);
    found.push_back(it->second);
    parent = b.serial;
  }
  return found;
}

int32_t KvBlockAllocator::allocate() {
  int32_t b = -1;
  if (!fresh_.empty()) {
    b = fresh_.back();
    fresh_.pop_back();
  } else if (!released_.empty()) {
    b = released_.front();
    released_.pop_front();
    forget_key(b);
  } else {
    return -1;
  }
  blocks_[static_cast<size_t>(b)].holders = 1;
  return b;
}

void KvBlockAllocator::release(std::span<const int32_t> blocks) {
  for (int32_t id : blocks) {
    Block& b = blocks_[static_cast<size_t>(id)];
    if (b.holders < 1) throw std::logic_error("kv block allocator: block " + std::to_string(id) + " released more often than held");
    if (--b.holders > 0) continue;
    if (b.serial) b.in_released = released_.insert(released_.end(), id);
    else fresh_.push_back(id);
  }
}

void KvBlockAllocator::publish(int32_t block, int32_t parent, std::span<const int> tokens) {
  Block& b = blocks_[static_cast<size_t>(block)];
  const uint64_t parent_serial = parent < 0 ? 0 : blocks_[static_cast<size_t>(parent)].serial;
  if (b.serial || (parent >= 0 && parent_serial == 0) || static_cast<int>(tokens.size()) != block_size_) return;
  const auto [it, inserted] = by_key_.try_emplace({parent_serial, std::vector<int>(tokens.begin(), tokens.end())}, block);
  if (!inserted) return;  // another sequence computed the same block first: this one stays private
  b.serial = next_serial_++;
  b.key = it;
}

// An evicted block's serial dies with it: keys naming it as parent can never match again (the
// blocks under them are evicted in their turn), and a new key never reuses the serial.
void KvBlockAllocator::forget_key(int32_t id) {
  Block& b = blocks_[static_cast<size_t>(id)];
  by_key_.erase(b.key);
  b.serial = 0;
}

}  // namespace tpcli::engine

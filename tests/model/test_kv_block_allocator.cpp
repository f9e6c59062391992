// model/: the KV pool's bookkeeping. Blocks are handed out and taken back; full blocks keyed by
// their tokens are found again only through the whole prefix before them; blocks nobody holds are
// evicted least recently released first, and a key under an evicted block never matches again.
#include <catch2/catch.hpp>

#include <vector>

#include "engine/kv_block_allocator.h"

using tpcli::engine::KvBlockAllocator;

namespace {
std::vector<int> run(int first, int n) {
  std::vector<int> t;
  for (int i = 0; i < n; ++i) t.push_back(first + i);
  return t;
}
}  // namespace

TEST_CASE("kv block allocator: allocate until full, release, reuse", "[kv]") {
  KvBlockAllocator a(3, 4);
  const int32_t b0 = a.allocate(), b1 = a.allocate(), b2 = a.allocate();
  CHECK(std::vector<int32_t>{b0, b1, b2} == std::vector<int32_t>{0, 1, 2});
  CHECK(a.allocate() == -1);
  CHECK(a.free() == 0);
  a.release(std::vector<int32_t>{b1});
  CHECK(a.free() == 1);
  CHECK(a.allocate() == b1);
  CHECK_THROWS(a.release(std::vector<int32_t>{b1, b1}));
  CHECK_THROWS(KvBlockAllocator(0, 16));
}

TEST_CASE("kv block allocator: a prefix matches block by block, only whole and in order", "[kv]") {
  KvBlockAllocator a(8, 4);
  const std::vector<int> tokens = run(10, 12);  // three full blocks
  std::vector<int32_t> blocks;
  for (int i = 0; i < 3; ++i) {
    blocks.push_back(a.allocate());
    a.publish(blocks.back(), i ? blocks[static_cast<size_t>(i - 1)] : -1, std::span<const int>(tokens).subspan(static_cast<size_t>(4 * i), 4));
  }
  CHECK(a.match_prefix(tokens, 3) == blocks);              // held twice now
  CHECK(a.match_prefix(tokens, 2) == std::vector<int32_t>(blocks.begin(), blocks.begin() + 2));
  std::vector<int> other = tokens;
  other[5] = 99;  // the second block differs: only the first matches
  CHECK(a.match_prefix(other, 3) == std::vector<int32_t>{blocks[0]});
  CHECK(a.match_prefix(run(14, 8), 2).empty());            // the second block's tokens alone are no prefix
  CHECK(a.match_prefix(run(10, 3), 1).empty());            // not a full block
  // the same block published again by someone else stays private
  const int32_t twin = a.allocate();
  a.publish(twin, -1, std::span<const int>(tokens).first(4));
  a.release(std::vector<int32_t>{twin});
  CHECK(a.cached() == 0);
}

TEST_CASE("kv block allocator: released keyed blocks are cached, evicted least recently released first", "[kv]") {
  KvBlockAllocator a(2, 2);
  const int32_t x = a.allocate(), y = a.allocate();
  a.publish(x, -1, std::vector<int>{1, 2});
  a.publish(y, -1, std::vector<int>{3, 4});
  a.release(std::vector<int32_t>{y});
  a.release(std::vector<int32_t>{x});
  CHECK(a.cached() == 2);
  CHECK(a.free() == 2);
  CHECK(a.allocate() == y);  // released first
  CHECK(a.match_prefix(std::vector<int>{3, 4}, 1).empty());
  CHECK(a.match_prefix(std::vector<int>{1, 2}, 1) == std::vector<int32_t>{x});  // still cached, now held
  CHECK(a.allocate() == -1);
}

TEST_CASE("kv block allocator: a key under an evicted block never matches, even when its block number returns", "[kv]") {
  KvBlockAllocator a(3, 1);
  const int32_t p = a.allocate(), c = a.allocate();
  a.publish(p, -1, std::vector<int>{7});
  a.publish(c, p, std::vector<int>{8});
  a.release(std::vector<int32_t>{p, c});
  (void)a.allocate();  // the fresh block
  const int32_t reused = a.allocate();  // evicts p, released before c
  REQUIRE(reused == p);
  a.publish(reused, -1, std::vector<int>{7});  // same tokens, a new key
  CHECK(a.match_prefix(std::vector<int>{7, 8}, 2) == std::vector<int32_t>{reused});  // not c under the old p
}

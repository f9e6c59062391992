// The shard planner's arithmetic, checked against hand-worked splits and against invariants
// recomputed here from first principles.
#include <catch2/catch.hpp>

#include <set>

#include "model/shard_plan.h"

using tpcli::model::LlamaConfig;
using tpcli::model::plan_all_shards;

namespace {

LlamaConfig shape(int dim, int heads, int kv_heads, int hidden, int vocab) {
  LlamaConfig c{.dim = dim, .hidden_dim = hidden, .n_layers = 1, .n_heads = heads, .n_kv_heads = kv_heads,
      .vocab_size = vocab, .seq_len = 8};
  return c;
}

}  // namespace

TEST_CASE("12 heads on 8 devices: four devices hold 2 heads, four hold 1", "[shard_plan]") {
  auto plans = plan_all_shards(shape(768, 12, 12, 2048, 32000), 8);
  std::vector<int64_t> counts, offsets;
  for (const auto& p : plans) {
    counts.push_back(p.heads.count);
    offsets.push_back(p.heads.offset);
  }
  CHECK(counts == std::vector<int64_t>{2, 2, 2, 2, 1, 1, 1, 1});
  CHECK(offsets == std::vector<int64_t>{0, 2, 4, 6, 8, 9, 10, 11});
  // 12 KV heads (no grouping): each device holds exactly its own query heads' KV heads.
  for (const auto& p : plans) {
    CHECK(p.kv_heads.offset == p.heads.offset);
    CHECK(p.kv_heads.count == p.heads.count);
    CHECK_FALSE(p.kv_replicated);
    CHECK(p.q_rows().offset == p.heads.offset * 64);
    CHECK(p.q_rows().count == p.heads.count * 64);
  }
  // 2048 ffn rows over 8: 256 each; 32000 vocab rows: 4000 each.
  CHECK(plans[3].ffn.offset == 768);
  CHECK(plans[3].ffn.count == 256);
  CHECK(plans[7].vocab.offset == 28000);
}

TEST_CASE("stories260K shape (8 heads, 4 KV heads) on 1..8 devices", "[shard_plan]") {
  const auto c = shape(64, 8, 4, 172, 512);
  // Hand-worked KV holdings (kv_mul = 2: heads 2k, 2k+1 use KV head k).
  SECTION("4 devices: one KV head each, nothing replicated") {
    auto plans = plan_all_shards(c, 4);
    for (int r = 0; r < 4; ++r) {
      CHECK(plans[r].kv_heads.offset == r);
      CHECK(plans[r].kv_heads.count == 1);
      CHECK_FALSE(plans[r].kv_replicated);
    }
  }
  SECTION("8 devices: each KV head held by two devices") {
    auto plans = plan_all_shards(c, 8);
    for (int r = 0; r < 8; ++r) {
      CHECK(plans[r].heads.count == 1);
      CHECK(plans[r].kv_heads.offset == r / 2);
      CHECK(plans[r].kv_heads.count == 1);
      CHECK(plans[r].kv_replicated);
    }
  }
  SECTION("3 devices: heads 3,3,2; a group boundary inside a device replicates KV head 1") {
    auto plans = plan_all_shards(c, 3);
    CHECK(plans[0].heads.count == 3);
    CHECK(plans[0].kv_heads.offset == 0);
    CHECK(plans[0].kv_heads.count == 2);
    CHECK(plans[1].kv_heads.offset == 1);
    CHECK(plans[1].kv_heads.count == 2);
    CHECK(plans[2].kv_heads.offset == 3);
    CHECK(plans[2].kv_heads.count == 1);
    CHECK(plans[0].kv_replicated);
    CHECK(plans[0].kv_head_of(2, 2) == 1);  // global head 2 -> KV head 1, local index 1
    CHECK(plans[1].kv_head_of(0, 2) == 0);  // global head 3 -> KV head 1, local index 0
  }
  SECTION("every device count: invariants") {
    for (int T = 1; T <= 8; ++T) {
      auto plans = plan_all_shards(c, T);
      int64_t heads = 0, ffn = 0, vocab = 0;
      std::vector<int> holders(4, 0);
      for (int r = 0; r < T; ++r) {
        const auto& p = plans[r];
        CHECK(p.heads.offset == heads);
        CHECK(p.ffn.offset == ffn);
        CHECK(p.vocab.offset == vocab);
        heads += p.heads.count;
        ffn += p.ffn.count;
        vocab += p.vocab.count;
        CHECK(p.heads.count >= 8 / T);
        CHECK(p.heads.count <= (8 + T - 1) / T);
        // The KV range is exactly the set of KV heads its query heads use.
        std::set<int64_t> used;
        for (int64_t h = p.heads.offset; h < p.heads.offset + p.heads.count; ++h) used.insert(h / 2);
        CHECK(p.kv_heads.offset == *used.begin());
        CHECK(p.kv_heads.count == static_cast<int64_t>(used.size()));
        for (int64_t k : used) ++holders[k];
      }
      CHECK(heads == 8);
      CHECK(ffn == 172);
      CHECK(vocab == 512);
      bool replicated = false;
      for (int h : holders) {
        CHECK(h >= 1);
        replicated = replicated || h > 1;
      }
      CHECK(plans[0].kv_replicated == replicated);
    }
  }
}

TEST_CASE("6 heads on 4 devices split 2,2,1,1 and uneven FFN rows", "[shard_plan]") {
  auto plans = plan_all_shards(shape(48, 6, 3, 130, 37), 4);
  CHECK(plans[0].heads.count == 2);
  CHECK(plans[1].heads.count == 2);
  CHECK(plans[2].heads.count == 1);
  CHECK(plans[3].heads.count == 1);
  CHECK(plans[0].ffn.count == 33);
  CHECK(plans[1].ffn.count == 33);
  CHECK(plans[2].ffn.count == 32);
  CHECK(plans[3].ffn.offset == 98);
  CHECK(plans[3].vocab.count == 9);
  CHECK(plans[0].vocab.count == 10);
  // heads 4 and 5 both use KV head 2, on different devices
  CHECK(plans[2].kv_heads.offset == 2);
  CHECK(plans[3].kv_heads.offset == 2);
  CHECK(plans[0].kv_replicated);
}

TEST_CASE("more devices than heads is a clear error", "[shard_plan]") {
  const auto c = shape(64, 8, 4, 172, 512);
  CHECK_THROWS_WITH(plan_all_shards(c, 12), Catch::Contains("cannot split 8 heads over 12 devices"));
  CHECK_THROWS_WITH(plan_all_shards(c, 0), Catch::Contains("must be >= 1"));
  CHECK_NOTHROW(plan_all_shards(c, 8));
}

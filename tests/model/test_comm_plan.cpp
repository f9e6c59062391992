// The communication plan (model/comm_plan.h) against what the model really does: every collective
// a decoded token records on each device, in kind and size, on 2 and 4 devices.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>

#include "distributed/runtime.h"
#include "distributed/trace.h"
#include "model/comm_plan.h"
#include "model/llama.h"
#include "model/trainable_llama.h"
#include "model/packed_weights.h"
#include "random_model.h"
#include "support/planned_calls.h"

using namespace tpcli;
using namespace tpcli::testing;

TEST_CASE("comm plan: a decoded token's collectives (sampled and greedy) on every device are the planned ones, 2 and 4 devices") {
  for (const Shape& s : {shapes()[0], shapes()[1]}) {
    const TensorWeights w = random_weights(s.config, 3);
    for (int T : {2, 4}) {
      if (T > s.max_devices) continue;
      INFO(s.name << ", " << T << " devices");
      dist::Trace trace;
      dist::RunOptions options;
      options.trace = &trace;
      std::vector<int64_t> from(static_cast<size_t>(T)), greedy_from(from.size());
      dist::run_on_mesh(dist::Mesh::line(T), [&](dist::Device& dev) {
        model::Llama m(w, dev.axis("model"));
        m.forward(3, 0);  // a first token: then only the second one is compared
        dev.world().barrier();
        from[static_cast<size_t>(dev.rank())] = trace.now_ns();
        m.forward(5, 1);
        dev.world().barrier();
        greedy_from[static_cast<size_t>(dev.rank())] = trace.now_ns();
        m.forward_argmax(7, 2);
      }, options);
      for (int r = 0; r < T; ++r) {
        INFO("device " << r);
        const model::ShardPlan plan = model::plan_shards(s.config, T, r);
        const CallCounts all = recorded_calls(trace, r, from[static_cast<size_t>(r)]),
                         greedy = recorded_calls(trace, r, greedy_from[static_cast<size_t>(r)]);
        CallCounts sampled = all;  // the sampled token's calls: all minus the greedy one's
        for (const auto& [key, calls] : greedy)
          if ((sampled[key] -= calls) == 0) sampled.erase(key);
        CHECK(sampled.size() == 3);  // embedding row, all_sum of C, logits
        CHECK(sampled == planned_calls(model::plan_decode_collectives(s.config, plan)));
        CHECK(greedy == planned_calls(model::plan_decode_collectives(s.config, plan, true)));
      }
    }
  }
}

TEST_CASE("comm plan: one training forward_backward's collectives are the planned ones, with and without recompute") {
  const LlamaConfig c = shapes()[0].config;  // 8 heads, 4 KV heads: KV heads replicated on 8 devices only
  const TensorWeights w = random_weights(c, 4);
  const int B = 2, seq = 5;
  const std::vector<int> tokens = random_tokens(B * seq, c.vocab_size, 5), targets = random_tokens(B * seq, c.vocab_size, 6);
  for (int T : {2, 4, 8})
    for (bool recompute : {false, true}) {
      if (recompute && T != 2) continue;
      INFO(T << " devices" << (recompute ? ", recompute" : ""));
      dist::Trace trace;
      dist::RunOptions options;
      options.trace = &trace;
      std::vector<int64_t> from(static_cast<size_t>(T));
      dist::run_on_mesh(dist::Mesh::line(T), [&](dist::Device& dev) {
        model::TrainableLlama m(w, dev.axis("model"));
        m.set_recompute(recompute);
        dev.world().barrier();
        from[static_cast<size_t>(dev.rank())] = trace.now_ns();
        m.forward_backward(tokens, targets, B, seq);
      }, options);
      for (int r = 0; r < T; ++r) {
        INFO("device " << r);
        const model::ShardPlan plan = model::plan_shards(c, T, r);
        const CallCounts recorded = recorded_calls(trace, r, from[static_cast<size_t>(r)]);
        CHECK(recorded.size() >= 4);
        CHECK(recorded == planned_calls(model::plan_train_collectives(c, plan, B, seq, recompute)));
      }
    }
}

TEST_CASE("comm plan: MoE models are refused with a message, a lone device plans nothing") {
  LlamaConfig moe = shapes()[0].config;
  moe.n_experts = 4;
  moe.top_k = 2;
  CHECK_THROWS_WITH(model::plan_decode_collectives(moe, model::plan_shards(moe, 2, 0)), Catch::Contains("only dense"));
  const LlamaConfig c = shapes()[0].config;
  CHECK(model::plan_decode_collectives(c, model::plan_shards(c, 1, 0)).empty());
}

// The work list's gemms against a count written out from the dims: per row and device, the
// linear layers' multiply-adds C (QL + 2 KVL) + QL C + 3 C FL + C VL; attention per sequence,
// local head and layer: q k^T and att v over blocks of 64 rows, each row block attending to the
// positions up to its end (seq_len 96: a block of 64 rows x 64 positions, one of 32 x 96).
// Forward 2 FLOPs a multiply-add; backward twice the forward; recompute: the blocks' forward again.
TEST_CASE("comm plan: the training work's gemm FLOPs are the count from the dims, with and without recompute") {
  const LlamaConfig c = shapes()[0].config;  // dim 32, 8 heads (HS 4), 4 KV heads, hidden 40, 2 layers, vocab 29
  for (int T : {1, 2}) {
    const model::ShardPlan p = model::plan_shards(c, T, 0);
    const double C = c.dim, QL = 32.0 / T, KVL = 16.0 / T, FL = 40.0 / T, L = c.n_layers, HS = 4, heads = 8.0 / T;
    const double VL = static_cast<double>(p.vocab.count);
    const int64_t rows = 2, seq_len = 96;
    const double N = rows * seq_len;
    const double block_macs = N * (C * (QL + 2 * KVL) + QL * C + 3 * C * FL);  // one layer's
    const double head_macs = N * C * VL;
    const double attention_macs = rows * heads * 2 * HS * (64.0 * 64 + 32.0 * 96);  // per layer, forward
    const double forward_blocks = 2 * L * (block_macs + attention_macs);
    INFO(T << " device(s)");
    CHECK(model::train_flops(c, p, rows, seq_len, false) == Approx(3 * (forward_blocks + 2 * head_macs)));
    CHECK(model::train_flops(c, p, rows, seq_len, true) == Approx(4 * forward_blocks + 3 * 2 * head_macs));
    // every item has a positive size and count; the gemm layouts are those of nn/linear.cpp;
    // attention is one call per layer forward and one backward, on this device's heads
    int64_t attention_calls = 0;
    for (const model::PlannedWork& w : model::plan_train_work(c, p, rows, seq_len, false)) {
      CHECK(w.calls > 0);
      using Op = model::PlannedWork::Op;
      if (w.kind == model::PlannedWork::Kind::Call && (w.op == Op::AttentionForward || w.op == Op::AttentionBackward)) {
        CHECK((w.m == rows && w.n == seq_len && w.heads == 8 / T && w.kv_heads == 4 / T && w.head_size == 4));
        CHECK(w.backward == (w.op == Op::AttentionBackward));
        attention_calls += w.calls;
      }
      if (w.what.ends_with(" weight gradient")) CHECK(w.gemm == model::PlannedWork::Gemm::TN);
      if (w.what.ends_with(" input gradient")) CHECK(w.gemm == model::PlannedWork::Gemm::NN);
      if (w.what.ends_with(" forward") && w.kind == model::PlannedWork::Kind::Matmul) CHECK(w.gemm == model::PlannedWork::Gemm::NT);
    }
    CHECK(attention_calls == 2 * L);
  }
}

// The norms and RoPE as timed calls, counted from the layers: per layer two rmsnorms forward and two
// backward, plus the final norm once each way, over N = rows x seq_len rows of C; RoPE over the N rows
// (q's local heads and k's local KV heads) once forward per block forward and once backward per layer.
TEST_CASE("comm plan: the training work's norm and RoPE calls are counted from the layers, recompute adding forwards") {
  const LlamaConfig c = shapes()[0].config;  // dim 32, 8 heads (HS 4), 4 KV heads, 2 layers
  const int64_t rows = 2, seq_len = 12, N = rows * seq_len, L = 2;
  for (int T : {1, 2})
    for (bool recompute : {false, true}) {
      INFO(T << " device(s)" << (recompute ? ", recompute" : ""));
      const int64_t forwards = recompute ? 2 * L : L;
      std::map<model::PlannedWork::Op, int64_t> calls;
      for (const model::PlannedWork& w : model::plan_train_work(c, model::plan_shards(c, T, 0), rows, seq_len, recompute)) {
        if (w.kind != model::PlannedWork::Kind::Call) continue;
        calls[w.op] += w.calls;
        using Op = model::PlannedWork::Op;
        CHECK(w.backward == (w.op == Op::RmsNormBackward || w.op == Op::RopeBackward || w.op == Op::AttentionBackward));
        if (w.op == Op::RmsNormForward || w.op == Op::RmsNormBackward) CHECK((w.m == N && w.n == c.dim));
        if (w.op == Op::RopeForward || w.op == Op::RopeBackward)
          CHECK((w.m == N && w.n == seq_len && w.heads == 8 / T && w.kv_heads == 4 / T && w.head_size == 4));
      }
      using Op = model::PlannedWork::Op;
      CHECK(calls[Op::RmsNormForward] == 2 * forwards + 1);
      CHECK(calls[Op::RmsNormBackward] == 2 * L + 1);
      CHECK(calls[Op::RopeForward] == forwards);
      CHECK(calls[Op::RopeBackward] == L);
      CHECK(calls[Op::AttentionForward] == forwards);
      CHECK(calls[Op::AttentionBackward] == L);
    }
}

namespace {

int64_t weight_bytes(const std::vector<model::PlannedWork>& work) {
  int64_t bytes = 0;
  for (const model::PlannedWork& w : work)
    if (w.kind == model::PlannedWork::Kind::Weights) bytes += w.bytes * w.calls;
  return bytes;
}

int64_t weight_items(const std::vector<model::PlannedWork>& work) {
  return std::count_if(work.begin(), work.end(), [](const auto& w) { return w.kind == model::PlannedWork::Kind::Weights; });
}

}  // namespace

// Decode: every matrix of the device once per token, as the model runs it, and the KV cache of
// 2 L (pos + 1) positions of this device's KV rows. An f32 model fuses wq|wk|wv and w1|w3 (one
// matvec each, nn/linear.h): per layer [QL + 2 KVL, C], [C, QL], [2 FL, C], [C, FL], then the
// classifier [VL, C] (the shared embedding here), 4 bytes an element.
TEST_CASE("comm plan: a decoded token's work reads every f32 matrix once, fused, and the KV cache up to its position") {
  const LlamaConfig c = shapes()[0].config;  // dim 32, 8 heads (q 32), 4 KV heads (kv 16), hidden 40, 2 layers, vocab 29
  const TensorWeights f32 = random_weights(c, 9);
  for (int T : {1, 2}) {
    INFO(T << " device(s)");
    const model::ShardPlan p = model::plan_shards(c, T, 0);
    const auto work = model::plan_decode_work(c, p, 9, model::decode_storage(f32));
    const int64_t C = 32, QL = 32 / T, KVL = 16 / T, FL = 40 / T, VL = p.vocab.count, L = 2;
    CHECK(weight_items(work) == 5);
    CHECK(weight_bytes(work) == 4 * (L * (C * (QL + 2 * KVL) + C * QL + 2 * FL * C + C * FL) + VL * C));
    int64_t kv = 0;
    for (const model::PlannedWork& w : work)
      if (w.what == "KV cache") kv += w.bytes * w.calls;
    CHECK(kv == 2 * 2 * 10 * KVL * 4);  // 2 (k, v) x 2 layers x 10 positions x KV rows x 4 bytes
  }
}

// Packed (frozen) models run each part alone: wq, wk, wv, wo, w1, w3, w2 and the classifier, each
// at its stored bytes: affine 4-bit in groups of 32 is half a byte an element plus an f32 scale
// and bias per group (3/4 byte an element); w2's rows of 40 are not whole groups, so it stays f32.
// The total is every byte the device holds but the norms (model/packed_weights.h shard_bytes).
TEST_CASE("comm plan: a packed model's decoded token reads each matrix part at its stored bytes") {
  const LlamaConfig c = shapes()[0].config;
  const TensorWeights f32 = random_weights(c, 9);
  const model::ConvertedWeights q4(f32, tensor::WeightFormat::affine(4, 32));
  REQUIRE(model::stored_format(q4, "layers.0.w2").kind == tensor::WeightKind::F32);
  const model::ShardPlan p = model::plan_shards(c, 1, 0);
  const auto work = model::plan_decode_work(c, p, 3, model::decode_storage(q4));
  const int64_t C = 32, L = 2;
  const auto packed = [](int64_t rows, int64_t cols) { return rows * cols * 3 / 4; };
  CHECK(weight_items(work) == 8);
  CHECK(weight_bytes(work) ==
        L * (packed(32, C) + 2 * packed(16, C) + packed(C, 32) + 2 * packed(40, C) + 4 * C * 40) + packed(29, C));
  CHECK(weight_bytes(work) == model::shard_bytes(q4, p) - 4 * C * (2 * L + 1));
}

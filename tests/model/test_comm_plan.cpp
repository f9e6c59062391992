// The communication plan (model/comm_plan.h) against what the model really does: every collective
// a decoded token records on each device, in kind and size, on 2 and 4 devices.
#include <catch2/catch.hpp>

#include "dist/runtime.h"
#include "dist/trace.h"
#include "model/comm_plan.h"
#include "model/llama.h"
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
        model::Llama m(w, dev.axis("model"));
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

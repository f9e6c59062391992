// The step plan (train/step_plan.h) against a real training step: every collective device 0
// records in one optimizer step (model, data-parallel optimizer, loop), in kind and size.
#include <catch2/catch.hpp>

#include "distributed/trace.h"
#include "train/loop.h"
#include "train/step_plan.h"

#include "train/quiet_run.h"
#include "support/planned_calls.h"
#include "support/synthetic_text.h"

using namespace tpcli;
using namespace tpcli::testing;

namespace {

train::TrainOptions one_step(const dist::Mesh& mesh) {
  auto text = synthetic_text(2000, 1);
  auto tokenizer = std::make_shared<const train::TextTokenizer>(train::TextTokenizer::chars(text));
  train::TrainOptions o;
  o.mesh = mesh;
  o.tokenizer = tokenizer;
  o.corpus = std::make_shared<const train::Corpus>(train::split_corpus(tokenizer->encode(text)));
  o.model = {.dim = 32, .hidden_dim = 48, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
             .vocab_size = tokenizer->vocab_size(), .seq_len = 16, .shared_classifier = false};
  o.steps = 1;
  o.batch_size = 4;
  o.seq_len = 8;
  tpcli::testing::quiet_run(o);
  o.bucket_elems = 3000;  // several buckets, the last one shorter
  return o;
}

train::MemoryLayout layout_of(const train::TrainOptions& o) {
  train::MemoryLayout m;
  m.data = o.mesh.axis_size(o.data_axis);
  m.tensor = o.mesh.axis_size(o.tensor_axis);
  m.rows = o.batch_size / m.data;
  m.seq_len = o.seq_len;
  m.recompute = o.recompute;
  m.shard_optimizer = o.shard_optimizer;
  m.bucket_elems = o.bucket_elems;
  return m;
}

}  // namespace

TEST_CASE("step plan: one optimizer step's collectives on device 0 are the planned ones") {
  struct Case {
    const char* name;
    dist::Mesh mesh;
    bool shard, recompute;
    int accum;
  };
  const std::vector<Case> cases = {
      {"model=2", dist::Mesh({{"model", 2}}), false, false, 1},
      {"data=2", dist::Mesh({{"data", 2}}), false, false, 1},
      {"data=2,model=2, sharded optimizer, recompute, 2 micro-batches", dist::Mesh({{"data", 2}, {"model", 2}}), true, true, 2},
      {"model=4 (KV heads replicated)", dist::Mesh({{"model", 4}}), false, false, 1},
  };
  for (const Case& k : cases) {
    INFO(k.name);
    train::TrainOptions o = one_step(k.mesh);
    o.shard_optimizer = k.shard;
    o.recompute = k.recompute;
    o.grad_accum = k.accum;
    dist::Trace trace;
    o.run.trace = &trace;
    train::train(o);
    const CallCounts recorded = recorded_calls(trace, 0);
    CHECK(recorded.size() >= 3);
    CHECK(recorded == planned_calls(train::plan_step_collectives(o.model, layout_of(o), k.accum)));
  }
}

// The optimizer's share of a step's work against the parameter count: gradients zeroed and their
// norm read (4 bytes an element each), AdamW 7 arrays of 4 bytes an element (value, gradient and
// two moments read; value and moments written); ZeRO-1 halves the moments on data = 2.
TEST_CASE("step plan: the optimizer's work is counted from the parameters, halved by shard_optimizer") {
  const model::LlamaConfig c = {.dim = 32, .hidden_dim = 48, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                                .vocab_size = 30, .seq_len = 16, .shared_classifier = false};
  train::MemoryLayout layout;
  layout.rows = 2;
  layout.seq_len = 16;
  const auto bytes_of = [](const std::vector<model::PlannedWork>& work, const std::string& what) {
    int64_t b = 0;
    for (const auto& w : work)
      if (w.what == what) b += w.bytes * w.calls;
    return b;
  };
  const int64_t P = c.parameter_count();
  const auto work = train::plan_step_work(c, layout, 1);
  CHECK(bytes_of(work, "zero gradients") == 4 * P);
  CHECK(bytes_of(work, "gradient norm") == 4 * P);
  CHECK(bytes_of(work, "AdamW") == 28 * P);
  // grad_accum 3: the model's work three times, the optimizer's once
  const auto accumulated = train::plan_step_work(c, layout, 3);
  CHECK(train::step_flops(c, layout, 3) == Approx(3 * train::step_flops(c, layout, 1)));
  CHECK(bytes_of(accumulated, "AdamW") == 28 * P);
  const auto calls_of = [](const std::vector<model::PlannedWork>& work, const std::string& what) {
    int64_t n = 0;
    for (const auto& w : work)
      if (w.what == what) n += w.calls;
    return n;
  };
  CHECK(calls_of(work, "rmsnorm") == 2 * 2 + 1);  // attention and ffn norms per layer, the final one
  CHECK(calls_of(accumulated, "rmsnorm") == 3 * calls_of(work, "rmsnorm"));
  CHECK(bytes_of(accumulated, "residual adds") == 3 * bytes_of(work, "residual adds"));
  layout.data = 2;
  layout.shard_optimizer = true;
  layout.bucket_elems = 1 << 30;  // one bucket: device 0 holds the moments of its first half (even_split)
  CHECK(bytes_of(train::plan_step_work(c, layout, 1), "AdamW") == 28 * ((P + 1) / 2));
}

// The step plan (train/step_plan.h) against a real training step: every collective device 0
// records in one optimizer step (model, data-parallel optimizer, loop), in kind and size.
#include <catch2/catch.hpp>

#include "dist/trace.h"
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
    o.trace = &trace;
    train::train(o);
    const CallCounts recorded = recorded_calls(trace, 0);
    CHECK(recorded.size() >= 3);
    CHECK(recorded == planned_calls(train::plan_step_collectives(o.model, layout_of(o), k.accum)));
  }
}

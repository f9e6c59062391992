// Training beyond toy scale (issue 13): the sharded optimizer state (ZeRO-1), gradient buckets,
// gradient accumulation and activation recomputation each give the losses of the plain run;
// checkpoints are interchangeable between the modes and meshes; the bytes per device that
// `tpcli train` and `tpcli inspect` print are what the model and optimizer hold.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "distributed/runtime.h"
#include "formats/safetensors.h"
#include "model/random_init.h"
#include "model/trainable_llama.h"
#include "train/checkpoint.h"
#include "train/loop.h"
#include "train/memory.h"

#include "train/data_parallel_optimizer.h"
#include "train/step.h"

#include "support/synthetic_text.h"
#include "support/temp_dir.h"
#include "train/quiet_run.h"

using namespace tpcli;
namespace fs = std::filesystem;

namespace {

using tpcli::testing::synthetic_text;

// Dims that split unevenly over 2 devices (hidden 70, 3 kv heads over 2) to exercise uneven slices.
model::LlamaConfig small_config(int vocab) {
  return model::LlamaConfig{.dim = 36, .hidden_dim = 70, .n_layers = 2, .n_heads = 6, .n_kv_heads = 3,
                            .vocab_size = vocab, .seq_len = 32, .shared_classifier = false};
}

train::TrainOptions base_options() {
  auto text = synthetic_text(3000, 1);
  auto tokenizer = std::make_shared<const train::TextTokenizer>(train::TextTokenizer::chars(text));
  train::TrainOptions o;
  o.tokenizer = tokenizer;
  o.corpus = std::make_shared<const train::Corpus>(train::split_corpus(tokenizer->encode(text)));
  o.model = small_config(tokenizer->vocab_size());
  o.init = std::make_shared<model::TensorWeights>(model::random_weights(o.model, 7));
  o.steps = 10;
  o.batch_size = 4;
  o.seq_len = 16;
  o.seed = 1;
  o.shuffle = false;
  o.schedule = {1e-2, 1e-3, 2, 10, train::Decay::Cosine};
  o.adamw = {0.9, 0.99, 1e-8, 0.1};
  o.grad_clip = 1.0;
  tpcli::testing::quiet_run(o);
  o.bucket_elems = 1001;  // buckets cut parameters, and D does not divide them
  return o;
}

using tpcli::testing::losses_of;

void check_close(const std::vector<double>& a, const std::vector<double>& b, double rel) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(a[i] == Approx(b[i]).epsilon(rel));
  }
}

}  // namespace

TEST_CASE("shard_optimizer gives the losses of plain data parallelism on data=2 and data=2,model=2") {
  for (auto [D, TP] : std::vector<std::pair<int, int>>{{2, 1}, {2, 2}}) {
    INFO("mesh " << D << "x" << TP);
    train::TrainOptions o = base_options();
    o.mesh = dist::Mesh({{"data", D}, {"model", TP}});
    const auto plain = losses_of(train::train(o));
    o.shard_optimizer = true;
    const auto sharded = losses_of(train::train(o));
    check_close(sharded, plain, 1e-5);
    CHECK(plain.back() < plain.front());
  }
}

TEST_CASE("checkpoints are interchangeable between sharded and plain optimizers and between meshes") {
  const testing::TempDir scratch;  // removed at the end of the test
  const fs::path& dir = scratch.path();
  train::TrainOptions o = base_options();
  o.mesh = dist::Mesh({{"data", 2}, {"model", 2}});
  o.out_dir = (dir / "full").string();
  const auto full = losses_of(train::train(o));  // plain, 2x2
  formats::SafetensorsFile plain_ckpt(train::latest_checkpoint(o.out_dir));

  // Sharded on data=2 up to step 4 ...
  std::atomic<bool> stop{false};
  o.out_dir = (dir / "cut").string();
  o.mesh = dist::Mesh({{"data", 2}, {"model", 1}});
  o.shard_optimizer = true;
  o.run.stop = &stop;
  o.on_step = [&](int64_t step, double) { stop = step == 3; };
  auto first = train::train(o);
  REQUIRE(first.end_step == 4);
  check_close(losses_of(first), std::vector<double>(full.begin(), full.begin() + 4), 1e-5);
  // ... resumed plain on model=2 up to step 7 ...
  stop = false;
  o.resume = true;
  o.shard_optimizer = false;
  o.mesh = dist::Mesh({{"data", 1}, {"model", 2}});
  o.on_step = [&](int64_t step, double) { stop = step == 6; };
  auto second = train::train(o);
  REQUIRE(second.start_step == 4);
  REQUIRE(second.end_step == 7);
  check_close(losses_of(second), std::vector<double>(full.begin() + 4, full.begin() + 7), 1e-5);
  // ... and sharded again on data=2,model=2 to the end.
  stop = false;
  o.on_step = nullptr;
  o.shard_optimizer = true;
  o.mesh = dist::Mesh({{"data", 2}, {"model", 2}});
  auto third = train::train(o);
  REQUIRE(third.start_step == 7);
  check_close(losses_of(third), std::vector<double>(full.begin() + 7, full.end()), 1e-5);

  // The final checkpoints hold the same full moments.
  formats::SafetensorsFile mixed_ckpt(train::latest_checkpoint(o.out_dir));
  for (const std::string name : {"adam.exp_avg.layers.1.wk", "adam.exp_avg_sq.layers.0.w2", "adam.exp_avg.norm"}) {
    INFO(name);
    auto a = plain_ckpt.tensor(name).data, b = mixed_ckpt.tensor(name).data;
    REQUIRE(a.size() == b.size());
    double worst = 0, scale = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
      scale = std::max(scale, std::abs(static_cast<double>(a[i])));
    }
    CHECK(worst <= 1e-4 * scale);
  }
  fs::remove_all(dir);
}

namespace {

// Batch 16 in one step against 8 x 2 accumulated, on data 1 and 2: losses within 1e-6.
void check_accumulation_equals_big_batch(train::TrainOptions o) {
  for (int D : {1, 2}) {
    INFO("data=" << D);
    o.mesh = dist::Mesh({{"data", D}, {"model", 1}});
    o.batch_size = 16;
    o.grad_accum = 1;
    const auto big = losses_of(train::train(o));
    o.batch_size = 8;
    o.grad_accum = 2;
    const auto accumulated = losses_of(train::train(o));
    check_close(accumulated, big, 1e-6);
  }
}

}  // namespace

TEST_CASE("grad_accum K gives the losses of the K-times batch (batch 16 = batch 8 x 2, shuffle = false)") {
  train::TrainOptions o = base_options();
  o.steps = 6;
  check_accumulation_equals_big_batch(o);
}

TEST_CASE("grad_accum K with MoE: the load-balancing loss is the K-times batch's, not a mean over micro-batches") {
  train::TrainOptions o = base_options();
  o.model.n_experts = 4;
  o.model.top_k = 2;
  o.model.moe_aux_loss = 0.5f;  // large, so a per-micro-batch f_e shows
  o.init = std::make_shared<model::TensorWeights>(model::random_weights(o.model, 7));
  o.steps = 4;
  check_accumulation_equals_big_batch(o);
}

TEST_CASE("recompute gives the same losses with less activation memory") {
  train::TrainOptions o = base_options();
  o.mesh = dist::Mesh({{"data", 1}, {"model", 2}});
  o.steps = 5;
  const auto plain = losses_of(train::train(o));
  o.recompute = true;
  const auto recomputed = losses_of(train::train(o));
  REQUIRE(recomputed.size() == plain.size());
  for (size_t i = 0; i < plain.size(); ++i) CHECK(recomputed[i] == plain[i]);  // the same arithmetic
}

TEST_CASE("bucketed data-parallel all-sum equals the per-parameter all-sum") {
  train::TrainOptions o = base_options();
  const model::TensorWeights weights = model::random_weights(o.model, 3);
  std::vector<int> inputs(4 * 16), targets(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    inputs[i] = static_cast<int>((i * 7) % static_cast<size_t>(o.model.vocab_size));
    targets[i] = static_cast<int>((i * 5 + 1) % static_cast<size_t>(o.model.vocab_size));
  }
  dist::run_on_mesh(dist::Mesh({{"data", 2}, {"model", 2}}), [&](dist::Device& dev) {
    dist::Group& data = dev.axis("data");
    model::TrainableLlama reference(weights, dev.axis("model")), bucketed(weights, dev.axis("model"));
    train::ParallelAxes axes{&data, &dev.world(), 2, 2, 2, true};
    const auto rows = std::span<const int>(inputs).subspan(static_cast<size_t>(data.rank()) * 32, 32);
    const auto rows_t = std::span<const int>(targets).subspan(static_cast<size_t>(data.rank()) * 32, 32);
    train::data_parallel_gradients(reference, axes, rows, rows_t, 2, 16);
    train::DataParallelOptimizer optimizer(bucketed, axes, dev.axis("model").rank(), {}, false, 333);
    bucketed.zero_grad();
    bucketed.forward_backward(rows, rows_t, 2, 16);
    optimizer.reduce_gradients(1);
    auto a = reference.parameters(), b = bucketed.parameters();
    for (size_t i = 0; i < a.size(); ++i)
      for (int64_t j = 0; j < a[i].grad->numel(); ++j)
        if ((*a[i].grad)[j] != (*b[i].grad)[j]) FAIL(a[i].spec->name << " element " << j);
  });
}

TEST_CASE("buckets started during backward give the blocking path's losses and checkpoint bit for bit") {
  // {D, TP, sequence parallel}: with split rows the norms' gradients are final only after backward.
  for (auto [D, TP, sp] : std::vector<std::tuple<int, int, bool>>{{2, 1, false}, {2, 2, false}, {2, 2, true}})
    for (bool shard : {false, true}) {
      INFO("mesh " << D << "x" << TP << (sp ? " sequence parallel" : "") << (shard ? ", shard_optimizer" : ""));
      const testing::TempDir scratch;
      train::TrainOptions o = base_options();
      o.mesh = dist::Mesh({{"data", D}, {"model", TP}});
      o.steps = 4;
      o.shard_optimizer = shard;
      o.sequence_parallel = sp;
      o.overlap_buckets = false;
      o.out_dir = (scratch.path() / "blocking").string();
      const auto blocking = losses_of(train::train(o));
      o.overlap_buckets = true;
      o.out_dir = (scratch.path() / "started").string();
      const auto started = losses_of(train::train(o));
      REQUIRE(started.size() == blocking.size());
      for (size_t i = 0; i < started.size(); ++i) CHECK(started[i] == blocking[i]);
      // Every parameter and AdamW moment after the last step, as the checkpoints hold them.
      CHECK(testing::slurp(train::latest_checkpoint((scratch.path() / "started").string())) ==
            testing::slurp(train::latest_checkpoint((scratch.path() / "blocking").string())));
    }
}

namespace {

struct BucketRun {
  std::vector<int> inputs, targets;  // (4, 16): 2 rows per data rank
  model::TensorWeights weights;
};

BucketRun bucket_run() {
  train::TrainOptions o = base_options();
  BucketRun r{std::vector<int>(4 * 16), std::vector<int>(4 * 16), model::random_weights(o.model, 3)};
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    r.inputs[i] = static_cast<int>((i * 7) % static_cast<size_t>(o.model.vocab_size));
    r.targets[i] = static_cast<int>((i * 5 + 1) % static_cast<size_t>(o.model.vocab_size));
  }
  return r;
}

}  // namespace

TEST_CASE("a bucket's all-sum starts during backward, before the embedding's gradient, and sums as the blocking one") {
  const BucketRun run = bucket_run();
  dist::run_on_mesh(dist::Mesh({{"data", 2}, {"model", 1}}), [&](dist::Device& dev) {
    dist::Group& data = dev.axis("data");
    model::TrainableLlama reference(run.weights, dev.axis("model")), started(run.weights, dev.axis("model"));
    train::ParallelAxes axes{&data, &dev.world(), 2, 1, 2, true};
    const auto rows = std::span<const int>(run.inputs).subspan(static_cast<size_t>(data.rank()) * 32, 32);
    const auto rows_t = std::span<const int>(run.targets).subspan(static_cast<size_t>(data.rank()) * 32, 32);
    train::DataParallelOptimizer blocking_opt(reference, axes, 0, {}, false, 333);
    reference.zero_grad();
    reference.forward_backward(rows, rows_t, 2, 16);
    blocking_opt.reduce_gradients(1);

    train::DataParallelOptimizer started_opt(started, axes, 0, {}, false, 333);
    started.zero_grad();
    train::GradientExchange exchange(started_opt, 1, true);
    std::vector<size_t> started_at;  // buckets started by each ready call
    started.set_gradients_ready([&](int64_t end) {
      exchange.gradients_ready(end);
      started_at.push_back(exchange.started());
    });
    started.forward_backward(rows, rows_t, 2, 16);
    started.set_gradients_ready({});
    exchange.finish();
    // classifier + norm, 2 blocks, the embedding, the end: the blocks' buckets went before the embedding's.
    REQUIRE(started_at.size() == 5);
    CHECK(started_at[0] > 0);
    CHECK(started_at[2] > started_at[0]);
    CHECK(started_at[2] < started_opt.table().buckets().size());
    CHECK(started_at[3] == started_opt.table().buckets().size());
    auto a = reference.parameters(), b = started.parameters();
    for (size_t i = 0; i < a.size(); ++i)
      for (int64_t j = 0; j < a[i].grad->numel(); ++j)
        if ((*a[i].grad)[j] != (*b[i].grad)[j]) FAIL(a[i].spec->name << " element " << j);
  });
}

TEST_CASE("a device failing during backward with buckets started ends the run with its named error") {
  const BucketRun run = bucket_run();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    dist::run_on_mesh(dist::Mesh({{"data", 2}, {"model", 1}}), [&](dist::Device& dev) {
      dist::Group& data = dev.axis("data");
      model::TrainableLlama llama(run.weights, dev.axis("model"));
      train::ParallelAxes axes{&data, &dev.world(), 2, 1, 2, true};
      const auto rows = std::span<const int>(run.inputs).subspan(static_cast<size_t>(data.rank()) * 32, 32);
      const auto rows_t = std::span<const int>(run.targets).subspan(static_cast<size_t>(data.rank()) * 32, 32);
      train::DataParallelOptimizer optimizer(llama, axes, 0, {}, false, 333);
      llama.zero_grad();
      train::GradientExchange exchange(optimizer, 1, true);
      llama.set_gradients_ready([&](int64_t end) {
        exchange.gradients_ready(end);
        if (data.rank() == 1 && exchange.started() > 0) throw std::runtime_error("injected failure in backward");
      });
      llama.forward_backward(rows, rows_t, 2, 16);
      exchange.finish();
    });
    FAIL("the run returned normally");
  } catch (const dist::DeviceError& e) {
    INFO(e.what());
    CHECK(e.rank() == 1);
    CHECK(std::string(e.what()).find("injected failure in backward") != std::string::npos);
  }
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 5.0);
}

TEST_CASE("bytes per device: the accounting equals what the model and optimizer hold") {
  train::TrainOptions o = base_options();
  const model::TensorWeights weights = model::random_weights(o.model, 3);
  const int rows = 2, T = 16;
  std::vector<int> tokens(static_cast<size_t>(rows * T));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int>(i % 20);
  for (bool shard : {false, true})
    for (bool recompute : {false, true})
      for (bool split : {false, true}) {
        INFO("shard " << shard << " recompute " << recompute << " sequence parallel " << split);
        dist::run_on_mesh(dist::Mesh({{"data", 2}, {"model", 2}}), [&](dist::Device& dev) {
          dist::Group& data = dev.axis("data");
          dist::Group& tp = dev.axis("model");
          model::TrainableLlama llama(weights, tp);
          llama.set_recompute(recompute);
          llama.set_sequence_parallel(split);
          train::ParallelAxes axes{&data, &dev.world(), 2, 2, 2, true};
          train::DataParallelOptimizer optimizer(llama, axes, tp.rank(), {}, shard, 1001);
          for (int step = 0; step < 2; ++step) llama.forward_backward(tokens, tokens, rows, T);
          train::MemoryLayout layout{2, 2, 2, true, rows, T, recompute, shard, 1001, split};
          const train::DeviceBytes want = train::device_bytes(o.model, layout, tp.rank(), data.rank(), data.rank());
          int64_t params = 0;
          for (auto& p : llama.parameters()) params += p.value->numel() * 4;
          CHECK(want.parameters == params);
          CHECK(want.gradients == params);
          CHECK(want.optimizer == optimizer.moment_bytes());
          CHECK(want.activations == llama.peak_activation_bytes());
          if (shard) CHECK(optimizer.moment_bytes() < 2 * params);
        });
      }
  // Sharding halves the optimizer state on data=2 (up to a bucket's odd element).
  train::MemoryLayout plain{2, 1, 2, true, 2, 16, false, false, 1001}, sharded = plain;
  sharded.shard_optimizer = true;
  const auto a = train::device_bytes(o.model, plain), b = train::device_bytes(o.model, sharded);
  CHECK(std::abs(2 * b.optimizer - a.optimizer) <= 8 * (a.parameters / 4 / 1001 + 1));
  plain.recompute = true;
  CHECK(train::device_bytes(o.model, plain).activations < a.activations);
  // Sequence parallel on model=2: the residual stream and norms take half the rows.
  train::MemoryLayout tp{1, 2, 1, true, 2, 16, false, false, 1001}, split = tp;
  split.sequence_parallel = true;
  const int64_t C = o.model.dim, N = 2 * 16, L = o.model.n_layers;
  CHECK(train::device_bytes(o.model, tp).activations - train::device_bytes(o.model, split).activations ==
        4 * (L * (4 * (N / 2) * C + 2 * (N / 2)) + 2 * (N / 2) * C + N / 2));
}

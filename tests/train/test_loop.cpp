// The training loop: a replayable run gives the same loss sequence on every mesh, resume
// reproduces an uninterrupted run, loss on a fixed batch goes down.
#include <catch2/catch.hpp>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "distributed/runtime.h"
#include "formats/safetensors.h"
#include "model/random_init.h"
#include "model/trainable_llama.h"
#include "train/checkpoint.h"
#include "train/loop.h"

#include "support/synthetic_text.h"
#include "train/quiet_run.h"

using namespace tpcli;
namespace fs = std::filesystem;

namespace {

using tpcli::testing::synthetic_text;
using tpcli::testing::losses_of;

model::LlamaConfig tiny_config(int vocab) {
  model::LlamaConfig c{.dim = 32, .hidden_dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .vocab_size = vocab,
      .seq_len = 32, .shared_classifier = false};
  return c;
}

fs::path temp_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("tpcli_test_train_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

train::TrainOptions base_options() {
  auto text = synthetic_text(3000, 1);
  auto tokenizer = std::make_shared<const train::TextTokenizer>(train::TextTokenizer::chars(text));
  train::TrainOptions o;
  o.tokenizer = tokenizer;
  o.corpus = std::make_shared<const train::Corpus>(train::split_corpus(tokenizer->encode(text)));
  o.model = tiny_config(tokenizer->vocab_size());
  o.steps = 8;
  o.batch_size = 4;
  o.seq_len = 16;
  o.seed = 1;
  o.shuffle = false;
  o.schedule = {1e-2, 1e-3, 2, 8, train::Decay::Cosine};
  o.adamw = {0.9, 0.99, 1e-8, 0.1};
  o.grad_clip = 1.0;
  tpcli::testing::quiet_run(o);  // one BLIS thread: small matrices, more only add fork-join waits
  return o;
}

}  // namespace

TEST_CASE("a replayable run from a checkpoint gives the same losses on meshes 1x1 2x1 1x2 2x2") {
  auto dir = temp_dir("replay");
  train::TrainOptions o = base_options();
  const std::string init_path = (dir / "init.safetensors").string();
  formats::write_safetensors(init_path, model::random_weights(o.model, 99));
  o.init = std::make_shared<formats::SafetensorsFile>(init_path);

  REQUIRE(o.steps == 8);
  const auto reference = tpcli::testing::same_losses_on_meshes(o, {{1, 1}, {2, 1}, {1, 2}, {2, 2}});
  CHECK(reference.back() < reference.front());
  fs::remove_all(dir);
}

TEST_CASE("sequence parallelism gives the losses of the run without it on meshes 1x2 and 2x2") {
  auto dir = temp_dir("seqpar");
  train::TrainOptions o = base_options();
  const std::string init_path = (dir / "init.safetensors").string();
  formats::write_safetensors(init_path, model::random_weights(o.model, 97));
  o.init = std::make_shared<formats::SafetensorsFile>(init_path);
  o.steps = 50;
  o.schedule.total_steps = 50;
  for (int D : {1, 2}) {
    o.mesh = dist::Mesh({{"data", D}, {"model", 2}});
    o.sequence_parallel = false;
    const auto plain = losses_of(train::train(o));
    o.sequence_parallel = true;
    const auto split = losses_of(train::train(o));
    REQUIRE(split.size() == plain.size());
    INFO("mesh " << D << "x2");
    for (size_t i = 0; i < plain.size(); ++i) CHECK(split[i] == Approx(plain[i]).epsilon(1e-5));
  }
  fs::remove_all(dir);
}

TEST_CASE("resume after an interruption reproduces the uninterrupted loss sequence") {
  auto dir = temp_dir("resume");
  train::TrainOptions o = base_options();
  o.mesh = dist::Mesh({{"data", 2}, {"model", 2}});
  o.shuffle = true;  // seeded shuffling must replay too
  o.eval_every = 4;
  o.eval_batches = 2;

  o.out_dir = (dir / "full").string();
  auto full = losses_of(train::train(o));
  REQUIRE(full.size() == 8);

  // Interrupted after 3 steps (as Ctrl-C would), then resumed.
  o.out_dir = (dir / "cut").string();
  auto first = tpcli::testing::interrupted_run(o, 3);
  CHECK(first.interrupted);
  CHECK(first.end_step == 3);
  REQUIRE(fs::exists(train::latest_checkpoint(o.out_dir)));
  formats::SafetensorsFile ckpt(train::latest_checkpoint(o.out_dir));
  CHECK(ckpt.metadata().at("train.step") == "3");
  CHECK(ckpt.metadata().at("tokenizer.kind") == "chars");
  CHECK(ckpt.has("adam.exp_avg.layers.1.wk"));

  o.resume = true;
  auto second = train::train(o);
  CHECK(second.start_step == 3);
  auto tail = losses_of(second);
  REQUIRE(tail.size() == 5);
  auto head = losses_of(first);
  REQUIRE(head.size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK(head[i] == Approx(full[i]).epsilon(1e-6));
  for (size_t i = 0; i < 5; ++i) CHECK(tail[i] == Approx(full[i + 3]).epsilon(1e-6));

  // metrics.jsonl: one line per step (3 + 5), validation records carry val_loss.
  std::ifstream metrics(fs::path(o.out_dir) / "metrics.jsonl");
  std::string line;
  int lines = 0, val = 0;
  while (std::getline(metrics, line)) {
    ++lines;
    val += line.find("\"val_loss\"") != std::string::npos;
    CHECK(line.find("\"grad_norm\"") != std::string::npos);
    CHECK(line.find("\"tokens_per_s\"") != std::string::npos);
  }
  CHECK(lines == 8);
  CHECK(val == 2);  // steps 4 and 8
  fs::remove_all(dir);
}

TEST_CASE("loss on a fixed batch decreases over 50 steps") {
  auto o = base_options();
  model::TrainableLlama llama(model::random_weights(o.model, 5), dist::Group());
  const int B = 4, T = 16;
  train::BatchSampler batches(o.corpus->train, B, T, false, 0);
  std::vector<int> inputs(B * T), targets(B * T);
  batches.fill(0, 0, B, inputs, targets);
  dist::Group group;
  train::ParallelAxes axes{&group, &group, 1, 1, 1, true};
  auto slots = train::make_slots(llama, o.model, axes, 0);
  std::vector<int64_t> sizes;
  for (auto& s : slots) sizes.push_back(static_cast<int64_t>(s.value.size()));
  train::AdamW adam({0.9, 0.99, 1e-8, 0.0}, sizes);
  double first = 0, last = 0;
  for (int step = 0; step < 50; ++step) {
    last = train::data_parallel_gradients(llama, axes, inputs, targets, B, T);
    if (step == 0) first = last;
    adam.step(slots, 3e-3);
  }
  INFO("first " << first << " last " << last);
  CHECK(last < 0.5 * first);
}

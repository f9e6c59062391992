// Training under faults (issues 12, 25): a diverged run never replaces a good checkpoint, interrupted
// saves leave nothing behind, resume keeps every step once and refuses what does not fit,
// Ctrl-C exits 130 after saving, and SIGTERM ends a step stuck in a collective.
// Mostly through the binary, as a user meets them.
#include <catch2/catch.hpp>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "distributed/mesh.h"
#include "formats/safetensors.h"
#include "model/random_init.h"
#include "support/run_tpcli.h"
#include "support/temp_dir.h"
#include "train/checkpoint.h"
#include "train/loop.h"
#include "train/loss_guard.h"
#include "train/quiet_run.h"

namespace fs = std::filesystem;
using namespace tpcli;
using tpcli::testing::slurp;

extern char** environ;

using tpcli::testing::scratch;

namespace {

using Run = tpcli::testing::RunResult;

Run run_tpcli(const std::string& args) {
  return tpcli::testing::run_tpcli_line(args, {.cwd = TPCLI_SOURCE_DIR, .environment = "OMP_WAIT_POLICY=passive"});
}

int lines_of(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

const fs::path run_dir() { return scratch() / "run"; }
const fs::path checkpoint() { return run_dir() / "latest.safetensors"; }

// A small config on the in-repo corpus, 3 steps, out_dir scratch/run.
std::string config(const std::string& extra = "") {
  const fs::path p = scratch() / "faults.toml";
  std::ofstream(p) << "[mesh]\naxes = { data = 1, model = 2 }\n"
                      "[model]\ndim = 32\nhidden_dim = 64\nn_layers = 1\nn_heads = 4\nn_kv_heads = 2\nseq_len = 32\n"
                      "[data]\npath = \"" << TPCLI_SOURCE_DIR << "/configs/data/verona.txt\"\ntokenizer = \"chars\"\n"
                      "[train]\nsteps = 3\nbatch_size = 4\nseq_len = 16\neval_every = 0\neval_batches = 1\n"
                      "sample_tokens = 0\nwarmup_steps = 0\nout_dir = \"" << run_dir().string() << "\"\n" << extra;
  return p.string();
}

// A fresh 3-step run: its checkpoint and metrics in run_dir().
void train_three_steps() {
  fs::remove_all(run_dir());
  const Run r = run_tpcli("train " + config());
  INFO("stderr: " << r.err);
  REQUIRE(r.code == 0);
  REQUIRE(fs::exists(checkpoint()));
}

std::vector<int64_t> metric_steps() {
  std::vector<int64_t> steps;
  std::istringstream in(slurp(run_dir() / "metrics.jsonl"));
  for (std::string line; std::getline(in, line);) steps.push_back(std::stoll(line.substr(line.find(':') + 1)));
  return steps;
}

// The losses metrics.jsonl holds for the steps after `after`.
std::vector<double> metric_losses_after(int64_t after) {
  std::vector<double> losses;
  std::istringstream in(slurp(run_dir() / "metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    if (std::stoll(line.substr(line.find(':') + 1)) <= after) continue;
    const size_t at = line.find("\"loss\": ") + 8;
    losses.push_back(std::strtod(line.c_str() + at, nullptr));
  }
  return losses;
}

// The checkpoint rewritten with metadata train.step = `step`.
void set_checkpoint_step(const std::string& step) {
  const fs::path copy = scratch() / "copy.safetensors";
  fs::copy_file(checkpoint(), copy, fs::copy_options::overwrite_existing);
  formats::SafetensorsFile file(copy.string());
  formats::Metadata meta = file.metadata();
  meta["train.step"] = step;
  std::vector<formats::TensorView> tensors;
  for (const std::string& name : file.names()) tensors.push_back(file.tensor(name));
  formats::write_safetensors(checkpoint().string(), tensors, meta);
}

// A 1-layer character model over "abc cab bca" lines, 2 sequences of 8 a step on `mesh`: the
// smallest run that trains. `unused_tokens` rows of the vocabulary no text uses.
train::TrainOptions smallest_run(const std::string& alphabet, dist::Mesh mesh, int64_t steps, int unused_tokens = 0) {
  auto tokenizer = std::make_shared<const train::TextTokenizer>(train::TextTokenizer::chars(alphabet));
  train::TrainOptions o;
  o.tokenizer = tokenizer;
  std::string text;
  for (int i = 0; i < 200; ++i) text += "abc cab bca\n";
  o.corpus = std::make_shared<const train::Corpus>(train::split_corpus(tokenizer->encode(text)));
  o.model = model::LlamaConfig{.dim = 16, .hidden_dim = 32, .n_layers = 1, .n_heads = 2, .n_kv_heads = 2,
                               .vocab_size = tokenizer->vocab_size() + unused_tokens, .seq_len = 16,
                               .shared_classifier = unused_tokens == 0};
  o.mesh = std::move(mesh);
  o.steps = steps;
  o.batch_size = 2;
  o.seq_len = 8;
  tpcli::testing::quiet_run(o);
  return o;
}

}  // namespace

TEST_CASE("train faults: a diverging run stops with one line naming the step - the good checkpoint stays") {
  train_three_steps();
  const std::string good = slurp(checkpoint());
  const Run r = run_tpcli("train " + config() + " --resume --set train.steps=8 --set train.lr=1e9");
  INFO("stderr: " << r.err);
  CHECK(r.code == 1);
  const std::string last_line = r.err.substr(r.err.rfind('\n', r.err.size() - 2) + 1);
  CHECK(last_line.rfind("tpcli: ", 0) == 0);
  CHECK(last_line.find("training diverged at step ") != std::string::npos);
  CHECK(r.err.find(checkpoint().string() + " (step 3) is kept") != std::string::npos);
  CHECK(slurp(checkpoint()) == good);

  // A fresh run that diverges writes no checkpoint at all.
  fs::remove_all(run_dir());
  const Run fresh = run_tpcli("train " + config() + " --set train.steps=8 --set train.lr=1e9");
  INFO("fresh stderr: " << fresh.err);
  CHECK(fresh.code == 1);
  CHECK(fresh.err.find("no checkpoint was written") != std::string::npos);
  CHECK_FALSE(fs::exists(checkpoint()));
}

// Issue 25: with save_every = 1, step 4's update blew the weights up to |w| ~ 1e9 (still finite),
// step 4 was saved over the good step-3 checkpoint, and step 5 stopped on a NaN gradient norm
// "keeping" the ruined one, from which no run could continue.
TEST_CASE("train faults: a run blown up with save_every = 1 keeps the last good checkpoint, and --resume trains from it") {
  train_three_steps();
  const std::string good = slurp(checkpoint());
  const Run r = run_tpcli("train " + config() + " --resume --set train.steps=8 --set train.lr=1e9 --set train.save_every=1");
  INFO("stderr: " << r.err);
  CHECK(r.code == 1);
  CHECK(r.err.find("training diverged ") != std::string::npos);
  CHECK(r.err.find(checkpoint().string() + " (step 3) is kept: --resume continues from step 3") != std::string::npos);
  CHECK(slurp(checkpoint()) == good);

  const Run resumed = run_tpcli("train " + config() + " --resume --set train.steps=6");
  INFO("resumed stderr: " << resumed.err);
  CHECK(resumed.code == 0);
  const std::vector<double> losses = metric_losses_after(3);
  CHECK(losses.size() == 3);
  for (double loss : losses) CHECK(std::isfinite(loss));
  CHECK(formats::SafetensorsFile(checkpoint().string()).metadata().at("train.step") == "6");
}

// The last step's weights have no next step to vouch for them: one more step's gradients judge them.
TEST_CASE("train faults: a run whose last update blows up writes no checkpoint of it") {
  fs::remove_all(run_dir());
  const Run one = run_tpcli("train " + config() + " --set train.steps=1 --set train.lr=1e9");
  INFO("stderr: " << one.err);
  CHECK(one.code == 1);
  CHECK(one.err.find("training diverged by step 1: on the next batch its weights give loss ") != std::string::npos);
  CHECK(one.err.find("no checkpoint was written") != std::string::npos);
  CHECK_FALSE(fs::exists(checkpoint()));
}

// The save of step s waits for step s + 1's gradients (before its update): still every save_every steps.
TEST_CASE("train faults: a checkpoint is written once the next step's gradients vouch for it") {
  train::TrainOptions o = smallest_run("abc \n", dist::Mesh({{"data", 2}, {"model", 1}}), 5);
  o.out_dir = (scratch() / "deferred_run").string();
  o.save_every = 2;
  fs::remove_all(o.out_dir);
  const std::string latest = train::latest_checkpoint(o.out_dir);
  auto latest_step = [&] {
    return fs::exists(latest) ? formats::SafetensorsFile(latest).metadata().at("train.step") : std::string("none");
  };
  std::vector<std::string> seen;  // after each step
  o.on_step = [&](int64_t, double) { seen.push_back(latest_step()); };
  train::train(o);
  CHECK(seen == std::vector<std::string>{"none", "none", "2", "2", "4"});
  CHECK(latest_step() == "5");
}

TEST_CASE("train faults: the loss guard passes ordinary training and catches a blow-up") {
  train::LossGuard guard(65);  // ln(65) = 4.17: a uniform guess
  CHECK(guard.unsound(4.6, 2.0).empty());  // a fresh model, a little worse than uniform
  CHECK(guard.unsound(12.0, 2.0).empty());
  CHECK(guard.unsound(13.0, 2.0) == "loss 13, more than 3 x 4.17439 (the median recent loss, or ln(vocab_size) if larger)");
  CHECK(guard.unsound(NAN, 2.0) == "loss nan, gradient norm 2");
  CHECK(guard.unsound(2.0, INFINITY) == "loss 2, gradient norm inf");
  // Late in a run the bar stays at 3 x ln(vocab): a spike to 2x of the recent losses is ordinary.
  for (int i = 0; i < 40; ++i) guard.add(1.5 - 0.01 * i);
  CHECK(guard.unsound(2.4, 5.0).empty());
  CHECK_FALSE(guard.unsound(1e9, 5.0).empty());
  // Losses above ln(vocab) (a model from another corpus): their median sets the bar, one spike does not.
  train::LossGuard high(65);
  for (int i = 0; i < 15; ++i) high.add(20);
  high.add(1e6);
  CHECK(high.unsound(59, 1).empty());
  CHECK(high.unsound(61, 1).rfind("loss 61, more than 3 x 20 (", 0) == 0);
  high.add(NAN);  // not kept
  CHECK(high.unsound(59, 1).empty());
}

TEST_CASE("train faults: a checkpoint holding a non-finite value is never written") {
  // A NaN in an embedding row no token of the corpus uses (the classifier is separate): the loss
  // and the gradients stay finite, so only the check before writing can catch it.
  train::TrainOptions o = smallest_run("abcabcabcab cab\n", dist::Mesh({{"data", 1}, {"model", 2}}), 2, 1);
  auto weights = std::make_shared<model::TensorWeights>(model::random_weights(o.model, 1));
  std::vector<float> embeddings(weights->get("tok_embeddings").begin(), weights->get("tok_embeddings").end());
  embeddings.back() = NAN;  // the unused last token's row
  weights->set("tok_embeddings", tensor::Tensor({o.model.vocab_size, o.model.dim}, embeddings));
  o.init = weights;
  o.out_dir = (scratch() / "nan_run").string();
  fs::remove_all(o.out_dir);
  std::string error;
  try {
    train::train(o);
  } catch (const std::exception& e) {
    error = e.what();
  }
  CHECK(error.find("not written at step 2: tensor tok_embeddings holds non-finite values") != std::string::npos);
  CHECK_FALSE(fs::exists(train::latest_checkpoint(o.out_dir)));
}

TEST_CASE("train faults: a stale .tmp from a killed save is removed at the next start, and said so") {
  fs::remove_all(run_dir());
  fs::create_directories(run_dir());
  std::ofstream(checkpoint().string() + ".tmp") << "half a checkpoint";
  const Run r = run_tpcli("train " + config());
  INFO("stderr: " << r.err);
  CHECK(r.code == 0);
  CHECK(r.err.find("removed " + checkpoint().string() + ".tmp") != std::string::npos);
  CHECK_FALSE(fs::exists(checkpoint().string() + ".tmp"));
}

TEST_CASE("train faults: --resume keeps every step once in metrics.jsonl") {
  train_three_steps();
  // A run killed after step 5 whose last checkpoint is step 3 leaves steps 4 and 5 behind.
  std::ofstream(run_dir() / "metrics.jsonl", std::ios::app) << "{\"step\": 4, \"loss\": 1}\n{\"step\": 5, \"loss\": 1}\n";
  const Run r = run_tpcli("train " + config() + " --resume --set train.steps=6");
  INFO("stderr: " << r.err);
  REQUIRE(r.code == 0);
  CHECK(metric_steps() == std::vector<int64_t>{1, 2, 3, 4, 5, 6});
}

TEST_CASE("train faults: --resume with another model shape names the checkpoint and the key") {
  train_three_steps();
  const Run r = run_tpcli("train " + config() + " --resume --set model.dim=64");
  INFO("stderr: " << r.err);
  CHECK(r.code != 0);
  CHECK(lines_of(r.err) <= 2);
  CHECK(r.err.find(checkpoint().string() + ": --resume: the checkpoint holds a model with model.dim = 32") !=
        std::string::npos);
}

TEST_CASE("train faults: corrupt train.step metadata is a named one-line error") {
  for (const char* step : {"-5", "abc", "99999999999999999999"}) {
    INFO("train.step = " << step);
    train_three_steps();
    set_checkpoint_step(step);
    const Run r = run_tpcli("train " + config() + " --resume --set train.steps=6");
    INFO("stderr: " << r.err);
    CHECK(r.code == 1);
    CHECK(r.err.find(checkpoint().string() + ": metadata train.step = '" + step + "' is not a step count") !=
          std::string::npos);
    CHECK(r.err.find("loss") == std::string::npos);
  }
}

TEST_CASE("train faults: the tiny-corpus hint can be followed - a split of exactly seq_len + 1 tokens trains") {
  // 40 characters: 36 train / 4 val tokens. The validation split is too short for seq_len 16.
  const fs::path corpus = scratch() / "tiny.txt";
  std::ofstream(corpus) << "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMN";
  fs::remove_all(run_dir());
  const Run refused = run_tpcli("train " + config() + " --set data.path=" + corpus.string());
  INFO("stderr: " << refused.err);
  CHECK(refused.code == 2);
  CHECK(refused.err.find("set train.eval_batches = 0") != std::string::npos);
  const Run followed = run_tpcli("train " + config() + " --set data.path=" + corpus.string() + " --set train.eval_batches=0");
  INFO("stderr: " << followed.err);
  CHECK(followed.code == 0);

  // 36 training tokens with seq_len 35: exactly one window of seq_len + 1.
  const Run exact = run_tpcli("train " + config() + " --set data.path=" + corpus.string() +
                              " --set train.eval_batches=0 --set train.seq_len=35 --set model.seq_len=35");
  INFO("stderr: " << exact.err);
  CHECK(exact.code == 0);
  const Run one_short = run_tpcli("train " + config() + " --set data.path=" + corpus.string() +
                                  " --set train.eval_batches=0 --set train.seq_len=36 --set model.seq_len=36");
  CHECK(one_short.code == 2);
  CHECK(one_short.err.find("the training split holds 36 tokens: too few for seq_len = 36") != std::string::npos);
}

TEST_CASE("train faults: data.path naming a directory says so") {
  const Run r = run_tpcli("train " + config() + " --set data.path=" + scratch().string());
  INFO("stderr: " << r.err);
  CHECK(r.code == 2);
  CHECK(lines_of(r.err) == 1);
  CHECK(r.err.find(scratch().string() + ": is a directory, not a text file") != std::string::npos);
}

// Starts `tpcli ARGS...` with stderr to `err` and stdout to /dev/null; returns its pid.
pid_t spawn_tpcli(std::vector<std::string> args, const fs::path& err) {
  args.insert(args.begin(), TPCLI_BINARY);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&files, 1, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, argv[0], &files, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&files);
  REQUIRE(spawned == 0);
  return pid;
}

// Waits until `text` shows in the file `err` (at most 60 s).
void wait_for_text(const fs::path& err, const std::string& text) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (slurp(err).find(text) == std::string::npos && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

TEST_CASE("train faults: Ctrl-C stops after a step, saves, and exits 130") {
  fs::remove_all(run_dir());
  const fs::path err = scratch() / "sigint_stderr.txt";
  const pid_t pid = spawn_tpcli({"train", config(), "--set", "train.steps=100000", "--set", "train.log_every=1"}, err);
  wait_for_text(err, "step 2/");
  ::kill(pid, SIGINT);
  int status = 0;
  ::waitpid(pid, &status, 0);
  INFO("stderr: " << slurp(err));
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 130);
  CHECK(fs::exists(checkpoint()));
  CHECK(slurp(err).find("interrupted: stopped after step") != std::string::npos);
}

// Issue 25: a step held for hours by a modelled link ignored SIGTERM, which only asks for a stop
// after the step. Now the wait inside the collective ends about a second later.
TEST_CASE("train faults: SIGTERM inside a collective on a link of hours exits 143 within seconds, one line, nothing saved") {
  fs::remove_all(run_dir());
  const fs::path err = scratch() / "sigterm_stderr.txt";
  // 1 MB/s and 1 s per hop: every collective of the step takes seconds, the run hours.
  const pid_t pid = spawn_tpcli({"train", config(), "--set", "train.steps=100000", "--link", "model=0.001,1000000"}, err);
  wait_for_text(err, "tpcli train: ");
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // inside the first step's collectives
  ::kill(pid, SIGTERM);
  const auto sent = std::chrono::steady_clock::now();
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() - sent > std::chrono::seconds(20)) {
      ::kill(pid, SIGKILL);  // bounded, whatever happens
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
  const std::string text = slurp(err);
  INFO("stderr: " << text);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 143);
  CHECK(took < 5.0);
  const auto at = text.find("tpcli train: stopped by SIGTERM: device ");
  REQUIRE(at != std::string::npos);
  CHECK(text.find('\n', at) == text.size() - 1);  // one line, the last
  CHECK(text.find("in one collective when the stop request was") != std::string::npos);
  CHECK(!fs::exists(checkpoint()));
}

TEST_CASE("train faults: a batch sampler over exactly seq_len + 1 tokens serves its one window") {
  std::vector<int> tokens(17);
  for (int i = 0; i < 17; ++i) tokens[static_cast<size_t>(i)] = i;
  for (bool shuffle : {false, true}) {
    const train::BatchSampler batches(tokens, 2, 16, shuffle, 1);
    std::vector<int> inputs(32), targets(32);
    batches.fill(3, 0, 2, inputs, targets);
    for (int r = 0; r < 2; ++r)
      for (int t = 0; t < 16; ++t) {
        CHECK(inputs[static_cast<size_t>(r * 16 + t)] == t);
        CHECK(targets[static_cast<size_t>(r * 16 + t)] == t + 1);
      }
  }
  tokens.pop_back();
  CHECK_THROWS_WITH(train::BatchSampler(tokens, 2, 16, false, 0), Catch::Contains("too short"));
}

// A mixture-of-experts model through `tpcli train` (the binary, TPCLI_BINARY): a replayable run
// (shuffle = false) gives the same loss sequence whether the experts sit on one device or are dealt
// out over 2 or 4 data-parallel devices (tokens travelling by all_to_all_v), or also split over a
// tensor axis; and the loss falls. The reference is the single-device run.
#include <catch2/catch.hpp>

#include "support/shared_data.h"

#include "support/temp_dir.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <vector>

namespace fs = std::filesystem;

using tpcli::testing::scratch;

namespace {

using tpcli::testing::slurp;

// Trains with `mesh` (e.g. "data = 2"), returns the "loss" of every metrics.jsonl record; when
// `load` is given, also each record's largest expert load over an even share (any block).
std::vector<double> train_losses(const std::string& name, const std::string& mesh, int steps, const std::string& corpus,
                                 std::vector<double>* load = nullptr, const std::string& more_model_keys = "") {
  const fs::path out = scratch() / name, config = scratch() / (name + ".toml");
  std::ofstream(config) << "[mesh]\naxes = { " << mesh << " }\n"
                        << "[model]\ndim = 32\nhidden_dim = 64\nn_layers = 2\nn_heads = 4\nn_kv_heads = 2\nseq_len = 32\n"
                        << "n_experts = 4\ntop_k = 2\nexpert_hidden_dim = 32\nmoe_aux_loss = 0.01\n" << more_model_keys
                        << "[data]\npath = \"" << corpus << "\"\ntokenizer = \"chars\"\nshuffle = false\n"
                        << "[train]\nsteps = " << steps << "\nbatch_size = 8\nseq_len = 32\nlr = 3e-3\nwarmup_steps = 5\n"
                        << "eval_every = 0\neval_batches = 1\nsample_tokens = 0\nout_dir = \"" << out.string() << "\"\n";
  // OMP_THREAD_LIMIT=1: tiny gemms split over 2 OpenMP threads crawl on a loaded 2-core machine.
  const std::string cmd = std::string("OMP_WAIT_POLICY=passive OMP_THREAD_LIMIT=1 ") + TPCLI_BINARY + " train " + config.string() + " >" +
                          (scratch() / (name + ".out")).string() + " 2>" + (scratch() / (name + ".err")).string() +
                          " </dev/null";
  const int status = std::system(cmd.c_str());
  INFO("mesh " << mesh << ", stderr: " << slurp(scratch() / (name + ".err")));
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  std::vector<double> losses;
  const std::regex loss(R"("loss": ([-0-9.eE+]+))");
  std::istringstream lines(slurp(out / "metrics.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_search(line, m, loss)) losses.push_back(std::stod(m[1]));
    if (!load) continue;
    const std::regex block(R"(\[([0-9, ]+)\])");  // one block's counts inside "expert_tokens"
    const std::string tokens = line.substr(line.find("\"expert_tokens\""));
    double worst = 0;
    for (auto it = std::sregex_iterator(tokens.begin(), tokens.end(), block); it != std::sregex_iterator(); ++it) {
      std::vector<double> counts;
      std::istringstream list((*it)[1].str());
      for (std::string c; std::getline(list, c, ',');) counts.push_back(std::stod(c));
      double total = 0, most = 0;
      for (double c : counts) total += c, most = std::max(most, c);
      worst = std::max(worst, most * static_cast<double>(counts.size()) / total);
    }
    load->push_back(worst);
  }
  REQUIRE(static_cast<int>(losses.size()) == steps);
  return losses;
}

}  // namespace

TEST_CASE("moe train: expert-parallel runs replay the single-device loss sequence", "[nn][moe][train]") {
  const std::string corpus = std::string(TPCLI_SOURCE_DIR) + "/configs/data/verona.txt";
  if (!fs::exists(corpus)) tpcli::testing::skip_test(corpus + " is absent");
  const std::vector<double> one = train_losses("one", "data = 1", 6, corpus);
  for (const char* mesh : {"data = 2", "data = 4", "data = 2, model = 2"}) {
    const std::vector<double> ep = train_losses("ep", mesh, 6, corpus);
    for (size_t s = 0; s < one.size(); ++s) {
      INFO("mesh " << mesh << ", step " << s);
      CHECK(ep[s] == Approx(one[s]).epsilon(1e-4));
    }
  }
}

TEST_CASE("moe train: a Qwen3-MoE-like model (a dense first block, unnormalised gates, q/k norms, q/k/v biases) "
          "replays the single-device loss sequence with its experts dealt out", "[nn][moe][train]") {
  const std::string corpus = std::string(TPCLI_SOURCE_DIR) + "/configs/data/verona.txt";
  if (!fs::exists(corpus)) tpcli::testing::skip_test(corpus + " is absent");
  const std::string qwen = "dense_layers = [0]\nnorm_topk_prob = false\nqk_norm = true\nqkv_bias = true\n";
  const std::vector<double> one = train_losses("qwen-one", "data = 1", 6, corpus, nullptr, qwen);
  for (const char* mesh : {"data = 2", "data = 2, model = 2"}) {
    const std::vector<double> ep = train_losses("qwen-ep", mesh, 6, corpus, nullptr, qwen);
    for (size_t s = 0; s < one.size(); ++s) {
      INFO("mesh " << mesh << ", step " << s);
      CHECK(ep[s] == Approx(one[s]).epsilon(1e-4));
    }
  }
  CHECK(one.back() < one.front());
}

TEST_CASE("moe train: the loss falls on tiny-shakespeare - expert loads within 2x of even after warm-up",
          "[nn][moe][train]") {
  tpcli::testing::require_shared("data/tinyshakespeare.txt");
  const std::string corpus = tpcli::testing::shared_path("data/tinyshakespeare.txt");
  std::vector<double> load;
  const std::vector<double> losses = train_losses("fall", "data = 2", 60, corpus, &load);
  INFO("first " << losses.front() << ", last " << losses.back());
  CHECK(losses.back() < losses.front() - 1.0);
  REQUIRE(load.size() == losses.size());
  for (size_t s = 10; s < load.size(); ++s) {  // after the 5 warm-up steps and a few more
    INFO("step " << s + 1);
    CHECK(load[s] <= 2.0);
  }
}

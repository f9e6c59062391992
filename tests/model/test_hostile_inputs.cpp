// Hostile inputs to the model layer (issue 12): each must end in a one-line error naming the file,
// key or position, never in a crash, a hang, an allocation that kills the machine, or NaN output.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "distributed/mesh.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "files/atomic_file.h"
#include "formats/llama2c.h"
#include "formats/safetensors.h"
#include "model/llama.h"
#include "model/random_init.h"
#include "support/error_of.h"
#include "support/reference_generate.h"
#include "support/temp_dir.h"
#include "text/tokenizer.h"

using namespace tpcli::model;
using namespace tpcli::engine;
using namespace tpcli::files;
using namespace tpcli::formats;
using namespace tpcli::text;
using tpcli::testing::TempDir;
using tpcli::testing::error_of;

namespace {

LlamaConfig tiny_config() {
  LlamaConfig c;
  c.dim = 8, c.hidden_dim = 16, c.n_layers = 1, c.n_heads = 2, c.n_kv_heads = 1, c.vocab_size = 12, c.seq_len = 8;
  return c;
}

// A tiny model's checkpoint whose metadata key `key` is replaced by `value`.
std::string checkpoint_with(const TempDir& dir, const std::string& key, const std::string& value) {
  const TensorWeights weights = random_weights(tiny_config(), 1);
  Metadata meta;
  config_to_metadata(weights.config(), meta);
  meta[key] = value;
  std::vector<TensorView> tensors;
  for (const auto& p : llama_parameters(weights.config())) tensors.push_back({p.name, p.shape, weights.get(p.name)});
  const std::string path = (dir.path() / "model.safetensors").string();
  write_safetensors(path, tensors, meta);
  return path;
}

bool one_line(const std::string& s) { return s.find('\n') == std::string::npos; }

}  // namespace

TEST_CASE("tokenizer: a prompt byte with no piece in a vocabulary under 259 becomes <unk>, never an id past it") {
  const Tokenizer tok({"<unk>", "<s>", "</s>", " ", "a", "b"}, {0, 0, 0, -1, -2, -3}, 1);
  for (const char* prompt : {"\xff", "a\xfe b", "\xe2\x82\xac"}) {
    INFO("prompt bytes " << prompt);
    const std::vector<int> ids = tok.encode(prompt, true, false);
    for (int id : ids) CHECK((id >= 0 && id < tok.vocab_size()));
  }
  CHECK(tok.encode("\xff", false, false) == std::vector<int>{3, UNK_TOKEN});
}

TEST_CASE("safetensors metadata: sizes beyond the limits are refused, naming file and key, before allocating") {
  TempDir dir;
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"model.seq_len", "100000000"}, {"model.seq_len", "2000000000"}, {"model.seq_len", "2e9"},
           {"model.vocab_size", "1000000000"}, {"model.n_layers", "100000"}}) {
    INFO(key << " = " << value);
    const std::string path = checkpoint_with(dir, key, value);
    const std::string e = error_of([&] { SafetensorsFile file(path); });
    CHECK(e.starts_with(path + ": metadata"));
    CHECK(e.find(key.substr(6)) != std::string::npos);
    CHECK(one_line(e));
  }
}

TEST_CASE("model settings: NaN or negative norm_eps / rope_theta are refused by name") {
  TempDir dir;
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"model.norm_eps", "nan"}, {"model.norm_eps", "-1e-5"}, {"model.rope_theta", "-10000"},
           {"model.rope_theta", "inf"}, {"model.moe_aux_loss", "nan"}}) {
    INFO(key << " = " << value);
    const std::string path = checkpoint_with(dir, key, value);
    const std::string e = error_of([&] { SafetensorsFile file(path); });
    CHECK(e.starts_with(path + ": metadata: " + key.substr(6) + " = "));
    CHECK(one_line(e));
  }
}

TEST_CASE("a KV cache larger than the machine's memory is refused before it is allocated") {
  LlamaConfig c = tiny_config();
  c.n_layers = 1024;
  c.seq_len = 1 << 20;  // within the limits: 2 x 1024 x 2^20 x 4 floats = 32 GB of cache
  const TensorWeights weights = random_weights(c, 1);
  const std::string e = error_of([&] { Llama model(weights, tpcli::dist::Group{}); });
  CHECK(e.find("KV cache needs") != std::string::npos);
  CHECK(e.find("seq_len 1048576") != std::string::npos);
}

TEST_CASE("non-regular files (FIFO, directory) are refused by name before they are opened") {
  TempDir dir;
  const std::string fifo = (dir.path() / "pipe").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // Should a loader open the FIFO, this writer unblocks it after 3 s: the test then fails on time
  // instead of hanging.
  std::thread unblock([&] {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
  });
  const auto t0 = std::chrono::steady_clock::now();
  const std::string model_error = error_of([&] { Llama2cFile file(fifo); });
  const std::string tokenizer_error = error_of([&] { Tokenizer tok(fifo, 512); });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  unblock.join();
  CHECK(seconds < 2.0);
  CHECK(model_error == fifo + ": is a FIFO (named pipe), not a model file");
  CHECK(tokenizer_error == fifo + ": is a FIFO (named pipe), not a llama2.c tokenizer file");

  const std::string folder = dir.path().string();
  CHECK(error_of([&] { Tokenizer tok(folder, 512); }) == folder + ": is a directory, not a llama2.c tokenizer file");
  CHECK(error_of([&] { SafetensorsFile file(folder); }) == folder + ": is a directory, not a model file");
}

TEST_CASE("sampler: NaN temperature or top-p is refused - all-NaN probabilities never index scratch[-1]") {
  GenerateOptions o;
  o.temperature = NAN;
  CHECK(error_of([&] { normalized(o, 16); }).find("temperature -t = nan") != std::string::npos);
  o.temperature = 1.0f;
  o.topp = NAN;
  CHECK(error_of([&] { normalized(o, 16); }).find("top-p -p = nan") != std::string::npos);
  CHECK_THROWS_AS(Sampler(4, NAN, 0.9f, 1), std::invalid_argument);

  std::vector<ProbIndex> scratch;
  const std::vector<float> all_nan(5, NAN);
  CHECK_THROWS_AS(sample_topp(all_nan, 0.9f, 0.5f, scratch), std::invalid_argument);
  Sampler sampler(5, 1.0f, 0.9f, 1);
  std::vector<float> logits(5, NAN);
  CHECK_THROWS_AS(sampler.sample(logits), std::invalid_argument);
}

TEST_CASE("generate: non-finite logits end the run with an error naming the position") {
  const Tokenizer tok({"<unk>", "<s>", "</s>", " ", "a", "b"}, {0, 0, 0, -1, -2, -3}, 1);
  std::vector<float> logits(6, 0.0f);
  ForwardFn forward = [&](int, int pos) -> std::span<const float> {
    logits = {-50, -50, -50, 0, 5, 0};  // "a" nearly always: BOS (the end) never before position 2
    if (pos == 2) logits[4] = NAN;
    return logits;
  };
  GenerateOptions o;
  o.steps = 6;
  o.seed = 1;
  for (float temperature : {0.0f, 1.0f}) {
    o.temperature = temperature;
    const std::string e = error_of([&] { tpcli::testing::reference_generate(ModelFns{forward}, tok, o, nullptr); });
    CHECK(e.find("logits at position 2 are not finite") != std::string::npos);
  }
  // The greedy shortcut: argmax reports -1 for non-finite logits.
  o.temperature = 0.0f;
  ArgmaxFn argmax = [](int, int pos) { return pos == 3 ? -1 : 4; };
  CHECK(error_of([&] { tpcli::testing::reference_generate(ModelFns{forward, argmax}, tok, o, nullptr); }).find("position 3") !=
        std::string::npos);
}

TEST_CASE("a checkpoint with one NaN weight: sharded greedy decoding reports non-finite logits on every device") {
  TensorWeights weights = random_weights(tiny_config(), 1);
  std::vector<float> norm(weights.get("norm").begin(), weights.get("norm").end());
  norm[3] = NAN;
  weights.set("norm", tpcli::tensor::Tensor({8}, norm));
  const MeshGenerateResult r = run_model_on_mesh(
      weights, tpcli::dist::Mesh::line(2, "model"),
      [](const ModelFns& model, std::FILE*) {
        GenerateResult g;
        g.tokens.push_back(model.argmax(1, 0));
        return g;
      },
      nullptr);
  CHECK(r.result.tokens == std::vector<int>{-1});
}

TEST_CASE("write_atomically: a failed rename reports the system's reason, not the cleanup's") {
  TempDir dir;
  const std::filesystem::path target = dir.path() / "occupied";
  std::filesystem::create_directories(target / "inside");  // rename(file, non-empty directory) fails
  const std::string e = error_of([&] { write_atomically(target.string(), [](std::ostream& out) { out << "x"; }); });
  CHECK(e.find("cannot rename") != std::string::npos);
  CHECK(e.find("Is a directory") != std::string::npos);
  CHECK(e.find("Success") == std::string::npos);
  CHECK_FALSE(std::filesystem::exists(temporary_path(target.string())));
}

TEST_CASE("replace_directory_atomically: an existing folder is replaced whole, and a failed write leaves it as it was") {
  TempDir dir;
  const std::filesystem::path target = dir.path() / "adapter";
  auto write_file = [](const std::string& folder, const std::string& text) { std::ofstream(folder + "/file.txt") << text; };
  replace_directory_atomically(target.string(), [&](const std::string& tmp) { write_file(tmp, "first"); });
  std::ofstream(target / "stale.txt") << "from the old folder";
  replace_directory_atomically(target.string(), [&](const std::string& tmp) { write_file(tmp, "second"); });
  CHECK(tpcli::testing::slurp(target / "file.txt") == "second");
  CHECK_FALSE(std::filesystem::exists(target / "stale.txt"));  // the old folder's files went with it
  const std::string e = error_of([&] {
    replace_directory_atomically(target.string(), [&](const std::string& tmp) {
      write_file(tmp, "half");
      throw std::runtime_error("disk full");
    });
  });
  CHECK(e == "disk full");
  CHECK(tpcli::testing::slurp(target / "file.txt") == "second");
  int entries = 0;  // the folder alone: no temporary, no old copy left beside it
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir.path())) ++entries;
  CHECK(entries == 1);
}

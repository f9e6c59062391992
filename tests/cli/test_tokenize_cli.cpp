// `tpcli tokenize` -> `tpcli train` on the shards -> loss.svg -> `tpcli plot`, as a user runs them:
// shard names and headers, a llama2.c tokenizer's ids in the shards equal `tpcli tokenizer encode`,
// training on a data=2 mesh from shards, and one-line errors for bad shards and configs.
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/run_tpcli.h"
#include "support/shared_data.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;
using tpcli::testing::TempDir;

namespace {

using Result = tpcli::testing::RunResult;

Result run(const std::vector<std::string>& args, std::optional<std::string> input = std::nullopt) {
  return tpcli::testing::run_tpcli(args, {.environment = "OMP_WAIT_POLICY=passive", .input = input});
}

// The header's first three int32 and the tokens, read the way llm.c's dataloader reads them.
struct Shard {
  int32_t magic = 0, version = 0, count = 0;
  std::vector<int> tokens;
};
Shard read_shard(const fs::path& path) {
  const std::string bytes = tpcli::testing::slurp(path);
  Shard s;
  REQUIRE(bytes.size() >= 1024);
  std::memcpy(&s.magic, bytes.data(), 4);
  std::memcpy(&s.version, bytes.data() + 4, 4);
  std::memcpy(&s.count, bytes.data() + 8, 4);
  const size_t width = s.magic == 20240520 ? 2 : 4;
  for (size_t i = 1024; i + width <= bytes.size(); i += width) {
    uint32_t t = 0;
    std::memcpy(&t, bytes.data() + i, width);
    s.tokens.push_back(static_cast<int>(t));
  }
  return s;
}

int lines_of(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

// `tpcli tokenize` of `text` (one file, STEM.txt, no validation split) with `tokenizer`: the train
// shard it writes, and the ids `tpcli tokenizer encode --bos` gives for the same text.
struct TokenizedText {
  Shard shard;
  std::vector<int> encoded;
};
TokenizedText tokenize_one_file(const TempDir& dir, const std::string& tokenizer, const std::string& stem,
                                const std::string& text) {
  const std::string file = dir.write(stem + ".txt", text);
  const Result made = run({"tokenize", "--tokenizer", tokenizer, "--out", (dir.path() / "s").string(), "--val-fraction", "0", file});
  INFO(made.err);
  REQUIRE(made.code == 0);
  const Result encoded = run({"tokenizer", "encode", "--tokenizer", tokenizer, "--bos"}, text);
  REQUIRE(encoded.code == 0);
  return {read_shard(dir.path() / "s" / (stem + "_train_000000.bin")),
          nlohmann::json::parse(encoded.out).get<std::vector<int>>()};
}

}  // namespace

TEST_CASE("tpcli tokenize: bytes shards, then train on them (data=2) writes loss.svg, and tpcli plot rewrites it") {
  TempDir dir;
  std::string a, b;
  for (int i = 0; i < 400; ++i) a += "ROMEO: the night is young " + std::to_string(i % 7) + "\n";
  for (int i = 0; i < 300; ++i) b += "JULIET: the stars are kind " + std::to_string(i % 5) + "\n";
  const std::string file_a = dir.write("a.txt", a), file_b = dir.write("b.txt", b);
  const fs::path shards = dir.path() / "shards";
  const Result made = run({"tokenize", "--tokenizer", "bytes", "--out", shards.string(), "--shard-tokens", "6000", file_a, file_b});
  INFO(made.err);
  REQUIRE(made.code == 0);
  CHECK(made.err.find("tokenize [") != std::string::npos);  // the progress bar
  // a: 90% of its bytes in shards of at most 6000 tokens, the last 10% in a_val_000000.bin.
  const size_t a_val = a.size() / 10, a_train = a.size() - a_val;
  const size_t b_train = b.size() - b.size() / 10;
  REQUIRE(a_train > 6000);
  REQUIRE(a_train <= 12000);
  const size_t shard_count = 2 + 1 + (b_train + 5999) / 6000 + 1;
  CHECK(made.out.find("wrote " + std::to_string(shard_count) + " shards") != std::string::npos);
  const Shard first = read_shard(shards / "a_train_000000.bin"), second = read_shard(shards / "a_train_000001.bin");
  const Shard val = read_shard(shards / "a_val_000000.bin");
  CHECK(first.magic == 20240520);
  CHECK(first.version == 1);
  CHECK(first.count == 6000);
  CHECK(static_cast<size_t>(first.count + second.count) == a_train);
  CHECK(static_cast<size_t>(val.count) == a_val);
  std::string joined;
  for (const Shard* s : {&first, &second, &val})
    for (int t : s->tokens) joined += static_cast<char>(t);
  CHECK(joined == a);
  CHECK(fs::exists(shards / "b_train_000000.bin"));
  CHECK(fs::exists(shards / "b_val_000000.bin"));

  const fs::path run_dir = dir.path() / "run";
  const std::string config = dir.write(
      "shards.toml", "[mesh]\naxes = { data = 2, model = 1 }\n"
                     "[model]\ndim = 32\nhidden_dim = 64\nn_layers = 1\nn_heads = 4\nseq_len = 32\n"
                     "[data]\nformat = \"shards\"\npath = \"shards/*_train_*.bin\"\nval_path = \"shards/*_val_*.bin\"\n"
                     "tokenizer = \"bytes\"\nshuffle = false\n"
                     "[train]\nsteps = 4\nbatch_size = 4\nseq_len = 32\neval_every = 2\neval_batches = 1\nsample_tokens = 10\n"
                     "out_dir = \"" + run_dir.string() + "\"\n");
  const Result trained = run({"train", config});
  INFO(trained.err);
  REQUIRE(trained.code == 0);
  CHECK(trained.err.find(std::to_string(a_train + (b.size() - b.size() / 10)) + " train / " +
                         std::to_string(a_val + b.size() / 10) + " val tokens") != std::string::npos);
  const std::string svg = tpcli::testing::slurp(run_dir / "loss.svg");
  CHECK(svg.find("<polyline id=\"train\"") != std::string::npos);
  CHECK(svg.find("<polyline id=\"validation\"") != std::string::npos);
  CHECK(std::count(svg.begin(), svg.end(), '\n') > 5);

  fs::remove(run_dir / "loss.svg");
  const Result plotted = run({"plot", run_dir.string()});
  INFO(plotted.err);
  CHECK(plotted.code == 0);
  CHECK(plotted.out.find("4 training and 2 validation points") != std::string::npos);
  CHECK(tpcli::testing::slurp(run_dir / "loss.svg") == svg);
}

TEST_CASE("tpcli tokenize: a llama2.c tokenizer's shards hold the ids `tpcli tokenizer encode --bos` gives") {
  TPCLI_REQUIRE_SHARED("data/tok512.bin");
  TempDir dir;
  const std::string text = "Once upon a time, there was a little dog. He liked to run.\n";
  const TokenizedText t = tokenize_one_file(dir, tpcli::testing::shared_path("data/tok512.bin"), "story", text);
  CHECK(t.shard.tokens == t.encoded);
  CHECK_FALSE(fs::exists(dir.path() / "s" / "story_val_000000.bin"));
}

TEST_CASE("tpcli tokenize: a vocabulary over 65536 (Llama 3's tokenizer.json) writes version 7 shards of uint32 ids") {
  TPCLI_REQUIRE_SHARED("data/hf-tokenizers/llama3");
  TempDir dir;
  const std::string text = "Hello, world! Shards hold uint32 ids when the vocabulary needs them.\n";
  const TokenizedText t = tokenize_one_file(dir, tpcli::testing::shared_path("data/hf-tokenizers/llama3"), "hello", text);
  CHECK(t.shard.magic == 20240801);
  CHECK(t.shard.version == 7);
  CHECK(t.shard.tokens == t.encoded);
  CHECK(static_cast<size_t>(t.shard.count) == t.shard.tokens.size());
  CHECK(std::count_if(t.shard.tokens.begin(), t.shard.tokens.end(), [](int id) { return id > 65535; }) > 0);  // <|begin_of_text|>
}

TEST_CASE("tpcli train on shards written with a tokenizer.json (Mistral's): trains, and the checkpoint names it for infer") {
  TPCLI_REQUIRE_SHARED("data/hf-tokenizers/mistral/tokenizer.json");
  TempDir dir;
  const std::string tokenizer = tpcli::testing::shared_path("data/hf-tokenizers/mistral/tokenizer.json");
  std::string text;
  for (int i = 0; i < 200; ++i) text += "ROMEO: the night is young, and the stars are kind " + std::to_string(i % 7) + ".\n";
  const TokenizedText t = tokenize_one_file(dir, tokenizer, "verse", text);
  REQUIRE(t.shard.tokens == t.encoded);
  const fs::path run_dir = dir.path() / "run";
  const std::string config = dir.write(
      "hf.toml", "[model]\ndim = 16\nhidden_dim = 32\nn_layers = 1\nn_heads = 2\nseq_len = 32\n"
                 "[data]\nformat = \"shards\"\npath = \"s/*_train_*.bin\"\ntokenizer = \"" + tokenizer + "\"\n"
                 "[train]\nsteps = 2\nbatch_size = 2\nseq_len = 32\neval_every = 0\neval_batches = 0\nsample_tokens = 5\n"
                 "out_dir = \"" + run_dir.string() + "\"\n");
  const Result trained = run({"train", config});
  INFO(trained.err << trained.out);
  REQUIRE(trained.code == 0);
  CHECK(trained.err.find(std::to_string(t.shard.tokens.size()) + " train") != std::string::npos);
  // The model took the tokenizer's vocabulary (Mistral's 32000), and the checkpoint records the file.
  const std::string checkpoint = (run_dir / "latest.safetensors").string();
  const std::string header = tpcli::testing::slurp(checkpoint).substr(0, 20000);
  CHECK(header.find("\"tokenizer.kind\":\"hf\"") != std::string::npos);
  CHECK(header.find("\"model.vocab_size\":\"32000\"") != std::string::npos);
  const Result inferred = run({"infer", "--model", checkpoint, "-i", "ROMEO:", "-n", "4", "-t", "0"});
  INFO(inferred.err);
  CHECK(inferred.code == 0);
  CHECK(inferred.out.rfind("ROMEO:", 0) == 0);
}

TEST_CASE("tpcli tokenize / train on shards: bad input is a one-line error naming the file or key") {
  TempDir dir;
  const std::string text = dir.write("t.txt", std::string(3000, 'x'));
  Result r = run({"tokenize", "--tokenizer", "bytes", "--out", (dir.path() / "s").string(), text, dir.path().string() + "/missing.txt"});
  CHECK(r.code == 2);
  CHECK(r.err.find("missing.txt") != std::string::npos);
  CHECK(lines_of(r.err) == 1);
  r = run({"tokenize", "--tokenizer", "bytes", "--out", (dir.path() / "s").string(), text, dir.write("sub_t.txt", "y")});
  REQUIRE(r.code == 0);
  fs::create_directories(dir.path() / "other");
  r = run({"tokenize", "--tokenizer", "bytes", "--out", (dir.path() / "s").string(), text, dir.write("other/t.txt", "z")});
  CHECK(r.code == 2);
  CHECK(r.err.find("same name") != std::string::npos);

  auto train_error = [&](const std::string& data) {
    const std::string config = dir.write("c.toml", "[model]\ndim = 16\nhidden_dim = 32\nn_layers = 1\nn_heads = 2\nseq_len = 16\n"
                                                   "[data]\n" + data + "\n[train]\nsteps = 1\nbatch_size = 2\nseq_len = 16\n"
                                                   "out_dir = \"" + (dir.path() / "run").string() + "\"\n");
    const Result t = run({"train", config});
    INFO(t.err);
    CHECK(t.code == 2);
    CHECK(lines_of(t.err) == 1);
    return t.err;
  };
  // A shard with a bad magic: the error names it.
  std::string bad(1024 + 10, '\0');
  bad[0] = 1;
  std::ofstream(dir.path() / "s" / "z_train_000000.bin", std::ios::binary) << bad;
  CHECK(train_error("format = \"shards\"\npath = \"s/*_train_*.bin\"\nval_path = \"s/*_val_*.bin\"\ntokenizer = \"bytes\"")
            .find("z_train_000000.bin: not a token shard: magic 1") != std::string::npos);
  fs::remove(dir.path() / "s" / "z_train_000000.bin");
  CHECK(train_error("format = \"shards\"\npath = \"s/*_nothing_*.bin\"\ntokenizer = \"bytes\"").find("matches no file") !=
        std::string::npos);
  CHECK(train_error("format = \"shards\"\npath = \"s/*_train_*.bin\"").find("data.tokenizer") != std::string::npos);
  CHECK(train_error("format = \"shards\"\npath = \"s/*_train_*.bin\"\ntokenizer = \"bytes\"").find("data.val_path") !=
        std::string::npos);
}

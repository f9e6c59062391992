// formats::open: each format (llama2.c, tpcli safetensors with or without its extension, a Hugging
// Face directory) written by its own writer is recognised and read with what it records (the
// checkpoint's tokenizer, the directory's token ids); what is none of them is a runtime_error.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <filesystem>

#include "formats/hf_model.h"
#include "formats/llama2c.h"
#include "formats/open_model.h"
#include "formats/safetensors.h"
#include "random_model.h"
#include "support/temp_dir.h"

using namespace tpcli;
using tpcli::testing::TempDir;
namespace fs = std::filesystem;

namespace {

model::LlamaConfig small_config() { return tpcli::testing::make_config(16, 4, 2, 24, 2, 11, false); }

// Every parameter of `opened` equals the one in `expected`.
void check_weights(const formats::OpenedModel& opened, const model::WeightSource& expected) {
  REQUIRE(opened.weights);
  CHECK(opened.weights->config().dim == expected.config().dim);
  CHECK(opened.weights->config().vocab_size == expected.config().vocab_size);
  for (const auto& spec : model::llama_parameters(expected.config())) {
    INFO(spec.name);
    const auto got = opened.weights->get(spec.name);
    const auto want = expected.get(spec.name);
    CHECK(std::equal(got.begin(), got.end(), want.begin(), want.end()));
  }
}

}  // namespace

TEST_CASE("formats::open reads a llama2.c file, recording no tokenizer") {
  const TempDir dir;
  const model::TensorWeights w = tpcli::testing::random_weights(small_config(), 1);
  const std::string path = (dir.path() / "m.bin").string();
  formats::write_llama2c(path, w);
  const formats::OpenedModel opened = formats::open(path);
  check_weights(opened, w);
  CHECK(dynamic_cast<const formats::Llama2cFile*>(opened.weights.get()));
  CHECK(!opened.tokenizer);
  CHECK(!opened.hf_dir);
  CHECK(opened.metadata.empty());
  CHECK(!formats::looks_like_safetensors(path));
}

TEST_CASE("formats::open reads a safetensors checkpoint by its name or by its header, its tokenizer beside it") {
  const TempDir dir;
  const model::TensorWeights w = tpcli::testing::random_weights(small_config(), 2);
  for (const std::string name : {"m.safetensors", "m.ckpt"}) {
    INFO(name);
    const std::string path = (dir.path() / name).string();
    formats::write_safetensors(path, w, {{"tokenizer", "tok/tokenizer.json"}});
    CHECK(formats::looks_like_safetensors(path));
    const formats::OpenedModel opened = formats::open(path);
    check_weights(opened, w);
    CHECK(dynamic_cast<const formats::SafetensorsFile*>(opened.weights.get()));
    CHECK(opened.tokenizer == (dir.path() / "tok" / "tokenizer.json").string());  // relative to the checkpoint's folder
    CHECK(opened.metadata.at("tokenizer") == "tok/tokenizer.json");
    CHECK(!opened.hf_dir);
  }
}

TEST_CASE("formats::open reads a Hugging Face directory with its token ids") {
  const TempDir dir;
  const model::TensorWeights w = tpcli::testing::random_weights(small_config(), 3);
  const std::string path = (dir.path() / "hf").string();
  formats::write_hf_model(path, w, {.dtype = model::DType::F32, .bos_token_id = 5, .eos_token_ids = {7, 9}});
  const formats::OpenedModel opened = formats::open(path);
  REQUIRE(opened.weights);
  CHECK(dynamic_cast<const formats::HfModelDir*>(opened.weights.get()));
  CHECK(opened.weights->config().dim == 16);
  CHECK(opened.weights->config().n_layers == 2);
  CHECK(opened.hf_dir == path);
  CHECK(opened.bos_token_id == 5);
  CHECK(opened.eos_token_ids == std::vector<int>{7, 9});
  CHECK(!opened.tokenizer);
}

TEST_CASE("formats::open: what is no model is a runtime_error naming the file") {
  const TempDir dir;
  // A safetensors file without a model config.
  const std::string bare = (dir.path() / "bare.safetensors").string();
  const std::vector<float> x = {1, 2, 3};
  formats::write_safetensors(bare, {{"x", {3}, x}}, {});
  CHECK_THROWS_AS(formats::open(bare), std::runtime_error);
  // A FIFO is not peeked at (that would block).
  const std::string fifo = (dir.path() / "pipe").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH(formats::open(fifo), Catch::Contains(fifo));
  // Missing, and a folder without a config.json.
  CHECK_THROWS_AS(formats::open((dir.path() / "missing.bin").string()), std::runtime_error);
  fs::create_directories(dir.path() / "empty");
  CHECK_THROWS_AS(formats::open((dir.path() / "empty").string()), std::runtime_error);
}

// tpcli init and tpcli bench decode through the binary: files that load with the shape of the
// models/*.toml they came from, deterministic in the seed; the bench's report lines.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "formats/llama2c.h"
#include "formats/safetensors.h"

using namespace tpcli::model;
using namespace tpcli::formats;

namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("tpcli_test_init_" + std::to_string(::getpid()) + "_" + name)).string();
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

int run_tpcli(const std::string& args, std::string* out = nullptr) {
  const std::string o = temp_path("stdout");
  const int status = std::system((std::string(TPCLI_BINARY) + " " + args + " >" + o + " 2>/dev/null").c_str());
  if (out) *out = read_bytes(o);
  std::filesystem::remove(o);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST_CASE("tpcli init writes the models/*.toml shape, deterministic in the seed", "[init][cli]") {
  const std::string model = std::string(TPCLI_SOURCE_DIR) + "/models/stories260K.toml";
  const std::string a = temp_path("a.bin"), b = temp_path("b.bin"), c = temp_path("c.bin"), st = temp_path("d.safetensors");
  REQUIRE(run_tpcli("init --model-config " + model + " --out " + a + " --seed 7") == 0);
  REQUIRE(run_tpcli("init --model-config " + model + " --out " + b + " --seed 7") == 0);
  REQUIRE(run_tpcli("init --model-config " + model + " --out " + c + " --seed 8") == 0);
  REQUIRE(run_tpcli("init --model-config " + model + " --out " + st + " --seed 7") == 0);
  Llama2cFile file(a);
  CHECK(file.config().dim == 64);
  CHECK(file.config().hidden_dim == 172);
  CHECK(file.config().n_layers == 5);
  CHECK(file.config().n_heads == 8);
  CHECK(file.config().n_kv_heads == 4);
  CHECK(file.config().vocab_size == 512);
  CHECK(file.config().seq_len == 512);
  CHECK(read_bytes(a) == read_bytes(b));
  CHECK(read_bytes(a) != read_bytes(c));
  CHECK(file.get("norm")[0] == 1.0f);
  // Same weights in both formats.
  SafetensorsFile s(st);
  for (const auto& p : llama_parameters(file.config())) {
    INFO(p.name);
    auto x = file.get(p.name), y = s.get(p.name);
    REQUIRE(x.size() == y.size());
    CHECK(std::equal(x.begin(), x.end(), y.begin()));
  }
  // init.seed recorded; a missing vocab_size is a usage error.
  CHECK(s.metadata().at("init.seed") == "7");
  CHECK(run_tpcli("init --model-config " + std::string(TPCLI_SOURCE_DIR) + "/models/tiny.toml --out " + a) == 2);
  for (const auto& p : {a, b, c, st}) std::filesystem::remove(p);
}

TEST_CASE("tpcli init keeps a model file's keys beyond the Llama block, llama2.c files refuse them", "[init][cli]") {
  const std::string model = temp_path("qwen.toml"), st = temp_path("qwen.safetensors"), bin = temp_path("qwen.bin");
  std::ofstream(model) << "dim = 64\nhidden_dim = 96\nn_layers = 3\nn_heads = 4\nn_kv_heads = 2\nvocab_size = 65\n"
                          "seq_len = 32\nhead_dim = 32\nqkv_bias = true\nqk_norm = true\nn_experts = 4\ntop_k = 2\n"
                          "expert_hidden_dim = 16\nnorm_topk_prob = false\ndense_layers = [1]\n"
                          "hf_architecture = \"Qwen3MoeForCausalLM\"\n";
  REQUIRE(run_tpcli("init --model-config " + model + " --out " + st) == 0);
  const LlamaConfig c = SafetensorsFile(st).config();
  CHECK(c.head_dim == 32);
  CHECK(c.qkv_bias);
  CHECK(c.qk_norm);
  CHECK_FALSE(c.norm_topk_prob);
  CHECK(c.dense_layers == std::vector<int>{1});
  CHECK(c.hf_architecture == "Qwen3MoeForCausalLM");
  CHECK(run_tpcli("init --model-config " + model + " --out " + bin) == 2);
  for (const auto& p : {model, st, bin}) std::filesystem::remove(p);
}

TEST_CASE("tpcli bench decode reports tokens/s next to the roofline", "[bench][cli]") {
  const std::string model = std::string(TPCLI_SOURCE_DIR) + "/models/stories260K.toml";
  const std::string path = temp_path("bench.bin");
  REQUIRE(run_tpcli("init --model-config " + model + " --out " + path) == 0);
  std::string out;
  REQUIRE(run_tpcli("bench decode --model " + path + " --devices 3 --tokens 4 --warmup 1 --bandwidth-mb 16 --formats f32,bf16",
                    &out) == 0);
  INFO(out);
  CHECK(out.find("bandwidth") != std::string::npos);
  CHECK(out.find("roofline") != std::string::npos);
  CHECK(out.find("\nas stored ") != std::string::npos);  // the f32 file in its own format
  CHECK(out.find("\nbf16 ") != std::string::npos);
  CHECK(out.find("device 2") != std::string::npos);
  CHECK(out.find("  predicted: matmul 0.0 us + memory ") != std::string::npos);  // each row's parts
  // the quantized rows (on 3 devices wo's groups of 32 would be cut: one device here)
  REQUIRE(run_tpcli("bench decode --model " + path + " --tokens 2 --warmup 1 --bandwidth-mb 16 --formats 8,4,mxfp8 "
                    "--group-size 32", &out) == 0);
  CHECK(out.find("affine 8-bit g32") != std::string::npos);
  CHECK(out.find("affine 4-bit g32") != std::string::npos);
  CHECK(out.find("mxfp8") != std::string::npos);
  CHECK(out.find("  predicted: matmul 0.0 us + memory ") != std::string::npos);  // the matrices at their kernels' rates
  CHECK(run_tpcli("bench decode --model " + path + " --devices 9 --tokens 4") == 2);
  std::filesystem::remove(path);
}

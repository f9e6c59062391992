// llama2.c checkpoints: the loader against the file's own bytes (read with plain offsets from the
// llama2.c layout), the writer against llama2.c's file (byte for byte outside the RoPE tables).
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "formats/llama2c.h"
#include "model/random_init.h"
#include "reference_files.h"

using namespace tpcli::model;
using namespace tpcli::testing;
using namespace tpcli::formats;

namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("tpcli_test_l2c_" + std::to_string(::getpid()) + "_" + name)).string();
}

float float_at(const std::string& bytes, size_t float_index) {
  float v;
  std::memcpy(&v, bytes.data() + 28 + float_index * 4, 4);
  return v;
}

}  // namespace

TEST_CASE("llama2c: stories260K header, shapes and values at llama2.c's offsets", "[llama2c]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  const std::string path = shared_path("data/stories260K.bin");
  Llama2cFile file(path);
  const LlamaConfig& c = file.config();
  CHECK(c.dim == 64);
  CHECK(c.hidden_dim == 172);
  CHECK(c.n_layers == 5);
  CHECK(c.n_heads == 8);
  CHECK(c.n_kv_heads == 4);
  CHECK(c.vocab_size == 512);
  CHECK(c.seq_len == 512);
  CHECK(c.shared_classifier);

  // Offsets (in floats after the header) written out from run.c's memory_map_weights.
  const std::string bytes = read_bytes(path);
  const size_t C = 64, F = 172, L = 5, V = 512, KV = 32, HS = 8, S = 512;
  const size_t emb = 0, att_norm = emb + V * C, wq = att_norm + L * C, wk = wq + L * C * C, wv = wk + L * KV * C,
               wo = wv + L * KV * C, ffn_norm = wo + L * C * C, w1 = ffn_norm + L * C, w2 = w1 + L * F * C,
               w3 = w2 + L * C * F, norm = w3 + L * F * C, rope = norm + C, end = rope + S * HS;
  CHECK(bytes.size() == 28 + end * 4);
  auto check = [&](const std::string& name, size_t offset, size_t count) {
    INFO(name);
    auto span = file.get(name);
    REQUIRE(span.size() == count);
    CHECK(span[0] == float_at(bytes, offset));
    CHECK(span[count - 1] == float_at(bytes, offset + count - 1));
    CHECK(std::memcmp(span.data(), bytes.data() + 28 + offset * 4, count * 4) == 0);
  };
  check("tok_embeddings", emb, V * C);
  check("layers.0.attention_norm", att_norm, C);
  check("layers.4.attention_norm", att_norm + 4 * C, C);
  check("layers.2.wq", wq + 2 * C * C, C * C);
  check("layers.3.wk", wk + 3 * KV * C, KV * C);
  check("layers.4.wv", wv + 4 * KV * C, KV * C);
  check("layers.1.wo", wo + 1 * C * C, C * C);
  check("layers.0.ffn_norm", ffn_norm, C);
  check("layers.4.w1", w1 + 4 * F * C, F * C);
  check("layers.2.w2", w2 + 2 * C * F, C * F);
  check("layers.3.w3", w3 + 3 * F * C, F * C);
  check("norm", norm, C);
  // Shared classifier: "output" is the embedding.
  CHECK(file.get("output").data() == file.get("tok_embeddings").data());
  CHECK_THROWS_AS(file.get("layers.5.wq"), std::out_of_range);
}

TEST_CASE("llama2c: writing stories260K back reproduces llama2.c's file", "[llama2c]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  const std::string path = shared_path("data/stories260K.bin");
  Llama2cFile file(path);
  const std::string out = temp_path("copy.bin");
  write_llama2c(out, file);
  const std::string a = read_bytes(path), b = read_bytes(out);
  REQUIRE(a.size() == b.size());
  const size_t rope_begin = 28 + (llama2c_file_size(file.config()) - 28 - 2 * 512 * 4 * 4);
  CHECK(std::memcmp(a.data(), b.data(), rope_begin) == 0);
  // RoPE tables: llama2.c's export computes them in float32 (torch); ours in double, rounded.
  double max_diff = 0;
  for (size_t off = rope_begin; off < a.size(); off += 4) {
    float x, y;
    std::memcpy(&x, a.data() + off, 4);
    std::memcpy(&y, b.data() + off, 4);
    max_diff = std::max(max_diff, static_cast<double>(std::abs(x - y)));
  }
  CHECK(max_diff < 1e-4);
  CHECK_FALSE(std::filesystem::exists(out + ".tmp"));
  std::filesystem::remove(out);
}

TEST_CASE("llama2c: unshared classifier round trip (negative vocab_size)", "[llama2c]") {
  LlamaConfig c{.dim = 16, .hidden_dim = 40, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .vocab_size = 37,
      .seq_len = 8, .shared_classifier = false};
  const TensorWeights w = random_weights(c, 7);
  const std::string out = temp_path("unshared.bin");
  write_llama2c(out, w);
  const std::string bytes = read_bytes(out);
  int32_t header[7];
  std::memcpy(header, bytes.data(), 28);
  CHECK(header[5] == -37);
  CHECK(bytes.size() == llama2c_file_size(c));
  // The classifier is the file's last V x C floats, after the RoPE tables.
  CHECK(std::memcmp(bytes.data() + bytes.size() - 37 * 16 * 4, w.get("output").data(), 37 * 16 * 4) == 0);

  Llama2cFile back(out);
  CHECK_FALSE(back.config().shared_classifier);
  CHECK(back.config().vocab_size == 37);
  for (const auto& p : llama_parameters(c)) {
    INFO(p.name);
    auto x = w.get(p.name), y = back.get(p.name);
    REQUIRE(x.size() == y.size());
    CHECK(std::memcmp(x.data(), y.data(), x.size_bytes()) == 0);
  }
  CHECK(back.get("output").data() != back.get("tok_embeddings").data());
  std::filesystem::remove(out);
}

TEST_CASE("llama2c: the writer refuses what the format cannot hold", "[llama2c]") {
  LlamaConfig c{.dim = 8, .hidden_dim = 8, .n_layers = 1, .n_heads = 2, .n_kv_heads = 2, .vocab_size = 5,
      .seq_len = 4, .n_experts = 2, .top_k = 1};
  CHECK_THROWS_WITH(write_llama2c(temp_path("moe.bin"), random_weights(c, 1)), Catch::Contains("mixture-of-experts"));
  c.n_experts = 0;
  c.top_k = 0;
  c.rope_theta = 500000.0f;
  CHECK_THROWS_WITH(write_llama2c(temp_path("theta.bin"), random_weights(c, 1)), Catch::Contains("rope_theta"));
}

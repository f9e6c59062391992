// formats/gguf_writer.h: models written as GGUF and read back with tpcli's own reader
// (formats/gguf_file.h, gguf_model.h): every metadata key and tensor as written, every parameter
// as the source held it (f32) or as ggml's rule rounds it, and the logits of the written f32 file
// equal to the source model's bit for bit on 1 and 2 devices. Q8_0 blocks against a transcription
// of ggml's quantize_row_q8_0_ref written here. llama.cpp itself reads these files in
// tests/cli/test_gguf_export_cli.cpp and tests/cli/llama_cpp_gguf.sh.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "distributed/runtime.h"
#include "formats/gguf_model.h"
#include "formats/gguf_writer.h"
#include "formats/open_model.h"
#include "model/llama.h"
#include "model/llama_config.h"
#include "random_model.h"
#include "support/shared_data.h"
#include "support/temp_dir.h"
#include "tensor/ggml_blocks.h"

using namespace tpcli;
using tensor::GgmlType;
using tpcli::testing::shared_path;

namespace {

// ggml-quants.c's quantize_row_q8_0_ref, block by block, with the compiler's own IEEE half
// conversion (_Float16, round to nearest even) for d.
std::vector<uint8_t> q8_0_reference(const std::vector<float>& x) {
  std::vector<uint8_t> out;
  for (size_t b = 0; b < x.size() / 32; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const float d = amax / 127;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    const _Float16 h = static_cast<_Float16>(d);
    uint8_t bytes[2];
    std::memcpy(bytes, &h, 2);
    out.insert(out.end(), bytes, bytes + 2);
    for (int j = 0; j < 32; ++j) out.push_back(static_cast<uint8_t>(static_cast<int8_t>(std::roundf(x[b * 32 + j] * id))));
  }
  return out;
}

// bfloat16 by its definition: the nearer of the two bf16 neighbours (f32s with 16 zero low bits),
// the even one on a tie.
uint16_t bf16_reference(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t down = u & 0xFFFF0000u, up = down + 0x10000u;
  const double dx = x, dd = std::bit_cast<float>(down), du = std::isinf(std::bit_cast<float>(up)) ? dd + 2 * (dx - dd) + 1 : std::bit_cast<float>(up);
  const double below = std::fabs(dx - dd), above = std::fabs(du - dx);
  if (below < above || (below == above && ((down >> 16) & 1) == 0)) return static_cast<uint16_t>(down >> 16);
  return static_cast<uint16_t>(up >> 16);
}

std::vector<uint8_t> quantized(GgmlType type, const std::vector<float>& x) {
  const tensor::GgmlTypeTraits& t = tensor::ggml_traits(type);
  std::vector<uint8_t> out(x.size() / static_cast<size_t>(t.block_elements) * static_cast<size_t>(t.block_bytes));
  tensor::quantize_row(type, x.data(), reinterpret_cast<std::byte*>(out.data()), static_cast<int64_t>(x.size()));
  return out;
}

bool same_value(const formats::gguf::Value& a, const formats::gguf::Value& b) {
  return a.type == b.type && (a.type != formats::gguf::ValueType::array || a.element_type == b.element_type) && a.items == b.items;
}

// The model at `path` written as GGUF in `type` under `dir`, then checked against what the writer
// meant to write: every key, every tensor's shape, type and bytes.
std::string write_and_check_container(const model::WeightSource& source, GgmlType type, const testing::TempDir& dir, const std::string& name) {
  formats::GgufExportOptions options;
  options.type = type;
  options.name = name;
  const formats::gguf::GgufWriter writer = formats::gguf_model_writer(source, options);
  const std::string path = (dir.path() / (name + ".gguf")).string();
  formats::write_gguf_model(path, source, options);
  const formats::gguf::GgufFile file(path);
  CHECK(file.version() == 3);
  CHECK(file.alignment() == 32);
  REQUIRE(file.metadata().size() == writer.metadata().size());
  for (size_t i = 0; i < writer.metadata().size(); ++i) {
    INFO(name << ": key " << writer.metadata()[i].first);
    CHECK(file.metadata()[i].first == writer.metadata()[i].first);
    CHECK(same_value(file.metadata()[i].second, writer.metadata()[i].second));
  }
  REQUIRE(file.tensors().size() == writer.tensors().size());
  for (const formats::gguf::TensorToWrite& t : writer.tensors()) {
    INFO(name << ": tensor " << t.name);
    const formats::gguf::TensorInfo* got = file.tensor(t.name);
    REQUIRE(got);
    CHECK(got->ne == t.ne);
    CHECK(got->type == t.type);
    CHECK(got->offset % 32 == 0);
    if (t.ne.size() == 1) CHECK(got->type == GgmlType::F32);
    const std::vector<uint8_t> want = quantized(t.type, t.values());
    REQUIRE(got->data.size() == want.size());
    CHECK(std::memcmp(got->data.data(), want.data(), want.size()) == 0);
  }
  return path;
}

std::vector<float> logits_on(const model::WeightSource& w, int devices, const std::vector<int>& tokens) {
  std::vector<float> got;
  dist::run_on_mesh(dist::Mesh::line(devices), [&](dist::Device& dev) {
    std::vector<float> logits = model::Llama(w, dev.axis("model"), dev.axis("expert")).prefill_logits(tokens, 0);
    if (dev.rank() == 0) got = std::move(logits);
  });
  return got;
}

std::vector<int> some_tokens(int vocab) {
  std::mt19937 rng(7);
  std::vector<int> t{1};
  for (int i = 0; i < 11; ++i) t.push_back(static_cast<int>(rng() % static_cast<unsigned>(vocab)));
  return t;
}

struct Case {
  std::string name, path;
};

std::vector<Case> export_cases() {
  return {{"stories260K", shared_path("data/stories260K.bin")},
          {"mixtral", shared_path("reference/hf-archs/mixtral")},
          {"qwen2", shared_path("reference/hf-archs/qwen2")},
          {"phi3", shared_path("reference/hf-archs/phi3")}};
}

float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

}  // namespace

TEST_CASE("gguf writer: Q8_0 blocks are ggml's reference rule, with zero blocks and extreme scales", "[gguf]") {
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> x;
  for (float scale : {1.0f, 0.0f, 1e-3f, 1e-30f, 6e4f, 1e7f, 3e38f, 1e-45f}) {  // 0: a zero block; 1e7 gives d beyond F16 (inf)
    for (int j = 0; j < 32; ++j) x.push_back(scale * normal(rng));
  }
  for (int j = 0; j < 32; ++j) x.push_back(j % 2 ? 127.0f : -63.5f);  // exact halves: roundf rounds away from zero
  const std::vector<uint8_t> got = quantized(GgmlType::Q8_0, x), want = q8_0_reference(x);
  REQUIRE(got.size() == 34 * x.size() / 32);
  for (size_t b = 0; b < got.size() / 34; ++b) {
    INFO("block " << b);
    CHECK(std::vector<uint8_t>(got.begin() + 34 * b, got.begin() + 34 * (b + 1)) == std::vector<uint8_t>(want.begin() + 34 * b, want.begin() + 34 * (b + 1)));
  }
  // Dequantized, a Q8_0 block is within d/2 of each value it quantized (d = max|x| / 127).
  std::vector<float> back(x.size());
  tensor::dequantize_row(GgmlType::Q8_0, reinterpret_cast<const std::byte*>(got.data()), back.data(), 32);
  for (int j = 0; j < 32; ++j) CHECK(std::fabs(back[j] - x[j]) <= max_abs({x.begin(), x.begin() + 32}) / 127 * 0.5f * 1.01f);
  CHECK_THROWS_WITH(quantized(GgmlType::Q8_0, std::vector<float>(40, 1.0f)), Catch::Contains("40 values is no whole number of Q8_0 blocks"));
}

TEST_CASE("gguf writer: F16 and BF16 round to nearest even, a NaN stays a NaN", "[gguf]") {
  std::mt19937 rng(3);
  std::vector<float> x;
  std::uniform_int_distribution<uint32_t> bits;
  while (x.size() < 20000) {
    const float v = std::bit_cast<float>(bits(rng));
    if (std::isfinite(v)) x.push_back(v);
  }
  std::normal_distribution<float> normal(0, 1);
  for (int i = 0; i < 20000; ++i) x.push_back(normal(rng));
  for (float v : {65504.0f, 65519.99f, 65520.0f, 6.1e-5f, 5.96e-8f, 2.98e-8f, 2.99e-8f, 1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048}) x.push_back(v);
  const std::vector<uint8_t> f16 = quantized(GgmlType::F16, x), bf16 = quantized(GgmlType::BF16, x);
  for (size_t i = 0; i < x.size(); ++i) {
    INFO("value " << x[i]);
    const _Float16 h = static_cast<_Float16>(x[i]);
    uint16_t want_f16, got_f16, got_bf16;
    std::memcpy(&want_f16, &h, 2);
    std::memcpy(&got_f16, f16.data() + 2 * i, 2);
    std::memcpy(&got_bf16, bf16.data() + 2 * i, 2);
    CHECK(got_f16 == want_f16);
    CHECK(got_bf16 == bf16_reference(x[i]));
  }
  const std::vector<uint8_t> nan = quantized(GgmlType::BF16, {std::bit_cast<float>(0x7F800001u)});
  uint16_t nan_bits;
  std::memcpy(&nan_bits, nan.data(), 2);
  CHECK(nan_bits == 0x7FC0);  // ggml: the top half with the quiet bit set (rounding would give inf)
}

TEST_CASE("gguf writer: each architecture written in f32 reads back as written, its logits exact on 1 and 2 devices", "[gguf]") {
  TPCLI_REQUIRE_SHARED("reference/hf-archs/phi3/config.json");
  const testing::TempDir dir;
  for (const Case& c : export_cases()) {
    const formats::OpenedModel source = formats::open(c.path);
    const std::string path = write_and_check_container(*source.weights, GgmlType::F32, dir, c.name);
    const formats::GgufModel back(path);
    const model::LlamaConfig &want = source.weights->config(), &got = back.config();
    INFO(c.name << " as " << back.architecture());
    CHECK(got.dim == want.dim);
    CHECK(got.hidden_dim == want.hidden_dim);
    CHECK(got.n_layers == want.n_layers);
    CHECK(got.n_heads == want.n_heads);
    CHECK(got.n_kv_heads == want.n_kv_heads);
    CHECK(got.head_size() == want.head_size());
    CHECK(got.vocab_size == want.vocab_size);
    CHECK(got.seq_len == want.seq_len);
    CHECK(got.norm_eps == want.norm_eps);
    CHECK(got.rope_theta == want.rope_theta);
    CHECK(got.n_experts == want.n_experts);
    CHECK(got.top_k == want.top_k);
    CHECK(got.qkv_bias == want.qkv_bias);
    // Phi-3's llama.cpp needs output.weight: a tied model gets a copy of the embedding.
    CHECK(got.shared_classifier == (want.shared_classifier && back.architecture() != "phi3"));
    for (const model::ParamSpec& p : model::llama_parameters(want)) {
      const std::span<const float> a = source.weights->get(p.name), b = back.get(p.name);
      INFO(p.name);
      REQUIRE(a.size() == b.size());
      CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    }
    const std::vector<int> tokens = some_tokens(want.vocab_size);
    for (int devices : {1, 2}) {
      INFO(devices << " devices");
      CHECK(logits_on(back, devices, tokens) == logits_on(*source.weights, devices, tokens));
    }
  }
}

TEST_CASE("gguf writer: heads wider than dim / heads and an untied classifier read back exactly", "[gguf]") {
  model::LlamaConfig c = testing::make_config(64, 4, 2, 96, 2, 40, false);
  c.head_dim = 24;  // llama.cpp takes dim / heads = 16 unless attention.key_length says otherwise
  const model::TensorWeights source = testing::random_weights(c, 11);
  const testing::TempDir dir;
  const std::string path = write_and_check_container(source, GgmlType::F32, dir, "wide-heads");
  const formats::gguf::GgufFile file(path);
  CHECK(file.integer("llama.attention.key_length") == 24);
  CHECK(file.integer("llama.attention.value_length") == 24);
  CHECK(file.tensor("output.weight") != nullptr);
  const formats::GgufModel back(path);
  CHECK(back.config().head_size() == 24);
  CHECK(!back.config().shared_classifier);
  const std::vector<int> tokens = some_tokens(c.vocab_size);
  for (int devices : {1, 2}) CHECK(logits_on(back, devices, tokens) == logits_on(source, devices, tokens));
}

TEST_CASE("gguf writer: f16, bf16 and q8_0 files hold ggml's rounding of every weight, logits within the format's error", "[gguf]") {
  TPCLI_REQUIRE_SHARED("reference/hf-archs/qwen2/config.json");
  const testing::TempDir dir;
  // The weights themselves are checked exactly (write_and_check_container: ggml's rounding of
  // each value; below, byte for byte against llama.cpp's own files). The logits only guard against
  // a gross error. Tolerances, as a share of the position's largest |logit|: a weight's error is
  // at most 2^-11 of it in F16 and 2^-8 in BF16, but up to max|block| / 254 in Q8_0, which for the
  // small values of a block is far more than their own 2^-8; the errors of every weight of a few
  // layers add up (in random models with small logits, to a few percent), so each bound is ten
  // to thirty times the per-weight error.
  const std::vector<std::pair<GgmlType, float>> types = {{GgmlType::F16, 0.005f}, {GgmlType::BF16, 0.05f}, {GgmlType::Q8_0, 0.12f}};
  for (const Case& c : export_cases()) {
    const formats::OpenedModel source = formats::open(c.path);
    const std::vector<int> tokens = some_tokens(source.weights->config().vocab_size);
    const std::vector<float> reference = logits_on(*source.weights, 1, tokens);
    const size_t V = static_cast<size_t>(source.weights->config().vocab_size);
    for (const auto& [type, tolerance] : types) {
      const std::string name = c.name + "-" + tensor::ggml_traits(type).name;
      const formats::GgufModel back(write_and_check_container(*source.weights, type, dir, name));
      const std::vector<float> got = logits_on(back, 2, tokens);
      REQUIRE(got.size() == reference.size());
      float worst = 0;
      for (size_t p = 0; p < tokens.size(); ++p) {
        const std::vector<float> row(reference.begin() + p * V, reference.begin() + (p + 1) * V);
        for (size_t v = 0; v < V; ++v) worst = std::max(worst, std::fabs(got[p * V + v] - row[v]) / max_abs(row));
      }
      INFO(name << ": largest difference " << worst << " of the position's largest |logit|");
      CHECK(worst <= tolerance);
    }
  }
}

// llama.cpp's files of the same weights (reference/gguf: llama-quantize's F16 of stories260K,
// its Q8_0 of the hf-archs models) hold exactly the bytes tpcli writes, tensor by tensor.
TEST_CASE("gguf writer: f16 and q8_0 tensors are byte for byte those llama.cpp's llama-quantize wrote", "[gguf]") {
  TPCLI_REQUIRE_SHARED("reference/gguf/hf-qwen2-q8_0.gguf");
  const testing::TempDir dir;
  const std::vector<std::tuple<std::string, std::string, GgmlType>> cases = {
      {"data/stories260K.bin", "stories260K-f16", GgmlType::F16},
      {"reference/hf-archs/mixtral", "hf-mixtral-q8_0", GgmlType::Q8_0},
      {"reference/hf-archs/qwen2", "hf-qwen2-q8_0", GgmlType::Q8_0},
      {"reference/hf-archs/phi3", "hf-phi3-q8_0", GgmlType::Q8_0}};
  for (const auto& [model_path, reference, type] : cases) {
    const formats::OpenedModel source = formats::open(shared_path(model_path));
    formats::GgufExportOptions options;
    options.type = type;
    const std::string path = (dir.path() / (reference + ".gguf")).string();
    formats::write_gguf_model(path, *source.weights, options);
    const formats::gguf::GgufFile ours(path), theirs(shared_path("reference/gguf/" + reference + ".gguf"));
    int compared = 0;
    for (const formats::gguf::TensorInfo& t : ours.tensors()) {
      INFO(reference << ": " << t.name);
      const formats::gguf::TensorInfo* want = theirs.tensor(t.name);
      REQUIRE(want);
      CHECK(t.ne == want->ne);
      CHECK(tensor::ggml_traits(t.type).name == std::string(tensor::ggml_traits(want->type).name));
      REQUIRE(t.data.size() == want->data.size());
      CHECK(std::memcmp(t.data.data(), want->data.data(), t.data.size()) == 0);
      ++compared;
    }
    CHECK(compared == static_cast<int>(ours.tensors().size()));
  }
}

TEST_CASE("gguf writer: what GGUF cannot hold is a one-line error naming it", "[gguf]") {
  TPCLI_REQUIRE_SHARED("reference/hf-archs/qwen3/config.json");
  const formats::OpenedModel qwen3 = formats::open(shared_path("reference/hf-archs/qwen3"));
  CHECK_THROWS_WITH(formats::gguf_model_writer(*qwen3.weights, {}), Catch::Contains("cannot be written as GGUF"));
  const formats::OpenedModel stories = formats::open(shared_path("data/stories260K.bin"));
  formats::GgufExportOptions options;
  options.vocabulary = formats::GgufVocabulary{.model = "llama", .tokens = {"a"}, .token_types = {1}};
  CHECK_THROWS_WITH(formats::gguf_model_writer(*stories.weights, options), Catch::Contains("the tokenizer has 1 tokens, the model's embedding 512 rows"));
  const testing::TempDir dir;
  const std::string path = (dir.path() / "no.gguf").string();
  options.type = GgmlType::Q4_K;
  options.vocabulary.reset();
  CHECK_THROWS_WITH(formats::write_gguf_model(path, *stories.weights, options), Catch::Contains("Q4_K"));
  CHECK(!std::filesystem::exists(path));
}

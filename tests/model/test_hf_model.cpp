// Hugging Face model directories: the RoPE row order against rotate_half itself, stories260K
// exported and read back (f32 exact, f16/bf16 rounded, sharded), the model from the directory
// against llama2.c's reference outputs on 1..8 devices, MLX-quantized directories, bad directories.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "distributed/runtime.h"
#include "engine/generate.h"
#include "formats/dtype.h"
#include "formats/hf_model.h"
#include "formats/llama2c.h"
#include "model/llama.h"
#include "model/random_init.h"
#include "model/weights_view.h"
#include "nn/rope.h"
#include "reference_files.h"
#include "reference_forward.h"
#include "support/mlx_quantized_dir.h"
#include "support/normal_values.h"
#include "support/temp_dir.h"
#include "text/tokenizer.h"

using namespace tpcli::model;
using namespace tpcli::testing;
using namespace tpcli::engine;
using namespace tpcli::formats;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// y[rows] = W[rows, cols] x[cols]
std::vector<float> matvec(const std::vector<float>& w, const std::vector<float>& x, int rows, int cols) {
  std::vector<float> y(static_cast<size_t>(rows), 0.0f);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) y[size_t(r)] += w[size_t(r * cols + c)] * x[size_t(c)];
  return y;
}

std::vector<float> values_of(const WeightSource& w, const std::string& name) {
  auto s = w.get(name);
  return {s.begin(), s.end()};
}

json read_json(const fs::path& path) {
  std::ifstream in(path);
  return json::parse(in);
}

void write_json(const fs::path& path, const json& j) { std::ofstream(path) << j.dump(2); }

// The message of the runtime_error that opening `dir` throws ("" when it opens).
std::string open_error(const fs::path& dir) {
  try {
    HfModelDir d(dir.string());
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

void check_one_line_naming(const std::string& msg, const std::string& file, const std::string& word) {
  INFO(msg);
  CHECK(msg.rfind(file + ":", 0) == 0);
  CHECK(msg.find('\n') == std::string::npos);
  CHECK(msg.find(word) != std::string::npos);
}

}  // namespace

TEST_CASE("hf: the reordered q rows under tpcli's interleaved RoPE equal Hugging Face's rotate_half", "[hf]") {
  const int heads = 3, HS = 8, cols = 5, half = HS / 2, pos = 7;
  const float theta = 10000.0f;
  const std::vector<float> w_hf = normal_values(size_t(heads * HS * cols), 1), x = normal_values(size_t(cols), 2);
  std::vector<float> w_tp(w_hf.size()), back(w_hf.size());
  rope_rows_from_hf(reinterpret_cast<std::byte*>(w_tp.data()), reinterpret_cast<const std::byte*>(w_hf.data()), heads, HS,
                    cols * sizeof(float));
  rope_rows_to_hf(reinterpret_cast<std::byte*>(back.data()), reinterpret_cast<const std::byte*>(w_tp.data()), heads, HS,
                  cols * sizeof(float));
  CHECK(back == w_hf);
  CHECK(w_tp != w_hf);

  // Hugging Face: q = W_hf x, then q * cos + rotate_half(q) * sin with cos/sin repeated over both halves.
  const std::vector<float> q_hf = matvec(w_hf, x, heads * HS, cols);
  std::vector<float> rotated_hf(q_hf.size());
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < half; ++i) {
      const double angle = pos / std::pow(double(theta), 2.0 * i / HS);
      const float a = q_hf[size_t(h * HS + i)], b = q_hf[size_t(h * HS + half + i)];
      rotated_hf[size_t(h * HS + i)] = float(a * std::cos(angle) - b * std::sin(angle));
      rotated_hf[size_t(h * HS + half + i)] = float(b * std::cos(angle) + a * std::sin(angle));
    }
  // tpcli: q = W_tp x, then pairs (2i, 2i+1) rotated.
  std::vector<float> q_tp = matvec(w_tp, x, heads * HS, cols);
  tpcli::nn::RopeTable(16, HS, theta).forward(q_tp.data(), heads, pos);
  // Same values, each head's dimensions in the other order: attention scores (dot products within a
  // head of q and k, both reordered alike) are the same.
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < half; ++i)
      for (int j = 0; j < 2; ++j) {
        INFO("head " << h << " pair " << i << " half " << j);
        CHECK(q_tp[size_t(h * HS + 2 * i + j)] == Approx(rotated_hf[size_t(h * HS + j * half + i)]).margin(1e-5));
      }
}

TEST_CASE("hf: stories260K exported as f32, f16, bf16 and 2 shards reads back its weights", "[hf]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  const Llama2cFile bin(shared_path("data/stories260K.bin"));
  TempDir tmp;
  for (const DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    for (const int shards : {1, 2}) {
      INFO(dtype_name(dtype) << ", " << shards << " shards");
      const fs::path dir = tmp.path() / (std::string(dtype_name(dtype)) + "_" + std::to_string(shards));
      write_hf_model(dir.string(), bin, {.dtype = dtype, .shards = shards});
      CHECK(fs::exists(dir / "model.safetensors.index.json") == (shards > 1));
      CHECK(fs::exists(dir / "model-00002-of-00002.safetensors") == (shards == 2));
      const HfModelDir hf(dir.string());
      CHECK(hf.config().n_heads == 8);
      CHECK(hf.config().n_kv_heads == 4);
      CHECK(hf.config().shared_classifier);
      CHECK(hf.hf_config().bos_token_id == 1);
      CHECK(hf.hf_config().eos_token_ids == std::vector<int>{2});
      for (const auto& p : llama_parameters(bin.config())) {
        INFO(p.name);
        std::vector<float> expected = values_of(bin, p.name);
        std::vector<std::byte> rounded(expected.size() * dtype_bytes(dtype));  // the dtype's rounding of each value
        from_f32(rounded.data(), expected.data(), dtype, int64_t(expected.size()));
        to_f32(expected.data(), rounded.data(), dtype, int64_t(expected.size()));
        CHECK(values_of(hf, p.name) == expected);
        REQUIRE(hf.stored(p.name).has_value());
        CHECK(hf.stored(p.name)->dtype == dtype);
        CHECK(std::memcmp(hf.stored(p.name)->data, rounded.data(), rounded.size()) == 0);
      }
    }
  }
  // The file itself holds Hugging Face's names and row order.
  const json config = read_json(tmp.path() / "F32_1" / "config.json");
  CHECK(config["architectures"][0] == "LlamaForCausalLM");
  CHECK(config["num_key_value_heads"] == 4);
  CHECK(config["rms_norm_eps"] == 1e-5);
  const SafetensorsFile file((tmp.path() / "F32_1" / "model.safetensors").string());
  CHECK_FALSE(file.has("lm_head.weight"));
  const auto wk_hf = file.tensor("model.layers.0.self_attn.k_proj.weight").data;
  const auto wk_tp = bin.get("layers.0.wk");
  const int HS = bin.config().head_size(), C = bin.config().dim;
  for (int i = 0; i < HS / 2; ++i)  // head 1: tpcli row HS + 2i + 1 is Hugging Face's row HS + HS/2 + i
    CHECK(wk_hf[size_t((HS + HS / 2 + i) * C + 3)] == wk_tp[size_t((HS + 2 * i + 1) * C + 3)]);
}

namespace {

GenerateOptions golden_options(const RunCase& c) {
  GenerateOptions o;
  o.prompt = c.prompt;
  o.steps = c.steps;
  o.temperature = c.temperature;
  o.topp = c.topp;
  o.seed = c.seed ? c.seed : 1;
  return normalized(o, 512);
}

// Largest |a - b| over the first `positions` logits of two models fed the same tokens, on `devices`.
double max_logit_diff(const WeightSource& a, const WeightSource& b, const std::vector<int>& tokens, int devices) {
  std::vector<double> worst(size_t(devices), 1e9);
  tpcli::dist::run_on_mesh(tpcli::dist::Mesh::line(devices), [&](tpcli::dist::Device& dev) {
    Llama ma(a, dev.axis("model")), mb(b, dev.axis("model"));
    double m = 0;
    for (size_t pos = 0; pos < tokens.size(); ++pos) {
      const auto la = ma.forward(tokens[pos], int(pos));
      const std::vector<float> copy(la.begin(), la.end());
      const auto lb = mb.forward(tokens[pos], int(pos));
      for (size_t i = 0; i < copy.size(); ++i) m = std::max(m, std::abs(double(copy[i]) - lb[i]));
    }
    worst[size_t(dev.rank())] = m;
  });
  return *std::max_element(worst.begin(), worst.end());
}

// The first position of a teacher-forced run along `tokens` where `approx`'s logits could pick
// another token than `exact`'s: the top two logits of `exact` closer than twice the largest
// difference between the two models' logits there. Before it, greedy decoding must agree.
size_t first_ambiguous(const WeightSource& exact, const WeightSource& approx, const std::vector<int>& tokens) {
  ReferenceForward a(exact), b(approx);
  for (size_t pos = 0; pos + 1 < tokens.size(); ++pos) {
    const auto la = a.forward(tokens[pos], int(pos)), lb = b.forward(tokens[pos], int(pos));
    double err = 0;
    for (size_t v = 0; v < la.size(); ++v) err = std::max(err, std::abs(double(la[v]) - lb[v]));
    std::vector<float> sorted(la.begin(), la.end());
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    if (sorted[0] - sorted[1] <= 2 * err) return pos;
  }
  return tokens.size();
}

}  // namespace

// bf16 weights: logits within bf16's rounding of llama2.c's (8 bits of mantissa, relative 2^-9
// per weight; measured up to 0.12 on logits of magnitude ~10 along a golden run).
constexpr double BF16_LOGIT_TOLERANCE = 0.25;

TEST_CASE("hf: the exported stories260K generates llama2.c's output on 1..8 devices (f32 exact, bf16 greedy)", "[hf][golden]") {
  TPCLI_REQUIRE_SHARED("reference/llama2c_stories260K.tsv");
  const Llama2cFile bin(shared_path("data/stories260K.bin"));
  const tpcli::text::Tokenizer tok(shared_path("data/tok512.bin"), 512);
  TempDir tmp;
  write_hf_model((tmp.path() / "f32").string(), bin, {.dtype = DType::F32, .shards = 2});
  write_hf_model((tmp.path() / "bf16").string(), bin, {.dtype = DType::BF16});
  const HfModelDir f32((tmp.path() / "f32").string()), bf16((tmp.path() / "bf16").string());
  const auto cases = read_run_cases();
  REQUIRE(cases.size() >= 4);
  for (int devices = 1; devices <= 8; ++devices)
    for (const auto& c : cases) {
      INFO(devices << " devices, case " << c.name);
      const auto r = generate_on_mesh(f32, tok, tpcli::dist::Mesh::line(devices), golden_options(c), nullptr);
      CHECK(r.result.text == c.stdout_text);  // every case, sampled ones too: the same logits
      if (c.temperature != 0) continue;
      // bf16: llama2.c's greedy tokens wherever bf16's logit error cannot flip the choice. The
      // 256-position runs reach a near-tie at position 185 (top two f32 logits 0.004 apart).
      const size_t tie = first_ambiguous(bin, bf16, c.token_ids);
      INFO("first ambiguous position " << tie);
      CHECK(tie >= 32);
      const auto r16 = generate_on_mesh(bf16, tok, tpcli::dist::Mesh::line(devices), golden_options(c), nullptr);
      const long agreed = long(std::min(tie + 1, c.token_ids.size()));  // tokens 0..tie were chosen before it
      REQUIRE(long(r16.result.tokens.size()) >= agreed);
      CHECK(std::vector<int>(r16.result.tokens.begin(), r16.result.tokens.begin() + agreed) ==
            std::vector<int>(c.token_ids.begin(), c.token_ids.begin() + agreed));
    }
  const std::vector<int> tokens(cases[0].token_ids.begin(), cases[0].token_ids.begin() + 40);
  for (int devices : {1, 3, 8}) {
    INFO(devices << " devices");
    CHECK(max_logit_diff(bin, f32, tokens, devices) < 1e-4);
    CHECK(max_logit_diff(bin, bf16, tokens, devices) < BF16_LOGIT_TOLERANCE);
  }
}

namespace {

float bf16_value(float v) {
  uint16_t h;
  from_f32(&h, &v, DType::BF16, 1);
  float back;
  to_f32(&back, &h, DType::BF16, 1);
  return back;
}

}  // namespace

TEST_CASE("hf: an MLX-quantized directory maps onto tpcli names, row order and dequantization", "[hf][quant]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  const Llama2cFile bin(shared_path("data/stories260K.bin"));
  TempDir tmp;
  write_hf_model((tmp.path() / "float").string(), bin, {.dtype = DType::F32});
  const int bits = 4, group = 32;
  const auto rows_of = write_mlx_dir(tmp.path() / "float", tmp.path() / "mlx", bits, group);
  const HfModelDir mlx((tmp.path() / "mlx").string());
  REQUIRE(mlx.config().quantization.has_value());
  CHECK(mlx.config().quantization->bits == 4);
  CHECK(mlx.config().quantization->group_size == 32);
  CHECK(mlx.config().quantization->mode == "affine");
  const int C = bin.config().dim, HS = bin.config().head_size(), F = bin.config().hidden_dim;
  // Quantized: words, scales, biases under tpcli names; down_proj (172 inputs) stays BF16.
  REQUIRE(mlx.stored("layers.0.wq").has_value());
  CHECK(mlx.stored("layers.0.wq")->dtype == DType::U32);
  CHECK(mlx.stored("layers.0.wq")->shape == tpcli::tensor::Shape{C, C * bits / 32});
  CHECK(mlx.stored("layers.0.wq.scales")->dtype == DType::BF16);
  CHECK(mlx.stored("layers.0.wq.biases")->shape == tpcli::tensor::Shape{C, C / group});
  CHECK(mlx.stored("tok_embeddings")->dtype == DType::U32);
  CHECK(mlx.stored("output")->data == mlx.stored("tok_embeddings")->data);  // tied
  CHECK(mlx.stored("layers.0.w2")->dtype == DType::BF16);
  CHECK(mlx.stored("layers.0.w2")->shape == tpcli::tensor::Shape{C, F});
  CHECK_FALSE(mlx.stored("layers.0.w2.scales").has_value());

  // q/k rows (words, scales and biases alike) in tpcli's RoPE order; the dequantized weight is
  // q * scale + bias with the BF16 scales and biases, and close to the original weight.
  for (const auto& [name, module, heads] : {std::tuple{"layers.1.wk", "model.layers.1.self_attn.k_proj", 4},
                                            std::tuple{"layers.1.wv", "model.layers.1.self_attn.v_proj", 0}}) {
    INFO(name);
    const auto& rows = rows_of.at(std::string(module) + ".weight");
    const auto words = *mlx.stored(name), scales = *mlx.stored(std::string(name) + ".scales");
    const std::vector<float> w = values_of(mlx, name), original = values_of(bin, name);
    const int words_per_row = C * bits / 32;
    for (int r = 0; r < int(rows.size()); ++r) {
      const int h = r / HS, i = (r % HS) / 2, j = r % 2;
      const int hf_row = heads ? h * HS + j * (HS / 2) + i : r;
      const QuantizedRow& q = rows[size_t(hf_row)];
      CHECK(std::memcmp(static_cast<const uint32_t*>(words.data) + r * words_per_row, q.words.data(), 4 * size_t(words_per_row)) == 0);
      CHECK(static_cast<const uint16_t*>(scales.data)[r * (C / group)] == bf16_of({q.scales[0]})[0]);
      for (int c = 0; c < C; ++c) {
        const int g = c / group;
        const float expected = float(q.codes[size_t(c)]) * bf16_value(q.scales[size_t(g)]) + bf16_value(q.biases[size_t(g)]);
        REQUIRE(w[size_t(r * C + c)] == Approx(expected).margin(1e-6));
        // MLX's bound |w - w_hat| <= |scale|, loosened by the BF16 rounding of scale and bias.
        REQUIRE(std::abs(w[size_t(r * C + c)] - original[size_t(r * C + c)]) <= 1.1f * std::abs(q.scales[size_t(g)]) + 0.01f);
      }
    }
  }
  // The quantized model computes the same logits sharded as unsharded (here through get()'s f32).
  const std::vector<int> tokens{1, 403, 407, 261, 378, 500, 10, 7};
  CHECK(max_logit_diff(mlx, mlx, tokens, 1) == 0.0);
  std::vector<std::vector<float>> logits_by_devices;
  for (int devices : {1, 2, 4}) {
    std::vector<float> last;
    tpcli::dist::run_on_mesh(tpcli::dist::Mesh::line(devices), [&](tpcli::dist::Device& dev) {
      Llama m(mlx, dev.axis("model"));
      std::span<const float> l;
      for (size_t p = 0; p < tokens.size(); ++p) l = m.forward(tokens[p], int(p));
      if (dev.rank() == 0) last.assign(l.begin(), l.end());
    });
    logits_by_devices.push_back(last);
  }
  for (size_t k = 1; k < logits_by_devices.size(); ++k)
    for (size_t v = 0; v < logits_by_devices[0].size(); ++v)
      REQUIRE(logits_by_devices[k][v] == Approx(logits_by_devices[0][v]).margin(1e-4));
  // --dtype f32: the same weights, no longer presented as quantized.
  WeightsView f32(std::make_unique<HfModelDir>((tmp.path() / "mlx").string()));
  f32.as_f32();
  CHECK_FALSE(f32.config().quantization.has_value());
  CHECK_FALSE(f32.stored("layers.0.wq").has_value());
  CHECK(values_of(f32, "layers.0.wq") == values_of(mlx, "layers.0.wq"));
}

namespace {

// model.safetensors of `dir` rewritten without `drop` (and with `rename` tensors renamed).
void rewrite_without(const fs::path& dir, const std::string& drop) {
  const std::string path = (dir / "model.safetensors").string();
  std::vector<std::vector<float>> keep;
  std::vector<NamedTensor> out;
  {
    const SafetensorsFile in(path);
    for (const auto& name : in.names())
      if (name != drop) {
        keep.push_back(values_of(in, name));
        out.push_back({name, {DType::F32, in.stored(name)->shape, keep.back().data()}});
      }
  }
  write_stored_safetensors(path, out, {{"format", "pt"}});
}

}  // namespace

TEST_CASE("hf: bad directories are one-line errors naming the file", "[hf][corrupt]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  const Llama2cFile bin(shared_path("data/stories260K.bin"));
  TempDir tmp;
  const fs::path good = tmp.path() / "good", sharded = tmp.path() / "sharded";
  write_hf_model(good.string(), bin, {.dtype = DType::F32});
  write_hf_model(sharded.string(), bin, {.dtype = DType::F32, .shards = 2});
  REQUIRE(open_error(good).empty());
  int n = 0;
  auto copy = [&](const fs::path& from) {
    const fs::path to = tmp.path() / ("case" + std::to_string(n++));
    fs::copy(from, to, fs::copy_options::recursive);
    return to;
  };
  auto edit_config = [&](const fs::path& dir, const std::function<void(json&)>& edit) {
    json j = read_json(dir / "config.json");
    edit(j);
    write_json(dir / "config.json", j);
  };
  {
    const fs::path d = copy(good);
    fs::remove(d / "config.json");
    check_one_line_naming(open_error(d), (d / "config.json").string(), "missing");
  }
  {
    const fs::path d = copy(good);
    edit_config(d, [](json& j) { j["architectures"] = {"GPT2LMHeadModel"}; });
    check_one_line_naming(open_error(d), (d / "config.json").string(), "GPT2LMHeadModel");
  }
  {  // a Llama directory said to be Qwen2: Qwen2's q/k/v biases are missing
    const fs::path d = copy(good);
    edit_config(d, [](json& j) { j["architectures"] = {"Qwen2ForCausalLM"}; });
    check_one_line_naming(open_error(d), (d / "model.safetensors").string(), "model.layers.0.self_attn.q_proj.bias' is missing");
  }
  {
    const fs::path d = copy(good);
    edit_config(d, [](json& j) { j.erase("hidden_size"); });
    check_one_line_naming(open_error(d), (d / "config.json").string(), "hidden_size");
  }
  {
    const fs::path d = copy(good);
    edit_config(d, [](json& j) { j["num_key_value_heads"] = 3; });
    check_one_line_naming(open_error(d), (d / "config.json").string(), "n_kv_heads");
  }
  {
    const fs::path d = copy(good);
    edit_config(d, [](json& j) { j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}}; });
    check_one_line_naming(open_error(d), (d / "config.json").string(), "yarn");
  }
  {  // llama3 without its factors: transformers raises; tpcli ran with Llama 3.1's defaults
    const fs::path d = copy(good);
    edit_config(d, [](json& j) { j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}}; });
    check_one_line_naming(open_error(d), (d / "config.json").string(), "rope_scaling (rope_type \"llama3\"): key 'low_freq_factor' is missing");
  }
  {
    const fs::path d = copy(good);
    std::ofstream(d / "config.json") << "{\"architectures\": [";
    check_one_line_naming(open_error(d), (d / "config.json").string(), "JSON");
  }
  {
    const fs::path d = copy(good);
    rewrite_without(d, "model.layers.3.mlp.up_proj.weight");
    check_one_line_naming(open_error(d), (d / "model.safetensors").string(), "model.layers.3.mlp.up_proj.weight");
  }
  {
    const fs::path d = copy(good);
    edit_config(d, [](json& j) { j["intermediate_size"] = 160; });
    check_one_line_naming(open_error(d), (d / "model.safetensors").string(), "shape");
  }
  {
    const fs::path d = copy(good);
    fs::remove(d / "model.safetensors");
    check_one_line_naming(open_error(d), (d / "model.safetensors").string(), "missing");
  }
  {
    const fs::path d = copy(sharded);
    fs::remove(d / "model-00002-of-00002.safetensors");
    check_one_line_naming(open_error(d), (d / "model-00002-of-00002.safetensors").string(), "lists it");
  }
  {
    const fs::path d = copy(sharded);
    json index = read_json(d / "model.safetensors.index.json");
    index["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors";  // it sits in shard 2
    write_json(d / "model.safetensors.index.json", index);
    check_one_line_naming(open_error(d), (d / "model-00001-of-00002.safetensors").string(), "model.norm.weight");
  }
  // Writing over an existing model is refused before anything is written.
  CHECK_THROWS_WITH(write_hf_model(good.string(), bin, {}), Catch::Contains("already holds a model"));
}

TEST_CASE("hf: a folder where a JSON file should be, or an eos id out of range, is an error naming the right file", "[hf][corrupt]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  const Llama2cFile bin(shared_path("data/stories260K.bin"));
  TempDir tmp;
  const fs::path good = tmp.path() / "good", sharded = tmp.path() / "sharded";
  write_hf_model(good.string(), bin, {.dtype = DType::F32});
  write_hf_model(sharded.string(), bin, {.dtype = DType::F32, .shards = 2});
  int n = 0;
  auto copy = [&](const fs::path& from) {
    const fs::path to = tmp.path() / ("case" + std::to_string(n++));
    fs::copy(from, to, fs::copy_options::recursive);
    return to;
  };
  // Each JSON file replaced by a folder of the same name: named, not "basic_filebuf::underflow".
  for (const char* name : {"config.json", "generation_config.json"}) {
    const fs::path d = copy(good);
    fs::remove(d / name);
    fs::create_directory(d / name);
    check_one_line_naming(open_error(d), (d / name).string(), "is a directory");
  }
  {
    const fs::path d = copy(sharded);
    fs::remove(d / "model.safetensors.index.json");
    fs::create_directory(d / "model.safetensors.index.json");
    check_one_line_naming(open_error(d), (d / "model.safetensors.index.json").string(), "is a directory");
  }
  {  // an eos id out of range in generation_config.json is that file's fault, not config.json's
    const fs::path d = copy(good);
    write_json(d / "generation_config.json", {{"eos_token_id", 9999}});
    check_one_line_naming(open_error(d), (d / "generation_config.json").string(), "eos_token_id 9999");
  }
}

TEST_CASE("hf: an index whose tensor or shard names hold a newline is a one-line error", "[hf][corrupt]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  const Llama2cFile bin(shared_path("data/stories260K.bin"));
  TempDir tmp;
  const fs::path d = tmp.path() / "sharded";
  write_hf_model(d.string(), bin, {.dtype = DType::F32, .shards = 2});
  const fs::path index_path = d / "model.safetensors.index.json";
  const std::pair<json, std::string> cases[] = {
      {{{"weight_map", {{"model.norm\nweight", 3}}}}, R"(weight_map["model.norm\nweight"])"},
      {{{"weight_map", {{"model.norm.weight", "../x\ny"}}}}, R"(shard name "../x\ny")"},
      {{{"weight_map", {{"model.norm\nweight", "model-00001-of-00002.safetensors"}}}}, R"(tensor "model.norm\nweight" is missing)"}};
  for (const auto& [bad_index, escaped] : cases) {
    write_json(index_path, bad_index);
    const std::string msg = open_error(d);
    const std::string file = escaped.starts_with("tensor") ? (d / "model-00001-of-00002.safetensors").string() : index_path.string();
    check_one_line_naming(msg, file, escaped);
  }
}

TEST_CASE("hf: a quantization block over float weights is refused, naming the tensor", "[hf][corrupt][quant]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  const Llama2cFile bin(shared_path("data/stories260K.bin"));
  TempDir tmp;
  const fs::path d = tmp.path() / "float";
  write_hf_model(d.string(), bin, {.dtype = DType::BF16});
  // It would run as bf16 while `inspect` says "quantized affine, 4 bits". (The MLX test above
  // keeps the float matrices MLX leaves alone: those whose input the group does not divide.)
  json config = read_json(d / "config.json");
  config["quantization"] = {{"group_size", 32}, {"bits", 4}};
  write_json(d / "config.json", config);
  const std::string msg = open_error(d);
  check_one_line_naming(msg, (d / "model.safetensors").string(), "model.embed_tokens.weight");
  CHECK(msg.find("config.json's quantization (affine, 4 bits, group_size 32)") != std::string::npos);
}

namespace {

struct Run {
  int code = -1;
  std::string out, err;
};

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

Run run_cli(const TempDir& tmp, const std::string& args) {
  const fs::path out = tmp.path() / "stdout", err = tmp.path() / "stderr";
  const int status = std::system((std::string(TPCLI_BINARY) + " " + args + " >" + out.string() + " 2>" + err.string()).c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, file_bytes(out), file_bytes(err)};
}

}  // namespace

TEST_CASE("hf: tpcli export --to hf, then tpcli infer --model DIR gives the .bin's stdout on 1..8 devices", "[hf][cli]") {
  TPCLI_REQUIRE_SHARED("reference/llama2c_stories260K.tsv");
  const std::string bin = shared_path("data/stories260K.bin"), tok = shared_path("data/tok512.bin");
  TempDir tmp;
  const std::string f32 = (tmp.path() / "f32").string(), bf16 = (tmp.path() / "bf16").string(),
                    two = (tmp.path() / "two").string();
  REQUIRE(run_cli(tmp, "export --model " + bin + " --to hf --dtype f32 --out " + f32).code == 0);
  REQUIRE(run_cli(tmp, "export --model " + bin + " --to hf --out " + bf16).code == 0);  // bf16 by default
  REQUIRE(run_cli(tmp, "export --model " + bin + " --to hf --dtype f32 --shards 2 --out " + two).code == 0);
  CHECK(read_json(fs::path(bf16) / "config.json")["torch_dtype"] == "bfloat16");
  std::vector<RunCase> greedy;
  for (const auto& c : read_run_cases())
    if (c.temperature == 0) greedy.push_back(c);
  REQUIRE(greedy.size() >= 2);
  for (int devices = 1; devices <= 8; ++devices) {
    const RunCase& c = greedy[size_t(devices) % greedy.size()];
    const std::string flags = " -z " + tok + " -t 0 -i '" + c.prompt + "' --devices " + std::to_string(devices);
    const std::string all = flags + " -n " + std::to_string(c.steps);
    INFO(devices << " devices, " << c.name);
    for (const std::string& dir : {f32, two}) {
      INFO(dir);
      const Run r = run_cli(tmp, "infer --model " + dir + all);
      CHECK(r.code == 0);
      CHECK(r.out == c.stdout_text);
    }
    CHECK(run_cli(tmp, "infer --model " + f32 + " --dtype f32" + all).out == c.stdout_text);
    // bf16: the first 64 positions (the golden runs part ways ~200 positions in, at a near-tie).
    const Run r16 = run_cli(tmp, "infer --model " + bf16 + flags + " -n 64");
    CHECK(r16.code == 0);
    CHECK(r16.out == run_cli(tmp, "infer --model " + bin + flags + " -n 64").out);
  }
  // A Hugging Face directory exported back to llama2.c is the .bin exported directly, byte for
  // byte (both differ from the original only in the unused RoPE tables, recomputed on export).
  const std::string back = (tmp.path() / "back.bin").string(), direct = (tmp.path() / "direct.bin").string();
  REQUIRE(run_cli(tmp, "export --model " + two + " --to llama2c --out " + back).code == 0);
  REQUIRE(run_cli(tmp, "export --model " + bin + " --to llama2c --out " + direct).code == 0);
  CHECK(file_bytes(back) == file_bytes(direct));
  // Input errors: one line on stderr naming the file, exit 2, nothing on stdout.
  auto check_usage_error = [&](const Run& r, const std::string& word) {
    INFO(r.err);
    CHECK(r.code == 2);
    CHECK(r.out.empty());
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(r.err.find(word) != std::string::npos);
  };
  check_usage_error(run_cli(tmp, "infer --model " + f32 + " -z " + shared_path("data/tokenizer.bin")), "vocab_size");
  check_usage_error(run_cli(tmp, "infer --model " + f32), "tokenizer.json");
  check_usage_error(run_cli(tmp, "infer --model " + tmp.path().string()), "config.json");
  check_usage_error(run_cli(tmp, "export --model " + bin + " --to hf --out " + f32), "already holds a model");
  check_usage_error(run_cli(tmp, "export --model " + bin + " --to hf --dtype f64 --out " + f32 + "x"), "--dtype");
  check_usage_error(run_cli(tmp, "infer --model " + f32 + " --dtype f8 -z " + tok), "--dtype");
  const Run inspect = run_cli(tmp, "inspect " + two);
  CHECK(inspect.code == 0);
  CHECK(inspect.out.find("Hugging Face model directory (LlamaForCausalLM, float32)") != std::string::npos);
  // --context: a 20-position KV cache runs 20 positions however many -n asks for.
  const Run short_run = run_cli(tmp, "infer --model " + f32 + " -z " + tok + " -t 0 -n 100 --context 20 --devices 2");
  CHECK(short_run.code == 0);
  CHECK(short_run.out == run_cli(tmp, "infer --model " + bin + " -z " + tok + " -t 0 -n 20").out);
}

TEST_CASE("hf: head_dim other than hidden_size / heads runs like llama2.c's forward, sharded and from a directory", "[hf][sharded]") {
  LlamaConfig c;
  c.dim = 32;
  c.hidden_dim = 48;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 12;  // Q = 48 rows of wq, not 32
  c.vocab_size = 40;
  c.seq_len = 16;
  TensorWeights weights = random_weights(c, 7);
  for (const auto& p : llama_parameters(c))  // N(0, 0.5^2): logits far from zero
    if (p.shape.size() == 2)
      for (float& v : weights.at(p.name).span()) v *= 25.0f;
  CHECK(weights.get("layers.0.wq").size() == size_t(48 * 32));
  TempDir tmp;
  write_hf_model((tmp.path() / "hf").string(), weights, {.dtype = DType::F32});
  CHECK(read_json(tmp.path() / "hf" / "config.json")["head_dim"] == 12);
  const HfModelDir dir((tmp.path() / "hf").string());
  CHECK(dir.config().head_dim == 12);

  const std::vector<int> tokens{1, 5, 39, 7, 7, 20, 3, 11, 0, 2};
  ReferenceForward ref(weights);
  std::vector<std::vector<float>> expected;
  for (size_t pos = 0; pos < tokens.size(); ++pos) {
    auto l = ref.forward(tokens[pos], int(pos));
    expected.emplace_back(l.begin(), l.end());
  }
  double largest = 0;
  for (const auto& l : expected)
    for (float v : l) largest = std::max(largest, double(std::abs(v)));
  CHECK(largest > 1.0);
  for (const WeightSource* source : {static_cast<const WeightSource*>(&weights), static_cast<const WeightSource*>(&dir)})
    for (int devices : {1, 2, 4}) {
      INFO(devices << " devices" << (source == &dir ? ", from the directory" : ""));
      std::vector<double> worst(size_t(devices), 1e9);
      tpcli::dist::run_on_mesh(tpcli::dist::Mesh::line(devices), [&](tpcli::dist::Device& dev) {
        Llama m(*source, dev.axis("model"));
        double w = 0;
        for (size_t pos = 0; pos < tokens.size(); ++pos) {
          auto l = m.forward(tokens[pos], int(pos));
          for (size_t v = 0; v < l.size(); ++v) w = std::max(w, std::abs(double(l[v]) - expected[pos][v]));
        }
        worst[size_t(dev.rank())] = w;
      });
      for (double w : worst) CHECK(w < 1e-4);
    }
}

TEST_CASE("hf: config.json keys: llama3 rope_scaling, generation_config ids, sliding window, untied head", "[hf]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  const Llama2cFile bin(shared_path("data/stories260K.bin"));
  TempDir tmp;
  const fs::path dir = tmp.path() / "m";
  write_hf_model(dir.string(), bin, {.dtype = DType::BF16});
  json config = read_json(dir / "config.json");
  config["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 32.0}, {"low_freq_factor", 1.0},
                            {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 128}};
  config["sliding_window"] = 256;
  config["eos_token_id"] = 2;
  write_json(dir / "config.json", config);
  write_json(dir / "generation_config.json", {{"bos_token_id", 1}, {"eos_token_id", {2, 7}}});
  {
    const HfModelDir d(dir.string());
    REQUIRE(d.config().rope_scaling.has_value());
    CHECK(d.config().rope_scaling->factor == 32.0f);
    CHECK(d.config().rope_scaling->original_max_position == 128);
    CHECK(d.config().seq_len == 256);  // the window, not max_position_embeddings (512)
    CHECK(d.hf_config().eos_token_ids == std::vector<int>{2, 7});
    CHECK(d.hf_config().torch_dtype == "bfloat16");
    // Written back out, the scaling survives.
    write_hf_model((tmp.path() / "again").string(), d, {.dtype = DType::BF16});
    CHECK(HfModelDir((tmp.path() / "again").string()).config().rope_scaling->high_freq_factor == 4.0f);
  }
  // Untied: lm_head.weight is then required.
  config["tie_word_embeddings"] = false;
  write_json(dir / "config.json", config);
  check_one_line_naming(open_error(dir), (dir / "model.safetensors").string(), "lm_head.weight");
}

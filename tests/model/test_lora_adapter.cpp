// model/: LoRA adapters (issue 30). PEFT's folder read back identical; the file's names, shapes and
// rotate-half rows checked by a reader written here from the safetensors layout (not ours); 16-bit
// files and names without "base_model.model."; one-line errors naming the file and the tensor; the
// merge against W + scale * B @ A computed here in double; and the unmerged adapter in the
// tensor-parallel model on 1, 2 and 3 devices against the merged f32 model.
//
// Dimension legend: r rank, C dim, Q q_dim, KV kv_dim, F hidden_dim, HS head size, V vocab.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "distributed/runtime.h"
#include "formats/dtype.h"
#include "formats/hf_model.h"
#include "formats/peft_adapter.h"
#include "formats/safetensors.h"
#include "model/llama.h"
#include "model/lora_adapter.h"
#include "model/packed_weights.h"
#include "model/weights_view.h"
#include "random_lora.h"
#include "random_model.h"
#include "support/error_of.h"
#include "support/raw_safetensors.h"
#include "support/shared_data.h"
#include "support/temp_dir.h"

using namespace tpcli;
using namespace tpcli::testing;
using model::LoraAdapterSet;

namespace {

using tpcli::testing::RawSafetensors;
using tpcli::testing::read_raw;

const std::vector<std::string>& ALL = LORA_ALL;

// W + scale * B @ A, in double, for every adapted matrix: the reference merged model.
TensorWeights merged_reference(const model::WeightSource& base, const LoraAdapterSet& set) {
  const LlamaConfig& c = base.config();
  LlamaConfig plain = c;
  plain.quantization.reset();
  TensorWeights out(plain);
  const double scale = set.alpha / set.rank;
  for (const auto& p : model::llama_parameters(c)) {
    const std::span<const float> w = base.get(p.name);
    std::vector<float> v(w.begin(), w.end());
    if (set.tensors.count(p.name + ".lora_a")) {
      const tensor::Tensor& a = set.tensors.at(p.name + ".lora_a");
      const tensor::Tensor& b = set.tensors.at(p.name + ".lora_b");
      const int64_t OUT = p.shape[0], IN = p.shape[1], r = set.rank;
      for (int64_t o = 0; o < OUT; ++o)
        for (int64_t i = 0; i < IN; ++i) {
          double s = 0;
          for (int64_t k = 0; k < r; ++k) s += double(b[o * r + k]) * double(a[k * IN + i]);
          v[static_cast<size_t>(o * IN + i)] = static_cast<float>(double(w[static_cast<size_t>(o * IN + i)]) + scale * s);
        }
    }
    out.set(p.name, tensor::Tensor(p.shape, v));
  }
  return out;
}

// A safetensors file read here from its layout: u64 header size, JSON header, data.

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

}  // namespace

TEST_CASE("lora: an adapter saved in PEFT's format reads back identical", "[lora]") {
  const LlamaConfig c = make_config(64, 8, 2, 96, 3, 67, true);
  const LoraAdapterSet set = random_adapter(c, {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"},
                                            {0, 2}, 4, 11);
  const TempDir dir;
  const std::string path = (dir.path() / "adapter").string();
  formats::save_peft_adapter(path, set, c);
  const LoraAdapterSet back = formats::load_peft_adapter(path, c);
  CHECK(back.rank == set.rank);
  CHECK(back.alpha == set.alpha);
  CHECK(back.dropout == set.dropout);
  CHECK(back.base_model == set.base_model);
  CHECK(back.targets == set.targets);
  REQUIRE(back.tensors.size() == set.tensors.size());
  for (const auto& [name, t] : set.tensors) {
    INFO(name);
    REQUIRE(back.tensors.count(name));
    const tensor::Tensor& u = back.tensors.at(name);
    CHECK(u.shape() == t.shape());
    CHECK(std::memcmp(u.data(), t.data(), static_cast<size_t>(t.numel()) * sizeof(float)) == 0);
  }
}

TEST_CASE("lora: PEFT's files hold Hugging Face names, shapes, rotate-half rows of q and k lora_B, and LoraConfig's fields",
          "[lora]") {
  const LlamaConfig c = make_config(64, 8, 2, 96, 3, 67, true);  // HS 8, KV 16
  const LoraAdapterSet set = random_adapter(c, {"q_proj", "k_proj", "v_proj", "down_proj"}, {1}, 4, 12);
  const TempDir dir;
  formats::save_peft_adapter(dir.path().string(), set, c);

  const nlohmann::json j = nlohmann::json::parse(slurp(dir.path() / "adapter_config.json"));
  CHECK(j["peft_type"] == "LORA");
  CHECK(j["task_type"] == "CAUSAL_LM");
  CHECK(j["r"] == 4);
  CHECK(j["lora_alpha"] == 8.0);
  CHECK(j["lora_dropout"] == 0.05);
  CHECK(j["target_modules"] == nlohmann::json({"q_proj", "k_proj", "v_proj", "down_proj"}));
  CHECK(j["base_model_name_or_path"] == "test/random");
  CHECK(j["bias"] == "none");
  CHECK(j["fan_in_fan_out"] == false);
  CHECK(j["use_rslora"] == false);
  CHECK(j["layers_to_transform"] == nlohmann::json({1}));

  const RawSafetensors raw = read_raw(dir.path() / "adapter_model.safetensors");
  CHECK(raw.header["__metadata__"]["format"] == "pt");
  const std::string p = "base_model.model.model.layers.1.";
  const struct {
    std::string module, matrix;
    int64_t OUT, IN;
    int rope_heads;  // q / k: B's rows in rotate-half order
  } expected[] = {{"self_attn.q_proj", "wq", 64, 64, 8}, {"self_attn.k_proj", "wk", 16, 64, 2},
                  {"self_attn.v_proj", "wv", 16, 64, 0}, {"mlp.down_proj", "w2", 64, 96, 0}};
  CHECK(raw.header.size() == 1 + 2 * std::size(expected));
  const int HS = 8, r = 4;
  for (const auto& e : expected) {
    INFO(e.module);
    const nlohmann::json& a = raw.header.at(p + e.module + ".lora_A.weight");
    const nlohmann::json& b = raw.header.at(p + e.module + ".lora_B.weight");
    CHECK(a["dtype"] == "F32");
    CHECK(a["shape"] == nlohmann::json({r, e.IN}));
    CHECK(b["shape"] == nlohmann::json({e.OUT, r}));
    const tensor::Tensor& ta = set.tensors.at("layers.1." + e.matrix + ".lora_a");
    const tensor::Tensor& tb = set.tensors.at("layers.1." + e.matrix + ".lora_b");
    CHECK(raw.f32(p + e.module + ".lora_A.weight") == std::vector<float>(ta.span().begin(), ta.span().end()));
    const std::vector<float> hf_b = raw.f32(p + e.module + ".lora_B.weight");
    bool rows_match = true;
    for (int64_t row = 0; row < e.OUT; ++row) {
      int64_t ours = row;  // HF row h*HS + j*HS/2 + i holds tpcli row h*HS + 2i + j
      if (e.rope_heads) {
        const int64_t h = row / HS, within = row % HS, j2 = within / (HS / 2), i = within % (HS / 2);
        ours = h * HS + 2 * i + j2;
      }
      for (int k = 0; k < r; ++k) rows_match = rows_match && hf_b[static_cast<size_t>(row * r + k)] == tb[ours * r + k];
    }
    CHECK(rows_match);
  }
}

TEST_CASE("lora: bf16 files and names without base_model.model. load, rows permuted back", "[lora]") {
  const LlamaConfig c = make_config(64, 8, 2, 96, 2, 67, true);
  const TempDir dir;
  const std::string path = dir.path().string();
  const int r = 2, HS = 8;
  // q_proj of both layers, written by hand: A [2, 64], B [64, 2] in HF row order, as bf16.
  std::vector<std::vector<uint16_t>> store;
  std::vector<formats::NamedTensor> named;
  for (int l = 0; l < 2; ++l)
    for (const char* side : {"A", "B"}) {
      const tensor::Shape shape = side[0] == 'A' ? tensor::Shape{r, 64} : tensor::Shape{64, r};
      std::vector<float> v(128);
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(l * 1000 + (side[0] == 'A' ? 0 : 500) + int(i)) / 4096.0f;
      store.emplace_back(v.size());
      formats::from_f32(store.back().data(), v.data(), model::DType::BF16, static_cast<int64_t>(v.size()));
      named.push_back({"model.layers." + std::to_string(l) + ".self_attn.q_proj.lora_" + side + ".weight",
                       {model::DType::BF16, shape, store.back().data()}});
    }
  formats::write_stored_safetensors(path + "/adapter_model.safetensors", named, {{"format", "pt"}});
  std::ofstream(path + "/adapter_config.json") << R"({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 2, "lora_alpha": 4,
    "target_modules": ["q_proj"], "bias": "none", "use_rslora": false, "use_dora": false, "rank_pattern": {}, "alpha_pattern": {}})";
  const LoraAdapterSet set = formats::load_peft_adapter(path, c);
  CHECK(set.scale() == 2.0f);
  REQUIRE(set.tensors.size() == 4);
  for (int l = 0; l < 2; ++l) {
    std::vector<float> a(128), b(128);
    formats::to_f32(a.data(), store[static_cast<size_t>(2 * l)].data(), model::DType::BF16, 128);
    formats::to_f32(b.data(), store[static_cast<size_t>(2 * l + 1)].data(), model::DType::BF16, 128);
    const tensor::Tensor& ta = set.tensors.at("layers." + std::to_string(l) + ".wq.lora_a");
    const tensor::Tensor& tb = set.tensors.at("layers." + std::to_string(l) + ".wq.lora_b");
    CHECK(std::vector<float>(ta.span().begin(), ta.span().end()) == a);
    bool rows_match = true;
    for (int64_t row = 0; row < 64; ++row) {  // tpcli row h*HS + 2i + j from HF row h*HS + j*HS/2 + i
      const int64_t h = row / HS, i = (row % HS) / 2, j = row % 2, hf = h * HS + j * HS / 2 + i;
      for (int k = 0; k < r; ++k) rows_match = rows_match && tb[row * r + k] == b[static_cast<size_t>(hf * r + k)];
    }
    CHECK(rows_match);
  }
}

TEST_CASE("lora: a bad adapter folder is a one-line error naming the file and the key or tensor", "[lora]") {
  const LlamaConfig c = make_config(64, 8, 2, 96, 3, 67, true);
  const LlamaConfig other = make_config(32, 4, 2, 64, 3, 67, true);
  const TempDir dir;
  const std::string good = (dir.path() / "good").string();
  formats::save_peft_adapter(good, random_adapter(c, {"q_proj", "down_proj"}, {0, 1, 2}, 4, 13), c);
  auto load_error = [&](const std::string& path, const LlamaConfig& config) {
    return error_of<std::runtime_error>([&] { formats::load_peft_adapter(path, config); });
  };
  auto copy_with_config = [&](const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
    const std::filesystem::path to = dir.path() / name;
    std::filesystem::create_directories(to);
    std::filesystem::copy_file(std::filesystem::path(good) / "adapter_model.safetensors", to / "adapter_model.safetensors");
    nlohmann::json j = nlohmann::json::parse(slurp(std::filesystem::path(good) / "adapter_config.json"));
    edit(j);
    std::ofstream(to / "adapter_config.json") << j.dump();
    return to.string();
  };
  struct Case {
    std::string path;
    const LlamaConfig* config;
    std::string expect;
  };
  const std::string weights = good + "/adapter_model.safetensors";
  const std::vector<Case> cases = {
      {(dir.path() / "absent").string(), &c, "absent: not a folder"},
      {dir.path().string(), &c, "adapter_config.json: missing (not a PEFT adapter folder)"},
      {good, &other, weights + ": tensor base_model.model.model.layers.0.mlp.down_proj.lora_A.weight: shape [4, 96], expected [4, 64]"},
      {copy_with_config("rank", [](auto& j) { j["r"] = 8; }), &c, "lora_A.weight: rank 4 but adapter_config.json says r = 8"},
      {copy_with_config("unknown", [](auto& j) { j["target_modules"].push_back("lm_head"); }), &c,
       "target_modules: \"lm_head\" is not one of q_proj"},
      {copy_with_config("missing_target", [](auto& j) { j["target_modules"] = {"q_proj"}; }), &c,
       "mlp.down_proj.lora_A.weight: down_proj is not in target_modules"},
      {copy_with_config("dora", [](auto& j) { j["use_dora"] = true; }), &c, "use_dora: true: DoRA adapters are not supported"},
      {copy_with_config("type", [](auto& j) { j["peft_type"] = "IA3"; }), &c, "peft_type: \"IA3\": only LORA"},
      {copy_with_config("alpha", [](auto& j) { j.erase("lora_alpha"); }), &c, "adapter_config.json: lora_alpha: missing"},
  };
  for (const Case& k : cases) {
    const std::string e = load_error(k.path, *k.config);
    INFO(e);
    CHECK(e.find(k.expect) != std::string::npos);
    CHECK(e.find('\n') == std::string::npos);
  }
  // A non-finite value: a NaN in one lora_B, written as a PEFT file.
  LoraAdapterSet bad = random_adapter(c, {"v_proj"}, {0, 1, 2}, 4, 14);
  const std::string nan_dir = (dir.path() / "nan").string();
  formats::save_peft_adapter(nan_dir, bad, c);
  {
    RawSafetensors raw = read_raw(std::filesystem::path(nan_dir) / "adapter_model.safetensors");
    const size_t at = raw.header["base_model.model.model.layers.2.self_attn.v_proj.lora_B.weight"]["data_offsets"][0];
    std::fstream f(nan_dir + "/adapter_model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    uint64_t n = 0;
    f.read(reinterpret_cast<char*>(&n), 8);
    const float nan = NAN;
    f.seekp(static_cast<std::streamoff>(8 + n + at + 4 * 5));
    f.write(reinterpret_cast<const char*>(&nan), 4);
  }
  const std::string e = load_error(nan_dir, c);
  INFO(e);
  CHECK(e.find("layers.2.self_attn.v_proj.lora_B.weight: non-finite value at element 5") != std::string::npos);
  // Saving checks too: a tensor of the wrong shape names it.
  bad.tensors.at("layers.1.wv.lora_a") = tensor::Tensor({4, 32});
  CHECK(error_of<std::invalid_argument>([&] { formats::save_peft_adapter((dir.path() / "x").string(), bad, c); })
            .find("tensor layers.1.wv.lora_a has shape [4, 32], expected [4, 64] (rank 4)") != std::string::npos);
}

TEST_CASE("lora: the merged weights are W + alpha/r * B @ A", "[lora]") {
  const LlamaConfig c = make_config(64, 8, 2, 96, 2, 67, false);
  const TensorWeights base = random_weights(c, 5);
  const LoraAdapterSet set = random_adapter(c, ALL, {0, 1}, 4, 15);
  const model::LoraMergedWeights merged(base, set, "test");
  const TensorWeights reference = merged_reference(base, set);
  for (const auto& p : model::llama_parameters(c)) {
    INFO(p.name);
    const auto m = merged.get(p.name);
    const auto r = reference.get(p.name);
    CHECK(max_diff({m.begin(), m.end()}, {r.begin(), r.end()}) < 1e-5f);
    CHECK_FALSE((set.tensors.count(p.name + ".lora_a") != 0 && merged.stored(p.name).has_value()));
  }
}

namespace {

// A source held elsewhere, for AdaptedWeights to own a handle on.
struct BaseView : model::WeightSource {
  const model::WeightSource& w;
  explicit BaseView(const model::WeightSource& w) : w(w) {}
  const LlamaConfig& config() const override { return w.config(); }
  std::span<const float> get(const std::string& n) const override { return w.get(n); }
  std::optional<model::StoredTensor> stored(const std::string& n) const override { return w.stored(n); }
  const LoraAdapterSet* adapter() const override { return w.adapter(); }
};

struct AdaptedRun {
  std::vector<float> prefill;  // [P, V]
  std::vector<float> decode;   // [P, V] forward() token by token
  std::vector<int> greedy;     // tokens picked after the prompt
  bool split_invariant = false;
};

AdaptedRun run_adapted(const model::WeightSource& w, int devices, const std::vector<int>& tokens, int steps) {
  std::vector<AdaptedRun> runs(static_cast<size_t>(devices));
  dist::run_on_mesh(dist::Mesh::line(devices), [&](dist::Device& dev) {
    AdaptedRun& mine = runs[static_cast<size_t>(dev.rank())];
    model::Llama m(w, dev.axis("model"));
    mine.prefill = m.prefill_logits(tokens, 0);
    mine.split_invariant = m.split_invariant();
    model::Llama fresh(w, dev.axis("model"));
    int next = 0;
    for (size_t pos = 0; pos < tokens.size(); ++pos) {
      const std::span<const float> l = fresh.forward(tokens[pos], static_cast<int>(pos));
      mine.decode.insert(mine.decode.end(), l.begin(), l.end());
    }
    next = static_cast<int>(std::max_element(mine.decode.end() - w.config().vocab_size, mine.decode.end()) -
                            (mine.decode.end() - w.config().vocab_size));
    for (int s = 0; s < steps; ++s) {
      mine.greedy.push_back(next);
      next = fresh.forward_argmax(next, static_cast<int>(tokens.size()) + s);
    }
  });
  for (const auto& r : runs) CHECK(r.greedy == runs[0].greedy);  // every device agrees
  return runs[0];
}

}  // namespace

TEST_CASE("lora: the unmerged adapter on 1, 2 and 3 devices matches the merged f32 model, f32 and packed bases, bit for bit on a split-invariant mesh", "[lora][llama]") {
  LlamaConfig c = make_config(96, 12, 6, 192, 2, 67, false);  // HS 8; splits over 2 and 3
  c.seq_len = 24;
  const TensorWeights f32 = random_weights(c, 21);
  const model::ConvertedWeights q8(f32, tensor::WeightFormat::affine(8, 32)), bf16(f32, tensor::WeightFormat::bf16());
  const std::vector<int> tokens = random_tokens(9, c.vocab_size, 4);
  const std::pair<const char*, const model::WeightSource*> bases[] = {{"f32", &f32}, {"8-bit", &q8}, {"bf16", &bf16}};
  for (const auto& [name, base] : bases) {
    INFO(name);
    const LoraAdapterSet set = random_adapter(c, ALL, {0, 1}, 4, 31);
    // The reference: the base's f32 values (dequantized) merged in double, run as an f32 model.
    const TensorWeights merged = merged_reference(*base, set);
    const AdaptedRun reference = run_adapted(merged, 1, tokens, 8);
    // The base seen as f32 (its get()), with the adapter unmerged: the same up to float rounding.
    const model::AdaptedWeights adapted(std::make_unique<BaseView>(*base), set, "test");
    const AdaptedRun one = run_adapted(adapted, 1, tokens, 8);
    if (std::string(name) == "f32") {
      CHECK(max_diff(one.prefill, reference.prefill) < 1e-4f);
      CHECK(max_diff(one.decode, reference.decode) < 1e-4f);
      CHECK(one.greedy == reference.greedy);
    } else {
      // A packed base computes with its own kernels: the adapter's effect is compared instead, the
      // adapted run minus the plain one against the merged reference minus the plain f32 reference.
      const AdaptedRun plain = run_adapted(*base, 1, tokens, 0);
      const AdaptedRun plain_f32 = run_adapted(merged_reference(*base, LoraAdapterSet{.targets = {"q_proj"}}), 1, tokens, 0);
      std::vector<float> ours(one.decode.size()), theirs(one.decode.size());
      for (size_t i = 0; i < ours.size(); ++i) {
        ours[i] = one.decode[i] - plain.decode[i];
        theirs[i] = reference.decode[i] - plain_f32.decode[i];
      }
      CHECK(max_diff(ours, theirs) < 2e-3f);
    }
    for (int devices : {2, 3}) {
      INFO(devices << " devices");
      const AdaptedRun many = run_adapted(adapted, devices, tokens, 8);
      CHECK(many.greedy == one.greedy);
      CHECK(max_diff(many.prefill, one.prefill) < 1e-4f);
      CHECK(max_diff(many.decode, one.decode) < 1e-4f);
      if (devices == 2 && std::string(name) == "f32") CHECK(many.split_invariant);  // so the next line is exercised
      if (many.split_invariant) CHECK(std::memcmp(many.decode.data(), one.decode.data(), one.decode.size() * 4) == 0);
    }
  }
}

TEST_CASE("lora: an adapter on some layers and modules only, and none at all, leave the rest as the base", "[lora][llama]") {
  LlamaConfig c = make_config(64, 8, 2, 96, 3, 67, true);
  const TensorWeights base = random_weights(c, 22);
  const std::vector<int> tokens = random_tokens(7, c.vocab_size, 5);
  const LoraAdapterSet set = random_adapter(c, {"v_proj", "o_proj", "up_proj"}, {1}, 3, 32);
  const model::AdaptedWeights adapted(std::make_unique<TensorWeights>(base), set, "test");
  const AdaptedRun reference = run_adapted(merged_reference(base, set), 1, tokens, 4);
  for (int devices : {1, 2}) {
    const AdaptedRun got = run_adapted(adapted, devices, tokens, 4);
    CHECK(max_diff(got.prefill, reference.prefill) < 1e-4f);
    CHECK(got.greedy == reference.greedy);
  }
  // Views of an adapted model (quantized on load, --dtype f32 / --context) keep its adapter.
  const model::ConvertedWeights converted(adapted, tensor::WeightFormat::affine(8, 32));
  CHECK(converted.adapter() == adapted.adapter());
  model::WeightsView view(std::make_unique<BaseView>(adapted));
  view.as_f32();
  CHECK(view.adapter() == adapted.adapter());
  // An empty adapter (no tensors): the base's logits bit for bit.
  const model::AdaptedWeights none(std::make_unique<TensorWeights>(base), LoraAdapterSet{.targets = {"q_proj"}}, "test");
  const AdaptedRun a = run_adapted(none, 1, tokens, 0), b = run_adapted(base, 1, tokens, 0);
  CHECK(std::memcmp(a.prefill.data(), b.prefill.data(), a.prefill.size() * 4) == 0);
}

TEST_CASE("lora: Hugging Face Qwen2 (q/k/v biases) and Qwen3 (head_dim 32, q/k norms) with an adapter match their merged models, and Phi-3's fused projections and MoE experts are refused",
          "[lora][hf]") {
  require_shared("reference/hf-archs/qwen3");
  for (const char* arch : {"qwen2", "qwen3"}) {
    INFO(arch);
    const formats::HfModelDir dir(shared_path(std::string("reference/hf-archs/") + arch));
    const LlamaConfig& c = dir.config();
    std::vector<int> layers;
    for (int l = 0; l < c.n_layers; ++l) layers.push_back(l);
    const LoraAdapterSet set = random_adapter(c, ALL, layers, 4, 61);
    // Through PEFT's folder, so its RoPE reordering of q/k rows is on the way.
    const TempDir tmp;
    formats::save_peft_adapter(tmp.path().string(), set, c);
    const model::AdaptedWeights adapted(std::make_unique<BaseView>(dir), formats::load_peft_adapter(tmp.path().string(), c), "test");
    const std::vector<int> tokens = random_tokens(8, c.vocab_size, 6);
    const AdaptedRun reference = run_adapted(merged_reference(dir, set), 1, tokens, 6);
    for (int devices : {1, 2}) {
      const AdaptedRun got = run_adapted(adapted, devices, tokens, 6);
      CHECK(max_diff(got.prefill, reference.prefill) < 1e-4f);
      CHECK(got.greedy == reference.greedy);
    }
  }
  const formats::HfModelDir phi3(shared_path("reference/hf-archs/phi3"));
  CHECK(error_of<std::invalid_argument>([&] {
          formats::save_peft_adapter((std::filesystem::temp_directory_path() / "tpcli-never-written").string(),
                                   random_adapter(phi3.config(), {"v_proj"}, {0}, 2, 62), phi3.config());
        }).find("Phi3ForCausalLM stores wv in a fused module (model.layers.0.self_attn.qkv_proj)") != std::string::npos);
  const formats::HfModelDir moe(shared_path("reference/hf-archs/qwen3_moe"));  // layer 0 dense, 1 and 2 experts
  CHECK_NOTHROW(model::validate_lora(random_adapter(moe.config(), {"gate_proj", "q_proj"}, {0}, 2, 63), moe.config(), "test"));
  CHECK(error_of<std::invalid_argument>([&] { model::validate_lora(random_adapter(moe.config(), {"q_proj"}, {1}, 2, 64), moe.config(), "test"); }) ==
        "(no error)");
  LoraAdapterSet on_experts = random_adapter(moe.config(), {"q_proj"}, {1}, 2, 65);
  on_experts.targets.push_back("up_proj");
  on_experts.tensors.emplace("layers.1.w3.lora_a", tensor::Tensor({2, moe.config().dim}));
  on_experts.tensors.emplace("layers.1.w3.lora_b", tensor::Tensor({moe.config().hidden_dim, 2}));
  CHECK(error_of<std::invalid_argument>([&] { model::validate_lora(on_experts, moe.config(), "test"); })
            .find("test: tensor layers.1.w3.lora_a: layer 1 is a mixture of experts, with no dense w3") != std::string::npos);
}

// The sharded Llama against the same model on one device: decode logits, batched forward,
// gradients, gathered weights. Random-weight models of several shapes, including n_kv_heads <
// devices (replicated KV heads), uneven head splits (6 heads on 4 devices) and an unshared
// classifier. Device threads record results; CHECKs run on the main thread.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "distributed/runtime.h"
#include "model/llama.h"
#include "model/trainable_llama.h"
#include "nn/fd_check.h"
#include "random_model.h"

using namespace tpcli;
using model::LlamaConfig;
using model::TensorWeights;
using namespace tpcli::testing;


TEST_CASE("sharded decode logits equal the 1-device logits on every device count", "[llama][decode]") {
  for (const auto& s : shapes()) {
    const auto w = random_weights(s.config, 21);
    const auto tokens = random_tokens(7, s.config.vocab_size, 22);
    const auto ref = decode_logits(w, 1, tokens)[0];
    const float scale = max_abs(ref);
    REQUIRE(scale > 0.1f);
    for (int T = 2; T <= s.max_devices; ++T) {
      INFO(s.name << " on " << T << " devices");
      const auto got = decode_logits(w, T, tokens);
      for (int r = 0; r < T; ++r) {
        REQUIRE(got[r].size() == ref.size());
        float diff = 0;
        for (size_t i = 0; i < ref.size(); ++i) diff = std::max(diff, std::abs(got[r][i] - ref[i]));
        INFO("device " << r << ": max abs diff " << diff << " (logit scale " << scale << ")");
        CHECK(diff <= 1e-5f * scale);
      }
    }
  }
}

TEST_CASE("decode matches a serial double-precision reference of llama2.c's forward", "[llama][decode]") {
  // An independent, plain implementation (no nn/ code) of llama2.c's forward for one model.
  const auto c = make_config(16, 4, 2, 24, 2, 11, true);
  const auto w = random_weights(c, 31);
  const auto tokens = random_tokens(5, c.vocab_size, 32);
  const int C = c.dim, HS = c.head_size(), KV = c.kv_dim(), F = c.hidden_dim, V = c.vocab_size;
  auto W = [&](const std::string& n) { return w.get(n); };
  auto matvec = [](std::vector<double>& out, std::span<const float> m, const std::vector<double>& x, int n, int k) {
    out.assign(n, 0.0);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < k; ++j) out[i] += double(m[size_t(i) * k + j]) * x[j];
  };
  auto rmsnorm = [&](std::vector<double>& o, const std::vector<double>& x, std::span<const float> g) {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double r = 1.0 / std::sqrt(ss / C + 1e-5);
    o.resize(C);
    for (int j = 0; j < C; ++j) o[j] = g[j] * x[j] * r;
  };
  std::vector<std::vector<double>> kc(c.n_layers), vc(c.n_layers);
  std::vector<float> ours = decode_logits(w, 1, tokens)[0];
  for (size_t pos = 0; pos < tokens.size(); ++pos) {
    std::vector<double> x(C), xb, q, k, v, o(C), h1, h3;
    for (int j = 0; j < C; ++j) x[j] = W("tok_embeddings")[size_t(tokens[pos]) * C + j];
    for (int l = 0; l < c.n_layers; ++l) {
      const std::string p = "layers." + std::to_string(l) + ".";
      rmsnorm(xb, x, W(p + "attention_norm"));
      matvec(q, W(p + "wq"), xb, C, C);
      matvec(k, W(p + "wk"), xb, KV, C);
      matvec(v, W(p + "wv"), xb, KV, C);
      for (int i = 0; i < C; i += 2) {
        const double angle = double(pos) * std::pow(10000.0, -double(i % HS) / HS);
        auto rot = [&](std::vector<double>& vec) {
          const double a = vec[i], b = vec[i + 1];
          vec[i] = a * std::cos(angle) - b * std::sin(angle);
          vec[i + 1] = a * std::sin(angle) + b * std::cos(angle);
        };
        rot(q);
        if (i < KV) rot(k);
      }
      kc[l].insert(kc[l].end(), k.begin(), k.end());
      vc[l].insert(vc[l].end(), v.begin(), v.end());
      const int kv_mul = c.n_heads / c.n_kv_heads;
      for (int h = 0; h < c.n_heads; ++h) {
        std::vector<double> att(pos + 1);
        double mx = -1e300, sum = 0;
        for (size_t t = 0; t <= pos; ++t) {
          double s = 0;
          for (int i = 0; i < HS; ++i) s += q[h * HS + i] * kc[l][t * KV + (h / kv_mul) * HS + i];
          att[t] = s / std::sqrt(double(HS));
          mx = std::max(mx, att[t]);
        }
        for (auto& a : att) sum += (a = std::exp(a - mx));
        for (int i = 0; i < HS; ++i) {
          double acc = 0;
          for (size_t t = 0; t <= pos; ++t) acc += att[t] / sum * vc[l][t * KV + (h / kv_mul) * HS + i];
          o[h * HS + i] = acc;
        }
      }
      std::vector<double> y;
      matvec(y, W(p + "wo"), o, C, C);
      for (int j = 0; j < C; ++j) x[j] += y[j];
      rmsnorm(xb, x, W(p + "ffn_norm"));
      matvec(h1, W(p + "w1"), xb, F, C);
      matvec(h3, W(p + "w3"), xb, F, C);
      for (int i = 0; i < F; ++i) h1[i] = h1[i] / (1.0 + std::exp(-h1[i])) * h3[i];
      matvec(y, W(p + "w2"), h1, C, F);
      for (int j = 0; j < C; ++j) x[j] += y[j];
    }
    rmsnorm(xb, x, W("norm"));
    std::vector<double> logits;
    matvec(logits, W("tok_embeddings"), xb, V, C);
    for (int i = 0; i < V; ++i) CHECK(ours[pos * V + i] == Approx(logits[i]).epsilon(1e-4).margin(1e-4));
  }
}

TEST_CASE("batched forward equals token-by-token decode", "[llama][batched]") {
  for (const auto& s : shapes()) {
    INFO(s.name);
    const auto w = random_weights(s.config, 41);
    const int B = 2, T = 6, V = s.config.vocab_size;
    const auto tokens = random_tokens(B * T, V, 42);
    for (int devices : {1, 3}) {
      std::vector<float> batched;
      dist::run_on_mesh(dist::Mesh::line(devices), [&](dist::Device& dev) {
        model::TrainableLlama m(w, dev.axis("model"));
        auto l = m.forward_logits(tokens, B, T);
        if (dev.rank() == devices - 1) batched = std::move(l);
      });
      std::vector<float> decoded;
      for (int b = 0; b < B; ++b) {
        std::vector<int> seq(tokens.begin() + b * T, tokens.begin() + (b + 1) * T);
        auto d = decode_logits(w, 1, seq)[0];
        decoded.insert(decoded.end(), d.begin(), d.end());
      }
      REQUIRE(batched.size() == decoded.size());
      const float scale = max_abs(decoded);
      float diff = 0;
      for (size_t i = 0; i < decoded.size(); ++i) diff = std::max(diff, std::abs(batched[i] - decoded[i]));
      INFO(devices << " devices: max abs diff " << diff << " (scale " << scale << ")");
      CHECK(diff <= 1e-5f * scale);
    }
  }
}

namespace {

struct TrainResult {
  float loss = 0;
  TensorWeights grads{LlamaConfig{}};
  std::map<std::string, std::vector<float>> replicated_grads;  // this device's local grads of replicated params
};

// One forward_backward (twice when `twice`: gradients must accumulate) on a T-device group.
std::vector<TrainResult> train_step(const TensorWeights& w, int T, const std::vector<int>& tokens,
                                    const std::vector<int>& targets, int B, int seq, bool twice = false) {
  std::vector<TrainResult> out(T);
  dist::run_on_mesh(dist::Mesh::line(T), [&](dist::Device& dev) {
    model::TrainableLlama m(w, dev.axis("model"));
    m.zero_grad();
    TrainResult r;
    r.loss = m.forward_backward(tokens, targets, B, seq);
    if (twice) m.forward_backward(tokens, targets, B, seq);
    for (auto& p : m.parameters())
      if (p.spec->split == model::Split::Replicated)
        r.replicated_grads[p.spec->name].assign(p.grad->span().begin(), p.grad->span().end());
    r.grads = m.gather_grads();
    out[dev.rank()] = std::move(r);
  });
  return out;
}

}  // namespace

TEST_CASE("gradients of the sharded model equal the 1-device gradients for every parameter", "[llama][grad]") {
  for (const auto& s : shapes()) {
    const auto w = random_weights(s.config, 51);
    const int B = 2, T = 5;
    const auto tokens = random_tokens(B * T, s.config.vocab_size, 52);
    const auto targets = random_tokens(B * T, s.config.vocab_size, 53);
    const auto ref = train_step(w, 1, tokens, targets, B, T)[0];
    for (int devices : {2, 4, s.config.n_heads}) {
      if (devices > s.config.n_heads) continue;
      INFO(s.name << " on " << devices << " devices");
      const auto got = train_step(w, devices, tokens, targets, B, T);
      for (int r = 0; r < devices; ++r) {
        CHECK(got[r].loss == Approx(ref.loss).epsilon(1e-5));
        for (const auto& spec : model::llama_parameters(s.config)) {
          auto a = got[r].grads.get(spec.name);
          auto e = ref.grads.get(spec.name);
          REQUIRE(a.size() == e.size());
          float scale = 0, diff = 0;
          for (size_t i = 0; i < e.size(); ++i) {
            scale = std::max(scale, std::abs(e[i]));
            diff = std::max(diff, std::abs(a[i] - e[i]));
          }
          INFO("device " << r << " " << spec.name << ": max abs diff " << diff << ", grad scale " << scale);
          CHECK(scale > 0.0f);
          CHECK(diff <= 1e-4f * scale);
        }
        // Replicated parameters get bit-identical gradients on every device.
        for (const auto& [name, g] : got[r].replicated_grads) {
          INFO("replicated " << name << " on device " << r);
          CHECK(g == got[0].replicated_grads.at(name));
        }
      }
    }
  }
}

TEST_CASE("gradients accumulate over calls, including replicated KV rows", "[llama][grad]") {
  const auto c = make_config(32, 8, 4, 40, 1, 29, false);
  const auto w = random_weights(c, 61);
  const auto tokens = random_tokens(8, c.vocab_size, 62), targets = random_tokens(8, c.vocab_size, 63);
  const auto once = train_step(w, 1, tokens, targets, 2, 4)[0];
  const auto twice = train_step(w, 8, tokens, targets, 2, 4, true);  // 8 devices: every KV head held twice
  for (const auto& spec : model::llama_parameters(c)) {
    auto a = twice[3].grads.get(spec.name);
    auto e = once.grads.get(spec.name);
    float scale = 0, diff = 0;
    for (size_t i = 0; i < e.size(); ++i) {
      scale = std::max(scale, std::abs(2 * e[i]));
      diff = std::max(diff, std::abs(a[i] - 2 * e[i]));
    }
    INFO(spec.name << ": max abs diff " << diff << " of scale " << scale);
    CHECK(diff <= 1e-4f * scale);
  }
}

TEST_CASE("model gradient matches finite differences of the loss", "[llama][grad]") {
  const LlamaConfig qwen = [] {
    LlamaConfig c = qwen_like(16, 6);
    c.n_layers = 1;
    c.vocab_size = 9;
    return c;
  }();
  for (const LlamaConfig& c : {make_config(16, 4, 2, 12, 1, 9, false), qwen}) {
    INFO((c.qk_norm ? "with q/k/v biases and q/k norms" : "Llama"));
    auto w = random_weights(c, 71);
    const int B = 2, T = 3;
    const auto tokens = random_tokens(B * T, c.vocab_size, 72), targets = random_tokens(B * T, c.vocab_size, 73);
    const auto ref = train_step(w, 1, tokens, targets, B, T)[0];
    dist::Group single;
    auto loss_of = [&] { return double(model::TrainableLlama(w, single).loss(tokens, targets, B, T)); };
    std::mt19937 rng(74);
    for (const auto& spec : model::llama_parameters(c)) {
      auto& t = w.at(spec.name);
      const auto g = ref.grads.get(spec.name);
      for (int probe = 0; probe < 3; ++probe) {
        const int64_t i = std::uniform_int_distribution<int64_t>(0, t.numel() - 1)(rng);
        const double numeric = nn::testing::central_difference(t[i], loss_of, 1e-2f);
        INFO(spec.name << "[" << i << "]: analytic " << g[i] << ", numeric " << numeric);
        CHECK(std::abs(g[i] - numeric) <= 2e-3 + 3e-2 * std::abs(numeric));
      }
    }
  }
}

TEST_CASE("a Qwen3-MoE-like model's gradient (a dense block among MoE ones, unnormalised gates, q/k norms) matches "
          "finite differences", "[llama][grad][moe]") {
  LlamaConfig c = qwen_like(16, 6);
  c.vocab_size = 11;
  c.n_experts = 4;
  c.top_k = 2;
  c.expert_hidden_dim = 10;
  c.dense_layers = {0};
  c.norm_topk_prob = false;
  auto w = random_weights(c, 91);
  const int B = 2, T = 3;
  const auto tokens = random_tokens(B * T, c.vocab_size, 92), targets = random_tokens(B * T, c.vocab_size, 93);
  dist::Group single;
  std::map<std::string, std::vector<float>> grads;  // one device: every parameter whole, experts too
  {
    model::TrainableLlama m(w, single);
    m.zero_grad();
    m.forward_backward(tokens, targets, B, T);
    for (const auto& p : m.parameters()) grads[p.spec->name].assign(p.grad->span().begin(), p.grad->span().end());
  }
  auto loss_of = [&] { return double(model::TrainableLlama(w, single).loss(tokens, targets, B, T)); };
  std::mt19937 rng(94);
  for (const auto& spec : model::llama_parameters(c)) {
    auto& t = w.at(spec.name);
    const std::vector<float>& g = grads.at(spec.name);
    for (int probe = 0; probe < 3; ++probe) {
      const int64_t i = std::uniform_int_distribution<int64_t>(0, t.numel() - 1)(rng);
      const double numeric = nn::testing::central_difference(t[i], loss_of, 1e-2f);
      INFO(spec.name << "[" << i << "]: analytic " << g[static_cast<size_t>(i)] << ", numeric " << numeric);
      CHECK(std::abs(g[static_cast<size_t>(i)] - numeric) <= 2e-3 + 3e-2 * std::abs(numeric));
    }
  }
}

TEST_CASE("gather_weights returns the original weights - byte counts - errors", "[llama]") {
  const auto c = make_config(24, 6, 3, 30, 2, 23, false);
  const auto w = random_weights(c, 81);
  std::vector<int64_t> param_bytes(4), kv_bytes(4);
  std::vector<TensorWeights> gathered(4, TensorWeights(c));
  dist::run_on_mesh(dist::Mesh::line(4), [&](dist::Device& dev) {
    model::TrainableLlama m(w, dev.axis("model"));
    gathered[dev.rank()] = m.gather_weights();
    param_bytes[dev.rank()] = m.parameter_bytes();
    const model::Llama inference(w, dev.axis("model"));
    CHECK(inference.parameter_bytes() == param_bytes[dev.rank()]);
    kv_bytes[dev.rank()] = inference.kv_cache_bytes();
  });
  for (int r = 0; r < 4; ++r)
    for (const auto& spec : model::llama_parameters(c)) {
      auto a = gathered[r].get(spec.name), e = w.get(spec.name);
      INFO(spec.name);
      CHECK(std::equal(a.begin(), a.end(), e.begin(), e.end()));
    }
  // 6 heads on 4 devices: 2,2,1,1 query heads; KV heads (kv_mul 2): 1,1,1,1 -> kv cache equal.
  const int64_t kv_expected = 2LL * c.n_layers * c.seq_len * 1 * c.head_size() * 4;
  CHECK(kv_bytes[0] == kv_expected);
  CHECK(kv_bytes[3] == kv_expected);
  CHECK(param_bytes[0] > param_bytes[3]);  // two heads vs one
  dist::Group single;
  model::Llama one(w, single);
  CHECK(one.parameter_bytes() == c.parameter_count() * 4);
  CHECK(model::TrainableLlama(w, single).parameter_bytes() == c.parameter_count() * 4);
  CHECK_THROWS_WITH(one.forward(0, c.seq_len), Catch::Contains("position 16"));
  const auto big = make_config(32, 8, 4, 40, 1, 29, true);
  const auto wb = random_weights(big, 82);
  CHECK_THROWS_WITH(dist::run_on_mesh(dist::Mesh::line(12), [&](dist::Device& dev) { model::Llama m(wb, dev.axis("model")); }),
                    Catch::Contains("cannot split 8 heads over 12 devices"));
}

TEST_CASE("forward_argmax (argmax reduced across devices) picks the 1-device logits' argmax", "[llama][decode]") {
  for (const auto& s : shapes()) {
    const auto w = random_weights(s.config, 91);
    const auto tokens = random_tokens(6, s.config.vocab_size, 92);
    const auto ref = decode_logits(w, 1, tokens)[0];
    const int V = s.config.vocab_size;
    std::vector<int> expected;
    for (size_t p = 0; p < tokens.size(); ++p)
      expected.push_back(static_cast<int>(std::max_element(ref.begin() + p * V, ref.begin() + (p + 1) * V) -
                                          (ref.begin() + p * V)));
    for (int T = 1; T <= s.max_devices; ++T) {
      std::vector<std::vector<int>> got(T);
      dist::run_on_mesh(dist::Mesh::line(T), [&](dist::Device& dev) {
        model::Llama m(w, dev.axis("model"));
        for (size_t p = 0; p < tokens.size(); ++p) got[dev.rank()].push_back(m.forward_argmax(tokens[p], int(p)));
      });
      INFO(s.name << " on " << T << " devices");
      for (int r = 0; r < T; ++r) CHECK(got[r] == expected);
    }
  }
}

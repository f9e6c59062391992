// Batched prefill against token-by-token decode (the reference: decode is tested against llama2.c
// and a double-precision forward elsewhere), on every device count a shape allows; generation
// (a batch engine request, the prompt in one step) against llama2.c's loop feeding it token by
// token; per-device memory of the sharded model.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "distributed/runtime.h"
#include "engine/generate.h"
#include "formats/llama2c.h"
#include "model/llama.h"
#include "model/shard_plan.h"
#include "model/trainable_llama.h"
#include "random_model.h"
#include "reference_files.h"
#include "support/reference_generate.h"

using namespace tpcli;
using namespace tpcli::testing;

namespace {

// Logits [P, V] per device: tokens[0..split) decoded one by one, then tokens[split..) prefilled at
// position split (split = 0: the whole prompt in one batch).
std::vector<std::vector<float>> prefill_logits(const TensorWeights& w, int T, const std::vector<int>& tokens, int split) {
  std::vector<std::vector<float>> out(static_cast<size_t>(T));
  dist::run_on_mesh(dist::Mesh::line(T), [&](dist::Device& dev) {
    model::Llama m(w, dev.axis("model"));
    std::vector<float> all;
    for (int pos = 0; pos < split; ++pos) {
      auto l = m.forward(tokens[static_cast<size_t>(pos)], pos);
      all.insert(all.end(), l.begin(), l.end());
    }
    const std::span<const int> rest(tokens.data() + split, tokens.size() - static_cast<size_t>(split));
    auto l = m.prefill_logits(rest, split);
    all.insert(all.end(), l.begin(), l.end());
    out[static_cast<size_t>(dev.rank())] = std::move(all);
  });
  return out;
}

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  float d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

}  // namespace

TEST_CASE("prefill: logits at every prompt position equal token-by-token decode on 1..n devices, bit for bit", "[llama][prefill]") {
  // Every product and attention row keeps the single-token arithmetic however many rows run
  // together (tensor::DecodeRows), so on the same devices the two ways give the same bits.
  for (const auto& s : shapes()) {
    const auto w = random_weights(s.config, 111);
    const auto tokens = random_tokens(11, s.config.vocab_size, 112);
    for (int T = 1; T <= s.max_devices; ++T) {
      const auto ref = decode_logits(w, T, tokens);  // [11, V] per device
      REQUIRE(max_abs(ref[0]) > 0.1f);
      for (int split : {0, 1, 4}) {  // the prompt from position 0, and continuing a sequence
        const auto got = prefill_logits(w, T, tokens, split);
        for (int r = 0; r < T; ++r) {
          INFO(s.name << ", prefill from position " << split << ", " << T << " devices, device " << r << ": max abs diff "
                      << max_diff(got[static_cast<size_t>(r)], ref[static_cast<size_t>(r)]));
          CHECK(got[static_cast<size_t>(r)] == ref[static_cast<size_t>(r)]);
        }
      }
    }
  }
}

TEST_CASE("prefill: the greedy tokens that follow equal token-by-token greedy decode on 1..n devices", "[llama][prefill]") {
  for (const auto& s : shapes()) {
    const auto w = random_weights(s.config, 121);
    const auto prompt = random_tokens(6, s.config.vocab_size, 122);
    const int steps = s.config.seq_len;
    // Reference: one device, token by token; greedy continuation after the prompt.
    auto greedy_run = [&](int T, bool batched) {
      std::vector<std::vector<int>> out(static_cast<size_t>(T));
      dist::run_on_mesh(dist::Mesh::line(T), [&](dist::Device& dev) {
        model::Llama m(w, dev.axis("model"));
        const int P = static_cast<int>(prompt.size());
        int next = 0;
        if (batched) {
          next = m.prefill_argmax(prompt, 0);
        } else {
          for (int pos = 0; pos < P; ++pos) next = m.forward_argmax(prompt[static_cast<size_t>(pos)], pos);
        }
        std::vector<int> picked{next};
        for (int pos = P; pos + 1 < steps; ++pos) picked.push_back(next = m.forward_argmax(next, pos));
        out[static_cast<size_t>(dev.rank())] = std::move(picked);
      });
      return out;
    };
    const auto expected = greedy_run(1, false)[0];
    REQUIRE(expected.size() == static_cast<size_t>(steps - prompt.size()));
    for (int T = 1; T <= s.max_devices; ++T) {
      const auto got = greedy_run(T, true);
      for (int r = 0; r < T; ++r) {
        INFO(s.name << " on " << T << " devices, device " << r);
        CHECK(got[static_cast<size_t>(r)] == expected);
      }
    }
  }
}

TEST_CASE("prefill: positions outside the context are a clear error", "[llama][prefill]") {
  const auto c = make_config(16, 4, 2, 20, 1, 13, true);
  const auto w = random_weights(c, 131);
  dist::Group single;
  model::Llama m(w, single);
  const auto tokens = random_tokens(5, c.vocab_size, 132);
  CHECK_THROWS_WITH(m.prefill(tokens, c.seq_len - 4), Catch::Contains("5 token(s) at position 12"));
  CHECK_THROWS_AS(m.prefill(std::span<const int>(), 0), std::out_of_range);
  CHECK_THROWS_WITH(m.prefill(std::vector<int>{1, c.vocab_size}, 0), Catch::Contains("token 13"));
  CHECK_NOTHROW(m.prefill(tokens, c.seq_len - 5));  // the last five positions
}

TEST_CASE("generation: the engine's batched prompt prints what llama2.c's token-by-token loop prints, 1..8 devices",
          "[golden][prefill]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  formats::Llama2cFile weights(shared_path("data/stories260K.bin"));
  text::Tokenizer tok(shared_path("data/tok512.bin"), 512);
  struct Case {
    const char* prompt;
    int steps;
    float temperature;
  };
  // Greedy (argmax path), sampled (logits path), a prompt longer than `steps`, and BOS alone.
  const Case cases[] = {{"Once upon a time, there was a little girl named Lily", 60, 0.0f},
                        {"The cat sat on the mat and", 48, 0.8f},
                        {"One day a big dog ran to the park with his ball", 6, 0.0f},
                        {"", 20, 0.0f}};
  for (const auto& c : cases) {
    engine::GenerateOptions o;
    o.prompt = c.prompt;
    o.steps = c.steps;
    o.temperature = c.temperature;
    o.seed = 42;
    o = engine::normalized(o, 512);
    for (int devices = 1; devices <= 8; ++devices) {
      INFO("'" << c.prompt << "' on " << devices << " devices, temperature " << c.temperature);
      const auto one_by_one = engine::run_model_on_mesh(
          weights, dist::Mesh::line(devices),
          [&](const engine::ModelFns& m, std::FILE* out) {
            return reference_generate(engine::ModelFns{m.forward, m.argmax}, tok, o, out);  // no prefill: token by token
          },
          nullptr);
      const auto batched = engine::generate_on_mesh(weights, tok, dist::Mesh::line(devices), o, nullptr);
      CHECK(batched.result.text == one_by_one.result.text);
      CHECK(batched.result.tokens == one_by_one.result.tokens);
      CHECK(batched.result.positions == one_by_one.result.positions);
      CHECK(one_by_one.result.prefill_tokens == 0);
      const int prompt_tokens = static_cast<int>(tok.encode(c.prompt, true, false).size());
      CHECK(batched.result.prefill_tokens == (prompt_tokens > 1 ? std::min(prompt_tokens, o.steps) : 0));
    }
  }
}

TEST_CASE("memory: per-device parameters add up to the model once, plus the replicated norms, and gather_weights is whole",
          "[llama][memory]") {
  for (const auto& s : shapes()) {
    const auto w = random_weights(s.config, 141);
    const LlamaConfig& c = s.config;
    const int64_t C = c.dim, L = c.n_layers;
    for (int T = 1; T <= s.max_devices; ++T) {
      std::vector<int64_t> params(static_cast<size_t>(T)), caches(static_cast<size_t>(T));
      std::vector<TensorWeights> gathered(static_cast<size_t>(T), TensorWeights(c));
      dist::run_on_mesh(dist::Mesh::line(T), [&](dist::Device& dev) {
        model::Llama m(w, dev.axis("model"));
        params[static_cast<size_t>(dev.rank())] = m.parameter_bytes();
        caches[static_cast<size_t>(dev.rank())] = m.kv_cache_bytes();
        model::TrainableLlama trainable(w, dev.axis("model"));
        CHECK(trainable.parameter_bytes() == m.parameter_bytes());
        gathered[static_cast<size_t>(dev.rank())] = trainable.gather_weights();  // what a checkpoint saves
      });
      // Held more than once: the norm gains (on every device) and KV heads several devices use (their
      // rows of wk, wv, bk, bv).
      int64_t kv_rows_held = 0;  // sum over devices of wk (= wv) rows
      for (const auto& plan : model::plan_all_shards(c, T)) kv_rows_held += plan.kv_rows().count;
      const int64_t norms = (2 * L + 1) * C + (c.qk_norm ? 2 * L * c.head_size() : 0);
      const int64_t extra_kv_rows = kv_rows_held - c.kv_dim(), kv_row_size = C + (c.qkv_bias ? 1 : 0);  // wk's row, bk's
      const int64_t expected_params = (c.parameter_count() + (T - 1) * norms + 2 * L * extra_kv_rows * kv_row_size) * 4;
      const int64_t expected_caches = 2 * L * c.seq_len * kv_rows_held * 4;
      int64_t sum_params = 0, sum_caches = 0;
      for (int r = 0; r < T; ++r) {
        sum_params += params[static_cast<size_t>(r)];
        sum_caches += caches[static_cast<size_t>(r)];
      }
      INFO(s.name << " on " << T << " devices");
      CHECK(sum_params == expected_params);
      CHECK(sum_caches == expected_caches);
      if (c.n_kv_heads % T == 0) CHECK(extra_kv_rows == 0);
      for (int r = 0; r < T; ++r)
        for (const auto& spec : model::llama_parameters(c)) {
          INFO("device " << r << ": " << spec.name);
          const auto a = gathered[static_cast<size_t>(r)].get(spec.name), e = w.get(spec.name);
          CHECK(std::equal(a.begin(), a.end(), e.begin(), e.end()));
        }
    }
  }
}

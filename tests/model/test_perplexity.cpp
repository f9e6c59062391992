// engine/perplexity.h against a reference written out here: each window's NLL is the sum of
// -log softmax(logits)[target] over its positions, the logits those of a 1-device token-by-token
// decode (tests/model/random_model.h), the softmax computed directly in double. The batched forward's
// score must agree with the decode path's.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "distributed/runtime.h"
#include "engine/perplexity.h"
#include "random_model.h"

using namespace tpcli;
using namespace tpcli::testing;

namespace {

constexpr int S = 6;  // window length

// Mean over the window of -log softmax(logits[p])[target[p]], logits [S, V] from decode_logits.
double reference_window_nll(const std::vector<float>& logits, const int* target, int V) {
  double nll = 0;
  for (int p = 0; p < S; ++p) {
    const float* row = logits.data() + static_cast<size_t>(p) * V;
    double z = 0;
    for (int v = 0; v < V; ++v) z += std::exp(static_cast<double>(row[v]));
    nll += -std::log(std::exp(static_cast<double>(row[target[p]])) / z);
  }
  return nll / S;
}

// sum_window_nll on every device of a T-device mesh; device 0's result.
double sum_window_nll_on(const model::TensorWeights& w, int T, const std::vector<int>& tokens, int64_t W, bool decode) {
  double result = 0;
  dist::run_on_mesh(dist::Mesh::line(T), [&](dist::Device& dev) {
    model::Llama llama(w, dev.axis("model"));
    const double sum = engine::sum_window_nll(llama, tokens, S, W, decode);
    if (dev.rank() == 0) result = sum;
  });
  return result;
}

}  // namespace

TEST_CASE("perplexity: a window's NLL by decode is the sum of -log softmax of the decode logits") {
  const LlamaConfig c = make_config(16, 4, 2, 40, 2, 37, true);
  const auto w = random_weights(c, 31);
  const auto tokens = random_tokens(S + 1, c.vocab_size, 32);
  const std::vector<int> in(tokens.begin(), tokens.begin() + S);
  const double expected = reference_window_nll(decode_logits(w, 1, in)[0], tokens.data() + 1, c.vocab_size);
  REQUIRE(expected > 0);
  for (int T = 1; T <= 2; ++T) {
    INFO(T << " device(s)");
    double got = 0;
    dist::run_on_mesh(dist::Mesh::line(T), [&](dist::Device& dev) {
      model::Llama llama(w, dev.axis("model"));
      const double nll = engine::window_nll_by_decode(llama, in.data(), tokens.data() + 1, S);
      if (dev.rank() == 0) got = nll;
    });
    CHECK(got == Approx(expected).epsilon(1e-5));
  }
}

TEST_CASE("perplexity: windows scored by the batched forward match the decode path") {
  const LlamaConfig c = make_config(16, 4, 2, 40, 2, 37, false);
  const auto w = random_weights(c, 41);
  constexpr int64_t W = 5;  // more than one batch of windows
  const auto tokens = random_tokens(static_cast<int>(W * S + 1), c.vocab_size, 42);
  double expected = 0;
  for (int64_t i = 0; i < W; ++i) {
    const std::vector<int> in(tokens.begin() + i * S, tokens.begin() + i * S + S);
    expected += reference_window_nll(decode_logits(w, 1, in)[0], tokens.data() + i * S + 1, c.vocab_size);
  }
  CHECK(sum_window_nll_on(w, 1, tokens, W, true) == Approx(expected).epsilon(1e-5));
  CHECK(sum_window_nll_on(w, 2, tokens, W, false) == Approx(expected).epsilon(1e-4));
}

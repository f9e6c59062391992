// tpcli::engine — perplexity scoring (see perplexity.h).
#include "engine/perplexity.h"

#include <algorithm>
#include <cstddef>
#include <cmath>
#include <span>

namespace tpcli::engine {

double window_nll_by_decode(model::Llama& llama, const int* in, const int* target, int S) {
  double nll = 0;
  for (int p = 0; p < S; ++p) {
    const std::span<const float> logits = llama.forward(in[p], p);
    double top = logits[0];
    for (float l : logits) top = std::max(top, double(l));
    double z = 0;
    for (float l : logits) z += std::exp(double(l) - top);
    nll += std::log(z) + top - double(logits[size_t(target[p])]);
  }
  return nll / S;
}

double sum_window_nll(model::Llama& llama, const std::vector<int>& tokens, int S, int64_t W, bool decode) {
  constexpr int64_t B = 4;  // windows per batched pass
  double sum = 0;
  for (int64_t w0 = 0; w0 < W; w0 += B) {
    const int64_t b = std::min(B, W - w0);
    const std::span<const int> in(tokens.data() + w0 * S, static_cast<size_t>(b * S));  // targets: one further
    if (decode) {
      for (int64_t i = 0; i < b; ++i) sum += window_nll_by_decode(llama, in.data() + i * S, in.data() + i * S + 1, S);
      continue;
    }
    std::vector<int> targets;  // [b, S]: each window's next tokens
    for (int64_t i = 0; i < b; ++i) {
      const int* window = tokens.data() + (w0 + i) * S;
      targets.insert(targets.end(), window + 1, window + S + 1);
    }
    for (float nll : llama.prefill_losses(in, targets, b)) sum += nll;
  }
  return sum;
}

}  // namespace tpcli::engine

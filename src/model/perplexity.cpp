// tpcli::model — perplexity scoring (see perplexity.h).
#include "model/perplexity.h"

#include <algorithm>
#include <cmath>
#include <span>

namespace tpcli::model {

double window_nll_by_decode(Llama& llama, const int* in, const int* target, int S) {
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

double sum_window_nll(Llama& llama, const std::vector<int>& tokens, int S, int64_t W, bool decode) {
  constexpr int64_t B = 4;
  double sum = 0;
  for (int64_t w0 = 0; w0 < W; w0 += B) {
    const int b = static_cast<int>(std::min(B, W - w0));
    std::vector<int> in, target;  // [b, S] each
    for (int64_t w = w0; w < w0 + b; ++w) {
      in.insert(in.end(), tokens.begin() + w * S, tokens.begin() + w * S + S);
      target.insert(target.end(), tokens.begin() + w * S + 1, tokens.begin() + w * S + S + 1);
    }
    if (decode) {
      for (int i = 0; i < b; ++i) sum += window_nll_by_decode(llama, &in[size_t(i) * S], &target[size_t(i) * S], S);
    } else {
      sum += static_cast<double>(llama.loss(in, target, b, S)) * b;
    }
  }
  return sum;
}

}  // namespace tpcli::model

// tpcli::model — perplexity scoring (see perplexity.h).
#include "model/perplexity.h"

#include <algorithm>
#include <cstddef>
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
  double sum = 0;
  for (int64_t w = 0; w < W; ++w) {
    const int* in = tokens.data() + w * S;  // its targets are one further
    if (decode) sum += window_nll_by_decode(llama, in, in + 1, S);
    else sum += llama.prefill_loss({in, size_t(S)}, {in + 1, size_t(S)});
  }
  return sum;
}

}  // namespace tpcli::model

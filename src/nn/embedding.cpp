#include "nn/embedding.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace tpcli::nn {

void embedding_forward(float* out, const int* tokens, const float* table, int64_t N, int64_t V, int64_t C) {
  for (int64_t n = 0; n < N; ++n) {
    const int tok = tokens[n];
    if (tok < 0 || tok >= V)
      throw std::out_of_range("embedding: token " + std::to_string(tok) + " outside the vocabulary [0, " +
                              std::to_string(V) + ")");
    std::copy(table + int64_t(tok) * C, table + int64_t(tok + 1) * C, out + n * C);
  }
}

void embedding_backward(float* dtable, const float* dout, const int* tokens, int64_t N, int64_t C) {
  for (int64_t n = 0; n < N; ++n) {
    float* d = dtable + int64_t(tokens[n]) * C;
    const float* g = dout + n * C;
    for (int64_t j = 0; j < C; ++j) d[j] += g[j];
  }
}

}  // namespace tpcli::nn

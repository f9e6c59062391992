// tpcli::nn — token embedding lookup.
//
// Dimension legend: N rows (tokens), V vocabulary, C channels.
#pragma once

#include <cstdint>

namespace tpcli::nn {

// out[N, C] = table[tokens[n]]. Throws std::out_of_range naming the token when outside [0, V).
void embedding_forward(float* out, const int* tokens, const float* table, int64_t N, int64_t V, int64_t C);
// dtable[V, C] += scatter of dout[N, C] by token.
void embedding_backward(float* dtable, const float* dout, const int* tokens, int64_t N, int64_t C);

}  // namespace tpcli::nn

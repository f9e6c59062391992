// tpcli::engine — perplexity scoring: the negative log-likelihood of a text cut into windows of S
// tokens, each window's tokens predicting the next one (llama.cpp's llama-perplexity), through the
// batched prefill of a few windows at once (Llama::prefill_losses) or token by token through the decode path.
//
// Dimension legend: S window length, W windows.
#pragma once

#include <cstdint>
#include <vector>

#include "model/llama.h"

namespace tpcli::engine {

// Mean NLL of one window fed token by token through forward(): the decode path (matrix-vector
// kernels, e.g. the int8 activations of 8- and 4-bit weights, and the KV cache) rather than the
// prefill's gemm, so its numerics can be scored too.
double window_nll_by_decode(model::Llama& llama, const int* in, const int* target, int S);

// Sum over windows 0..W-1 of `tokens` (window w: tokens[w S, w S + S), its targets one further)
// of each window's mean NLL, by decode or by the batched prefill (four windows a pass). Every
// device of the llama's group calls it with the same arguments.
double sum_window_nll(model::Llama& llama, const std::vector<int>& tokens, int S, int64_t W, bool decode);

}  // namespace tpcli::engine

// tpcli::model — random weights of any shape, for benchmarks, tests and training from scratch.
#pragma once

#include <cstdint>

#include "model/llama_config.h"
#include "model/weights.h"

namespace tpcli::model {

// Every parameter of llama_parameters(config): norm gains = 1; matrices and the embedding drawn
// from N(0, 0.02^2) (GPT-2 / llama2.c's train.py init), with the residual projections wo and w2
// (and their expert forms) scaled by 1/sqrt(2 * n_layers). Deterministic: the same (config, seed)
// gives the same weights on every machine (std::mt19937_64, Box-Muller, no std::normal_distribution
// whose algorithm varies between standard libraries).
TensorWeights random_weights(const LlamaConfig& config, uint64_t seed);

}  // namespace tpcli::model

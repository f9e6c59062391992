// tpcli::model — many sequences through one inference model at once, with continuous batching:
// up to `parallel` sequences decode together, one decode_batch step per token (a weight pass for
// all of them); a sequence that finishes leaves, and the next waiting request is prefilled into its
// own KV cache and joins at the next step.
//
// Batch invariance: a request's tokens do not depend on what else runs or when it was admitted.
// Its prompt is prefilled alone (Llama::prefill_batch of that one prompt), its decode rows are
// batch-invariant (Llama::decode_batch), and its sampler is its own (seeded by the request).
//
// A collective over the model's groups: every device calls it with the same requests and gets the
// same results.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/llama.h"

namespace tpcli::model {

struct BatchRequest {
  std::vector<int> prompt;     // token ids, fed as they are (at least one)
  int max_tokens = 256;        // generated tokens at most
  float temperature = 1.0f;    // 0: greedy
  float topp = 0.9f;
  uint64_t seed = 1;           // the request's sampler (>= 1)
  std::vector<int> stop_ids;   // generation ends after one of these (it is kept in the tokens)
};

struct BatchResult {
  std::vector<int> tokens;     // generated
  std::string finish_reason;   // "stop" (a stop id), "length" (max_tokens or the context's end)
};

// Every request's result, in request order. on_finished(i) is called as request i finishes.
std::vector<BatchResult> generate_batch(Llama& llama, const std::vector<BatchRequest>& requests, int parallel,
                                        const std::function<void(size_t)>& on_finished = {});

}  // namespace tpcli::model

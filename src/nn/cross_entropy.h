// tpcli::nn — softmax cross-entropy over vocabulary-split logits.
//
// Dimension legend: N rows, V vocabulary, VL this device's vocabulary rows [v0, v0 + VL).
// Communication: two collectives of N floats (all_max of the row maxima, all_sum of the row
// exp-sums and target logits); on a size-1 group both are no-ops.
#pragma once

#include <cstdint>

#include "distributed/group.h"

namespace tpcli::nn {

// A target of IGNORED_TARGET (-1) marks a row the loss does not count (a prompt or padding token
// of supervised fine-tuning, train/sft_batches.h): its loss is 0 and its gradient 0.
constexpr int IGNORED_TARGET = -1;

// Rows of targets[N] the loss counts (target != IGNORED_TARGET).
int64_t counted_targets(const int* targets, int64_t N);

// probs[N, VL] = this device's columns of softmax(logits) (probs may alias logits);
// losses[N] = -log p(target), 0 where the target is IGNORED_TARGET. Returns the mean of losses over
// the counted rows (over all N when every row counts; 0 when none does). targets are global token ids.
float cross_entropy_forward(float* losses, float* probs, const float* logits, const int* targets, int64_t v0,
                            int64_t N, int64_t VL, dist::Group& group);
// dlogits[N, VL] += dloss * (probs - onehot(target)), dloss the gradient of each row's loss
// (1/N for the mean, 1/counted_targets when some are ignored); rows whose target is IGNORED_TARGET
// get nothing. No communication.
void cross_entropy_backward(float* dlogits, const float* probs, const int* targets, int64_t v0, int64_t N, int64_t VL,
                            float dloss);

}  // namespace tpcli::nn

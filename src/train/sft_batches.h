// tpcli::train — supervised fine-tuning batches: each step's rows are whole examples of similar
// length (train/sft_examples.h), one example per row, right-padded to the step's longest.
//
// Dimension legend: B rows of a step (batch_size * grad_accum over the whole data axis), n examples,
// T_s tokens per row of step s (the longest example of the step minus one, rounded up to
// `t_multiple`, at most seq_len), S steps per pass over the examples = ceil(n / B).
//
// Order: the examples sorted by length (ties by a key drawn from (seed, pass) when shuffling, by
// index otherwise) and cut into S consecutive batches of B (the last one is the B longest, so it
// repeats a few examples rather than mixing lengths; fewer than B examples are repeated in turn);
// step s takes batch perm(s / S)[s mod S], perm a permutation of the S batches drawn from (seed,
// pass) (the identity without shuffling). So the rows of step s are a pure function of (s, row):
// every data rank and every resumed run sees the same, and a step's T_s and counted targets are
// known on every device without communication.
//
// Row r of example tokens x[0, n): inputs x[0, n-1), targets x[1, n) with -1 where the mask does
// not count the token; then pad inputs (pad_token) with targets -1 up to T_s. Causal attention never
// crosses examples: each row holds one, its padding at the end.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "train/data.h"
#include "train/sft_examples.h"

namespace tpcli::train {

// A fine-tuning run's examples (TrainOptions::sft), encoded and fitted to train.seq_len.
struct SftData {
  std::shared_ptr<const std::vector<EncodedExample>> train;
  std::shared_ptr<const std::vector<EncodedExample>> val;  // null: no validation
  int pad_token = 0;  // the input of padding positions (their targets are -1)
};

class LengthBatches : public StepBatches {
 public:
  // Throws std::invalid_argument when there is no example, or one is longer than seq_len + 1 tokens
  // or shorter than 2 (train/sft_examples.h fit_example rules them out).
  LengthBatches(std::shared_ptr<const std::vector<EncodedExample>> examples, int batch_size, int seq_len, bool shuffle,
                uint64_t seed, int pad_token = 0, int t_multiple = 1);

  int batch_size() const override { return batch_size_; }
  int step_len(int64_t step) const override;
  void fill(int64_t step, int row_begin, int row_end, std::span<int> inputs, std::span<int> targets) const override;
  std::optional<int64_t> counted_targets(int64_t step) const override;

  // The index (into the examples) that row `row` of step `step` holds.
  size_t example_of(int64_t step, int row) const;
  int64_t steps_per_pass() const { return steps_per_pass_; }  // S

 private:
  // The example order of one pass: (S * B,) indices, batch j = [j*B, (j+1)*B), batches permuted.
  const std::vector<size_t>& pass_order(int64_t pass) const;

  std::shared_ptr<const std::vector<EncodedExample>> examples_;
  int batch_size_, seq_len_;
  bool shuffle_;
  uint64_t seed_;
  int pad_token_, t_multiple_;
  int64_t steps_per_pass_;
  mutable std::mutex mutex_;  // every device of the process asks: one cached pass
  mutable int64_t cached_pass_ = -1;
  mutable std::vector<size_t> cached_order_;
};

}  // namespace tpcli::train

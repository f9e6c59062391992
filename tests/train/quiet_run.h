// Test support for the training suites: options for a run that only trains (no evaluation, no
// progress line, no sample) on one BLIS thread per device, so tests measure what they check.
#pragma once

#include <atomic>

#include "train/loop.h"

namespace tpcli::testing {

inline void quiet_run(train::TrainOptions& o) {
  o.eval_every = 0;
  o.eval_batches = 0;
  o.progress = false;
  o.sample_tokens = 0;
  o.run.blas_threads = 1;
}

// The run `o` stopped after `steps` steps, as Ctrl-C would stop it (train.stop set from on_step):
// it writes its checkpoint and returns interrupted. `o` is as it was afterwards.
inline train::TrainResult interrupted_run(train::TrainOptions o, int64_t steps) {
  std::atomic<bool> stop{false};
  o.run.stop = &stop;
  o.on_step = [&](int64_t step, double) {
    if (step == steps - 1) stop = true;
  };
  return train::train(o);
}

}  // namespace tpcli::testing

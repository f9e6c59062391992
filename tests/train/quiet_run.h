// Test support for the training suites: options for a run that only trains (no evaluation, no
// progress line, no sample) on one BLIS thread per device, so tests measure what they check.
#pragma once

#include "train/loop.h"

namespace tpcli::testing {

inline void quiet_run(train::TrainOptions& o) {
  o.eval_every = 0;
  o.eval_batches = 0;
  o.progress = false;
  o.sample_tokens = 0;
  o.run.blas_threads = 1;
}

}  // namespace tpcli::testing

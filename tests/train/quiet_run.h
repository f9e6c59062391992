// Test support for the training suites: options for a run that only trains (no evaluation, no
// progress line, no sample) on one BLIS thread per device, so tests measure what they check.
#pragma once

#include <catch2/catch.hpp>

#include <atomic>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

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

// The loss of every step of a run.
inline std::vector<double> losses_of(const train::TrainResult& r) {
  std::vector<double> l;
  for (const auto& rec : r.records) l.push_back(rec.loss);
  return l;
}

// Runs `o` on each data x model mesh of `meshes` (with `dir`, each into its own out_dir
// dir/runDT) and checks that every mesh gives the first mesh's o.steps losses within 1e-5.
// Returns the first mesh's losses.
inline std::vector<double> same_losses_on_meshes(train::TrainOptions o, const std::vector<std::pair<int, int>>& meshes,
                                                 const std::filesystem::path& dir = {}) {
  std::vector<double> reference;
  for (auto [D, TP] : meshes) {
    o.mesh = dist::Mesh({{"data", D}, {"model", TP}});
    if (!dir.empty()) o.out_dir = (dir / ("run" + std::to_string(D) + std::to_string(TP))).string();
    const std::vector<double> losses = losses_of(train::train(o));
    REQUIRE(losses.size() == static_cast<size_t>(o.steps));
    if (reference.empty()) reference = losses;
    INFO("mesh " << D << "x" << TP);
    for (size_t i = 0; i < losses.size(); ++i) CHECK(losses[i] == Approx(reference[i]).epsilon(1e-5));
  }
  return reference;
}

}  // namespace tpcli::testing

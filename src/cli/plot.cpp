// tpcli plot RUN_DIR — rewrites RUN_DIR/loss.svg (training and validation loss by step) from
// RUN_DIR/metrics.jsonl; training writes the same file at each evaluation (train/loss_plot.h).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "train/loss_plot.h"

namespace tpcli::cli {

namespace {

void setup_plot(CLI::App& sub) {
  auto dir = std::make_shared<std::string>();
  sub.add_option("run_dir", *dir, "a training run's out_dir (holds metrics.jsonl), e.g. runs/tiny")
      ->required()
      ->type_name("RUN_DIR");
  sub.callback([dir] {
    train::LossCurves curves;
    try {
      curves = train::read_loss_curves(*dir + "/metrics.jsonl");
    } catch (const std::exception& e) {
      throw UsageError(e.what());
    }
    const std::string path = train::write_loss_plot(*dir);
    std::printf("%s: %zu training and %zu validation points\n", path.c_str(), curves.train.size(),
                curves.validation.size());
  });
}

const bool registered = register_command({"plot", "Draw a run's loss curves (RUN_DIR/loss.svg)", setup_plot});

}  // namespace

}  // namespace tpcli::cli

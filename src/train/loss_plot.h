// tpcli::train — loss.svg: a run's training and validation loss by step, drawn from its
// metrics.jsonl (one JSON object per step: "step", "loss", and "val_loss" at evaluations), as a
// self-contained SVG a browser opens. Training rewrites it at each evaluation; `tpcli plot`
// rewrites it on demand.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tpcli::train {

struct LossPoint {
  int64_t step = 0;
  double loss = 0;
};

struct LossCurves {
  std::vector<LossPoint> train;       // every step with a finite loss
  std::vector<LossPoint> validation;  // the steps with a finite val_loss
};

// The curves in a metrics.jsonl. Throws std::runtime_error naming the file and line on a line that
// is not a JSON object with a numeric "step".
LossCurves read_loss_curves(const std::string& metrics_path);

// The SVG document: both curves on shared axes, ticks, a legend and `title`.
std::string loss_svg(const LossCurves& curves, const std::string& title);

// out_dir/metrics.jsonl -> out_dir/loss.svg (written atomically). Returns the svg's path.
std::string write_loss_plot(const std::string& out_dir);

// write_loss_plot for the training loop: a plot that cannot be written is a warning on stderr,
// never a reason to stop training.
void refresh_loss_plot(const std::string& out_dir) noexcept;

}  // namespace tpcli::train

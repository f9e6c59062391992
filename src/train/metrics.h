// tpcli::train — what a run reports: out_dir/metrics.jsonl (one JSON line per step) and the
// progress line on stderr. Only the writer process (device 0) creates any of it.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "train/loop.h"

namespace tpcli::train {

// "{"step": 3, "loss": ..., "lr": ..., "grad_norm": ..., "tokens_per_s": ...[, "val_loss": ...]
// [, MoE keys]}\n"
std::string metrics_line(const StepRecord& record);
// "1h02m", "3m05s", "42s"; "?" when not finite.
std::string format_duration(double seconds);

// out_dir/metrics.jsonl. Everything written per step (and per evaluation) goes through append().
class MetricsLog {
 public:
  // Creates out_dir; a resumed run keeps the lines up to resume_step and appends after them.
  void open(const std::string& out_dir, bool resume, int64_t resume_step);
  void append(const StepRecord& record);
  bool is_open() const { return out_.is_open(); }

 private:
  std::ofstream out_;
};

// metrics.jsonl keeps one line per step: a resumed run drops the lines after the checkpoint's
// step (written before a kill, and about to be written again).
void truncate_metrics(const std::filesystem::path& metrics, int64_t last_step);

// The live progress line on stderr: rewritten in place on a terminal, one line per log_every steps
// otherwise.
struct Progress {
  bool tty = isatty(STDERR_FILENO) != 0;
  bool open_line = false;
  void line(const std::string& text);
  // A line that stays (a validation result): on a terminal, end the live line.
  void keep(const std::string& text);
  void message(const std::string& text);
};

// "step 10/100 | loss 2.1234 | lr 1.00e-03 | 12345 tok/s | ETA 5s[ | expert load ...][ | val ...]"
std::string progress_text(const StepRecord& record, int64_t total_steps, double tokens_per_s, double eta_seconds);

}  // namespace tpcli::train

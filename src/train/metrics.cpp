#include "train/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "files/atomic_file.h"

namespace tpcli::train {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  auto s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(s / 3600), static_cast<long long>(s / 60 % 60));
  else if (s >= 60)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  else
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(s));
  return buf;
}

static std::string json_number(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.7g", x);
  return buf;
}

std::string metrics_line(const StepRecord& r) {
  std::string line = "{\"step\": " + std::to_string(r.step) + ", \"loss\": " + json_number(r.loss) +
                     ", \"lr\": " + json_number(r.lr) + ", \"grad_norm\": " + json_number(r.grad_norm) +
                     ", \"tokens_per_s\": " + json_number(r.tokens_per_s);
  if (r.val_loss) line += ", \"val_loss\": " + json_number(*r.val_loss);
  if (!r.expert_tokens.empty()) {  // MoE: per-block expert loads and the traffic of device 0
    line += ", \"expert_tokens\": [";
    for (size_t l = 0; l < r.expert_tokens.size(); ++l) {
      line += l ? ", [" : "[";
      for (size_t e = 0; e < r.expert_tokens[l].size(); ++e) line += (e ? ", " : "") + std::to_string(r.expert_tokens[l][e]);
      line += "]";
    }
    line += "], \"moe_bytes_sent\": " + std::to_string(r.moe_bytes_sent) + ", \"moe_dropped\": " + std::to_string(r.moe_dropped);
  }
  return line + "}\n";
}

void truncate_metrics(const std::filesystem::path& metrics, int64_t last_step) {
  std::ifstream in(metrics);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    const auto key = line.find("\"step\": ");
    int64_t step = -1;
    if (key != std::string::npos) std::from_chars(line.data() + key + 8, line.data() + line.size(), step);
    if (step >= 0 && step <= last_step) kept += line + "\n";
  }
  in.close();
  files::write_atomically(metrics.string(), [&](std::ostream& out) { out << kept; });
}

void MetricsLog::open(const std::string& out_dir, bool resume, int64_t resume_step) {
  const auto path = std::filesystem::path(out_dir) / "metrics.jsonl";
  if (resume) truncate_metrics(path, resume_step);
  out_.open(path, resume ? std::ios::app : std::ios::trunc);
  if (!out_) throw std::runtime_error(out_dir + "/metrics.jsonl: cannot open for writing");
}

void MetricsLog::append(const StepRecord& record) {
  if (out_.is_open()) out_ << metrics_line(record) << std::flush;
}

void Progress::line(const std::string& text) {
  if (tty) {
    std::fprintf(stderr, "\r\033[K%s", text.c_str());
    open_line = true;
  } else {
    std::fprintf(stderr, "%s\n", text.c_str());
  }
  std::fflush(stderr);
}

void Progress::keep(const std::string& text) {
  line(text);
  if (tty) std::fputc('\n', stderr);
  open_line = false;
}

void Progress::message(const std::string& text) {
  if (open_line) std::fputc('\n', stderr);
  open_line = false;
  std::fprintf(stderr, "%s\n", text.c_str());
  std::fflush(stderr);
}

std::string progress_text(const StepRecord& rec, int64_t total_steps, double tokens_per_s, double eta_seconds) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "step %lld/%lld | loss %.4f | lr %.2e | %.0f tok/s | ETA %s",
                static_cast<long long>(rec.step), static_cast<long long>(total_steps), rec.loss, rec.lr, tokens_per_s,
                format_duration(eta_seconds).c_str());
  if (!rec.expert_tokens.empty()) {  // MoE: the busiest expert's load over an even share
    double worst = 0;
    for (const auto& counts : rec.expert_tokens) {
      int64_t total = 0, most = 0;
      for (int64_t c : counts) total += c, most = std::max(most, c);
      if (total > 0) worst = std::max(worst, static_cast<double>(most) * counts.size() / total);
    }
    std::snprintf(buf + std::strlen(buf), sizeof buf - std::strlen(buf), " | expert load max %.2fx even", worst);
  }
  if (rec.val_loss) std::snprintf(buf + std::strlen(buf), sizeof buf - std::strlen(buf), " | val %.4f", *rec.val_loss);
  return buf;
}

}  // namespace tpcli::train

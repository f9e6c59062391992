#include "train/loss_guard.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <vector>

namespace tpcli::train {

LossGuard::LossGuard(int vocab_size) : uniform_loss_(std::log(std::max(vocab_size, 2))) {}

double LossGuard::bar() const {
  double reference = uniform_loss_;
  if (!recent_.empty()) {
    std::vector<double> sorted(recent_.begin(), recent_.end());
    std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(sorted.size() / 2), sorted.end());
    reference = std::max(reference, sorted[sorted.size() / 2]);
  }
  return SPIKE_FACTOR * reference;
}

std::string LossGuard::unsound(double loss, double norm) const {
  char text[160];
  if (!std::isfinite(loss) || !std::isfinite(norm)) {
    std::snprintf(text, sizeof text, "loss %g, gradient norm %g", loss, norm);
    return text;
  }
  if (loss <= bar()) return "";
  std::snprintf(text, sizeof text, "loss %g, more than %g x %g (the median recent loss, or ln(vocab_size) if larger)",
                loss, SPIKE_FACTOR, bar() / SPIKE_FACTOR);
  return text;
}

void LossGuard::add(double loss) {
  if (!std::isfinite(loss)) return;
  recent_.push_back(loss);
  if (recent_.size() > RECENT_STEPS) recent_.pop_front();
}

}  // namespace tpcli::train

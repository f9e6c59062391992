#include "model/weights_view.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace tpcli::model {

void WeightsView::limit_context(int positions) {
  if (positions < 1) throw std::invalid_argument("context " + std::to_string(positions) + " must be >= 1");
  config_.seq_len = std::min(config_.seq_len, positions);
}

void WeightsView::as_f32() {
  f32_only_ = true;
  config_.quantization.reset();
}

std::optional<StoredTensor> WeightsView::stored(const std::string& name) const {
  if (f32_only_) return std::nullopt;
  return inner_->stored(name);
}

}  // namespace tpcli::model

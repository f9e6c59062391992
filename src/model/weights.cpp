#include "model/weights.h"

#include <malloc.h>

#include <stdexcept>

namespace tpcli::model {

std::span<const float> TensorWeights::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw std::out_of_range("weights: no parameter named '" + name + "'");
  return it->second.span();
}

void DevicesBuilding::built() {
  if (left_.fetch_sub(1) != 1) return;
  weights_.release_conversions();
  weights_.release_all_pages();
  ::malloc_trim(0);
}

}  // namespace tpcli::model

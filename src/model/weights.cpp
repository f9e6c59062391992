#include "model/weights.h"

#include <stdexcept>

namespace tpcli::model {

std::span<const float> TensorWeights::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw std::out_of_range("weights: no parameter named '" + name + "'");
  return it->second.span();
}

}  // namespace tpcli::model

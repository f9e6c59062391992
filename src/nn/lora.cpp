#include "nn/lora.h"

#include <stdexcept>

namespace tpcli::nn {

LoraAdapter make_lora_adapter(tensor::Tensor a, tensor::Tensor b, double alpha) {
  if (a.rank() != 2 || b.rank() != 2 || a.dim(0) < 1 || b.dim(1) != a.dim(0))
    throw std::invalid_argument("lora: A " + tensor::to_string(a.shape()) + " and B " + tensor::to_string(b.shape()) +
                                " are not [r, IN] and [OUT, r]");
  LoraAdapter ad;
  ad.scale = static_cast<float>(alpha / static_cast<double>(a.dim(0)));
  ad.a_grad = tensor::Tensor(a.shape());
  ad.b_grad = tensor::Tensor(b.shape());
  ad.a = std::move(a);
  ad.b = std::move(b);
  return ad;
}

}  // namespace tpcli::nn

// Test support: the instruction sets this CPU can run, lowest first (every kernel test runs each).
#pragma once

#include <vector>

#include "tensor/isa.h"

namespace tpcli::testing {

inline std::vector<tensor::Isa> isas_here() {
  std::vector<tensor::Isa> isas = {tensor::Isa::Scalar};
  if (tensor::detected_isa() != tensor::Isa::Scalar) isas.push_back(tensor::Isa::Avx2);
  if (tensor::detected_isa() == tensor::Isa::Avx512) isas.push_back(tensor::Isa::Avx512);
  return isas;
}

}  // namespace tpcli::testing

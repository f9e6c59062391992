#include "formats/dtype.h"

#include <cstring>
#include <stdexcept>

#include "tensor/quant_formats.h"

namespace tpcli::formats {

using model::DType;

int dtype_bytes(DType dtype) {
  switch (dtype) {
    case DType::F32: case DType::U32: return 4;
    case DType::F16: case DType::BF16: return 2;
    case DType::U8: return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::U32: return "U32";
    case DType::U8: return "U8";
  }
  return "?";
}

std::optional<DType> dtype_from_name(const std::string& name) {
  for (DType d : {DType::F32, DType::F16, DType::BF16, DType::U32, DType::U8})
    if (name == dtype_name(d)) return d;
  return std::nullopt;
}

bool is_float(DType dtype) { return dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16; }

void to_f32(float* out, const void* src, DType dtype, int64_t n) {
  switch (dtype) {
    case DType::F32:
      std::memcpy(out, src, static_cast<size_t>(n) * 4);
      return;
    case DType::BF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) out[i] = tensor::bf16_to_f32(h[i]);
      return;
    }
    case DType::F16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) out[i] = tensor::f16_to_f32(h[i]);
      return;
    }
    default:
      throw std::invalid_argument(std::string("dtype ") + dtype_name(dtype) + " is not a float type");
  }
}

void from_f32(void* out, const float* src, DType dtype, int64_t n) {
  switch (dtype) {
    case DType::F32:
      std::memcpy(out, src, static_cast<size_t>(n) * 4);
      return;
    case DType::BF16: {
      auto* h = static_cast<uint16_t*>(out);
      for (int64_t i = 0; i < n; ++i) h[i] = tensor::f32_to_bf16(src[i]);
      return;
    }
    case DType::F16: {
      auto* h = static_cast<uint16_t*>(out);
      for (int64_t i = 0; i < n; ++i) h[i] = tensor::f32_to_f16(src[i]);
      return;
    }
    default:
      throw std::invalid_argument(std::string("dtype ") + dtype_name(dtype) + " is not a float type");
  }
}

}  // namespace tpcli::formats

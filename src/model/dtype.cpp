#include "model/dtype.h"

#include <bit>
#include <cstring>
#include <stdexcept>

namespace tpcli::model {

// IEEE half precision. clang 14 (the fuzz build, make fuzz) has no _Float16 on x86-64 without
// AVX512-FP16; its __fp16 storage type converts the same way (exactly to float, nearest-even back).
#if defined(__clang__) && __clang_major__ < 15
using Half = __fp16;
#else
using Half = _Float16;
#endif


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

namespace {

float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

uint16_t f32_to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN stays NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);                 // round to nearest even
}

}  // namespace

void to_f32(float* out, const void* src, DType dtype, int64_t n) {
  switch (dtype) {
    case DType::F32:
      std::memcpy(out, src, static_cast<size_t>(n) * 4);
      return;
    case DType::BF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(h[i]);
      return;
    }
    case DType::F16: {  // gcc's _Float16 converts exactly (subnormals, inf, NaN included)
      const auto* h = static_cast<const Half*>(src);
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(h[i]);
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
      for (int64_t i = 0; i < n; ++i) h[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::F16: {
      auto* h = static_cast<Half*>(out);
      for (int64_t i = 0; i < n; ++i) h[i] = static_cast<Half>(src[i]);
      return;
    }
    default:
      throw std::invalid_argument(std::string("dtype ") + dtype_name(dtype) + " is not a float type");
  }
}

}  // namespace tpcli::model

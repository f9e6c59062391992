// tpcli::tensor — the plain C++ 16-bit row kernels and the choice of set (see half_rows.h).
// Built with -ffp-contract=off: the sequence is the explicit std::fma calls, nothing fused besides.
#include "tensor/half_rows.h"

#include <cmath>

#include "tensor/quant_formats.h"

namespace tpcli::tensor {

namespace {

constexpr int LANES = 16;

template <HalfKind Kind>
float widen(uint16_t bits) {
  if constexpr (Kind == HalfKind::BF16) return bf16_to_f32(bits);
  else return f16_to_f32(bits);
}

template <HalfKind Kind>
void scalar_dots(float* out, const float* x, const uint16_t* rows, int64_t n, int64_t stride, int64_t len, float divisor) {
  for (int64_t j = 0; j < n; ++j) {
    const uint16_t* row = rows + j * stride;
    float acc[LANES] = {};
    for (int64_t i = 0; i < len; ++i) acc[i % LANES] = std::fma(x[i], widen<Kind>(row[i]), acc[i % LANES]);
    for (int width = LANES / 2; width >= 1; width /= 2)
      for (int l = 0; l < width; ++l) acc[l] += acc[l + width];
    out[j] = acc[0] / divisor;
  }
}

template <HalfKind Kind>
void scalar_weighted_sum(float* y, const float* a, const uint16_t* rows, int64_t n, int64_t stride, int64_t len) {
  for (int64_t j = 0; j < n; ++j) {
    const uint16_t* row = rows + j * stride;
    for (int64_t i = 0; i < len; ++i) y[i] = std::fma(a[j], widen<Kind>(row[i]), y[i]);
  }
}

}  // namespace

HalfKernel scalar_half_kernel(HalfKind kind) {
  if (kind == HalfKind::BF16) return {scalar_dots<HalfKind::BF16>, scalar_weighted_sum<HalfKind::BF16>};
  return {scalar_dots<HalfKind::F16>, scalar_weighted_sum<HalfKind::F16>};
}

HalfKernel half_kernel_for(HalfKind kind, Isa isa) {
  HalfKernel k;
  if (isa == Isa::Avx512) k = avx512_half_kernel(kind);
  if (!k.dots && (isa == Isa::Avx512 || isa == Isa::Avx2)) k = avx2_half_kernel(kind);
  if (!k.dots) k = scalar_half_kernel(kind);
  return k;
}

const HalfKernel& half_kernel(HalfKind kind) {
  static const HalfKernel bf16 = half_kernel_for(HalfKind::BF16, detected_isa());
  static const HalfKernel f16 = half_kernel_for(HalfKind::F16, detected_isa());
  return kind == HalfKind::BF16 ? bf16 : f16;
}

void f32_to_half(uint16_t* out, const float* in, int64_t n, HalfKind kind) {
  if (kind == HalfKind::BF16)
    for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(in[i]);
  else
    for (int64_t i = 0; i < n; ++i) out[i] = f32_to_f16(in[i]);
}

void half_to_f32(float* out, const uint16_t* in, int64_t n, HalfKind kind) {
  if (kind == HalfKind::BF16)
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(in[i]);
  else
    for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(in[i]);
}

}  // namespace tpcli::tensor

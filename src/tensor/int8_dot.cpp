// Activation quantization for the integer affine kernels, the plain C++ kernel (the reference the
// SIMD ones must equal bit for bit, and the fallback), and the choice of kernel by instruction set.
// Built with -ffp-contract=off (CMakeLists.txt): the float sequence in int8_dot.h is part of the
// contract, so the compiler must not fuse a multiply and an add that the SIMD kernels keep apart.
#include "tensor/int8_dot.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tpcli::tensor::kernels {

namespace {

// Quantizes one group: codes xq[GS], returns the scale (0 for an all-zero group, NaN when the
// group holds a non-finite value, so the row's output is not finite either).
float quantize_group(int8_t* xq, int32_t& xqsum, const float* x, int64_t GS) {
  float amax = 0.0f;
  bool finite = true;
  for (int64_t i = 0; i < GS; ++i) {
    finite = finite && std::isfinite(x[i]);
    amax = std::max(amax, std::fabs(x[i]));
  }
  xqsum = 0;
  if (!finite || amax == 0.0f) {
    std::fill(xq, xq + GS, int8_t{0});
    return finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
  }
  const float inverse = 127.0f / amax;
  for (int64_t i = 0; i < GS; ++i) {
    // |x * inverse| <= 127 up to one rounding, so the clamp only guards that rounding.
    const float q = std::clamp(std::nearbyint(x[i] * inverse), -127.0f, 127.0f);
    xq[i] = static_cast<int8_t>(q);
    xqsum += xq[i];
  }
  return amax / 127.0f;
}

// Per run of 32 codes: the 16 even ones, then the 16 odd ones.
void to_nibble_order(int8_t* xq, int64_t cols) {
  int8_t run[32];
  for (int64_t c = 0; c < cols; c += 32) {
    for (int j = 0; j < 16; ++j) {
      run[j] = xq[c + 2 * j];
      run[16 + j] = xq[c + 2 * j + 1];
    }
    std::copy(run, run + 32, xq + c);
  }
}

// The group's contribution t[r, g] (int8_dot.h), exactly as the SIMD kernels round it.
float group_term(float scale, float xscale, int32_t idot, float bias, float xsum) {
  return std::fma(scale, xscale * static_cast<float>(idot), bias * xsum);
}

// The 8 lane accumulators summed in the order of an AVX2 horizontal add (int8_dot.h).
float sum8(const float* a) { return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])); }

template <int Bits>
int32_t group_dot(const uint8_t* row, const int8_t* xq, int64_t c0, int64_t GS) {
  int32_t d = 0;
  for (int64_t c = c0; c < c0 + GS; ++c) {
    const int32_t code = Bits == 8 ? row[c] : (c & 1 ? row[c / 2] >> 4 : row[c / 2] & 15);
    d += code * xq[c];
  }
  return d;
}

template <int Bits>
void int8_rows_scalar(float* out, const View& w, const QuantizedInput& x, int64_t r0, int64_t r1) {
  const int64_t GS = w.format.group_size, G = w.cols / GS;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.data + r * w.row_bytes;
    float acc[8] = {};
    // Groups past G would add t = +0, which changes no accumulator (none is ever -0).
    for (int64_t g = 0; g < G; ++g) {
      const int32_t idot = group_dot<Bits>(row, x.xq.data(), g * GS, GS);
      acc[g % 8] += group_term(w.scales[r * G + g], x.xscale[g], idot, w.biases[r * G + g], x.xsum[g]);
    }
    out[r - r0] = sum8(acc);
  }
}

}  // namespace

void quantize_input(QuantizedInput& out, const float* x, int64_t cols, int64_t group_size, bool nibble_order) {
  const int64_t G = cols / group_size, GP = (G + 15) / 16 * 16;
  out.cols = cols;
  out.group_size = group_size;
  out.xq.resize(static_cast<size_t>(cols));
  out.xscale.assign(static_cast<size_t>(GP), 0.0f);
  out.xsum.assign(static_cast<size_t>(GP), 0.0f);
  out.xqsum.assign(static_cast<size_t>(GP), 0);
  for (int64_t g = 0; g < G; ++g) {
    const float* xg = x + g * group_size;
    float sum = 0.0f;  // in column order: the same on every device that holds the group
    for (int64_t i = 0; i < group_size; ++i) sum += xg[i];
    out.xsum[static_cast<size_t>(g)] = sum;
    out.xscale[static_cast<size_t>(g)] =
        quantize_group(out.xq.data() + g * group_size, out.xqsum[static_cast<size_t>(g)], xg, group_size);
  }
  if (nibble_order) to_nibble_order(out.xq.data(), cols);
}

Int8Kernel scalar_int8_kernel(const WeightFormat& f) {
  if (!int8_matvec_format(f)) return {};
  return {false, f.bits == 8 ? int8_rows_scalar<8> : int8_rows_scalar<4>};
}

Int8Kernel int8_kernel_for(const WeightFormat& f, Isa isa) {
  Int8Kernel k;
  if (isa == Isa::Avx512) k = avx512_int8_kernel(f);
  if (!k.rows && (isa == Isa::Avx512 || isa == Isa::Avx2)) k = avx2_int8_kernel(f);
  if (!k.rows) k = scalar_int8_kernel(f);
  return k;
}

}  // namespace tpcli::tensor::kernels

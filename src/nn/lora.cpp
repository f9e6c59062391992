#include "nn/lora.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "tensor/blas.h"

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

using tensor::Trans;

namespace {
bool present(std::span<const LoraAdapter> adapters, size_t i) { return i < adapters.size() && !adapters[i].a.empty(); }
int64_t total(std::span<const int64_t> rows) {
  int64_t n = 0;
  for (int64_t r : rows) n += r;
  return n;
}
}  // namespace

int64_t lora_rank_sum(std::span<const LoraAdapter> adapters) {
  int64_t R = 0;
  for (const auto& a : adapters) R += a.a.empty() ? 0 : a.rank();
  return R;
}

void lora_parts_forward(float* out, const float* inp, int64_t N, int64_t IN, std::span<const int64_t> rows,
                        std::span<const LoraAdapter> adapters) {
  const int64_t OUT_local = total(rows);
  std::vector<float> xa;
  int64_t col = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (present(adapters, i) && rows[i] > 0) {
      const LoraAdapter& ad = adapters[i];
      const int64_t r = ad.rank();
      xa.resize(static_cast<size_t>(N * r));  // [N, r] = inp A^T
      tensor::gemm(Trans::No, Trans::Yes, N, r, IN, 1.0f, inp, IN, ad.a.data(), IN, 0.0f, xa.data(), r);
      // out[:, part] += scale * xa B^T
      tensor::gemm(Trans::No, Trans::Yes, N, rows[i], r, ad.scale, xa.data(), r, ad.b.data(), r, 1.0f, out + col,
                   OUT_local);
    }
    col += rows[i];
  }
}

void lora_parts_output_gradients(float* dxa, const float* dout, const float* inp, int64_t N, int64_t IN,
                                 std::span<const int64_t> rows, std::span<LoraAdapter> adapters) {
  const int64_t OUT_local = total(rows), R = lora_rank_sum(adapters);
  std::vector<float> xa;
  int64_t col = 0, k = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (present(adapters, i)) {
      LoraAdapter& ad = adapters[i];
      const int64_t r = ad.rank();
      if (rows[i] == 0) {
        for (int64_t n = 0; n < N; ++n) std::fill(dxa + n * R + k, dxa + n * R + k + r, 0.0f);
      } else {
        // dxa[:, k : k + r] = scale * dout[:, part] @ B[rows, r]
        tensor::gemm(Trans::No, Trans::No, N, r, rows[i], ad.scale, dout + col, OUT_local, ad.b.data(), r, 0.0f, dxa + k,
                     R);
        xa.resize(static_cast<size_t>(N * r));  // inp A^T, recomputed
        tensor::gemm(Trans::No, Trans::Yes, N, r, IN, 1.0f, inp, IN, ad.a.data(), IN, 0.0f, xa.data(), r);
        // dB[rows, r] += scale * dout[:, part]^T @ xa
        tensor::gemm(Trans::Yes, Trans::No, rows[i], r, N, ad.scale, dout + col, OUT_local, xa.data(), r, 1.0f,
                     ad.b_grad.data(), r);
      }
      k += r;
    }
    col += rows[i];
  }
}

void lora_parts_input_gradients(float* dinp, const float* dxa, const float* inp, int64_t N, int64_t IN,
                                std::span<LoraAdapter> adapters) {
  const int64_t R = lora_rank_sum(adapters);
  int64_t k = 0;
  for (auto& ad : adapters) {
    if (ad.a.empty()) continue;
    const int64_t r = ad.rank();
    if (dinp)  // dinp[N, IN] += dxa[:, k : k + r] @ A[r, IN]
      tensor::gemm(Trans::No, Trans::No, N, IN, r, 1.0f, dxa + k, R, ad.a.data(), IN, 1.0f, dinp, IN);
    // dA[r, IN] += dxa[:, k : k + r]^T @ inp
    tensor::gemm(Trans::Yes, Trans::No, r, IN, N, 1.0f, dxa + k, R, inp, IN, 1.0f, ad.a_grad.data(), IN);
    k += r;
  }
}

void lora_partial_xa(float* xa, const float* inp, int64_t N, const LoraAdapter& ad) {
  const int64_t IN = ad.a.dim(1), r = ad.rank();
  if (IN > 0) tensor::gemm(Trans::No, Trans::Yes, N, r, IN, 1.0f, inp, IN, ad.a.data(), IN, 0.0f, xa, r);
}

void lora_add_output(float* out, const float* xa, int64_t N, const LoraAdapter& ad) {
  const int64_t OUT = ad.b.dim(0), r = ad.rank();
  tensor::gemm(Trans::No, Trans::Yes, N, OUT, r, ad.scale, xa, r, ad.b.data(), r, 1.0f, out, OUT);
}

void lora_mirrored_backward(float* dinp, const float* dout, const float* xa, const float* inp, int64_t N,
                            LoraAdapter& ad) {
  const int64_t OUT = ad.b.dim(0), IN = ad.a.dim(1), r = ad.rank();
  std::vector<float> dxa(static_cast<size_t>(N * r));  // [N, r] = scale * dout B
  tensor::gemm(Trans::No, Trans::No, N, r, OUT, ad.scale, dout, OUT, ad.b.data(), r, 0.0f, dxa.data(), r);
  // dB[OUT, r] += scale * dout^T xa
  tensor::gemm(Trans::Yes, Trans::No, OUT, r, N, ad.scale, dout, OUT, xa, r, 1.0f, ad.b_grad.data(), r);
  if (IN == 0) return;
  if (dinp)  // dinp[N, IN_local] += dxa A_local
    tensor::gemm(Trans::No, Trans::No, N, IN, r, 1.0f, dxa.data(), r, ad.a.data(), IN, 1.0f, dinp, IN);
  // dA_local[r, IN_local] += dxa^T inp
  tensor::gemm(Trans::Yes, Trans::No, r, IN, N, 1.0f, dxa.data(), r, inp, IN, 1.0f, ad.a_grad.data(), IN);
}

}  // namespace tpcli::nn

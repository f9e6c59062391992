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

// Up to four rows of out[N, r] (`rows` of them) for columns [j, j + W) of a skinny product, and
// their share of the weight gradient (below). W is 8 (one AVX2 register) or the rank's remainder;
// OUT and GRAD say which of the two products to form (compile-time, so the loop keeps its registers).
template <int W, bool OUT, bool GRAD>
void skinny_block(float* out, int64_t ld_out, float* w_grad, const float* in, int64_t ld_in, const float* w,
                  const float* xs, int64_t rows, int64_t K, int64_t r, int64_t j, int64_t width, float scale) {
  constexpr int ROWS = 4;
  const int64_t cols = W == 8 ? 8 : width;
  float acc[ROWS][W] = {}, x[ROWS][W] = {};  // x: scale * xs's rows (zero past `rows`)
  if (GRAD)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t c = 0; c < cols; ++c) x[i][c] = scale * xs[i * r + j + c];
  for (int64_t k = 0; k < K; ++k) {
    float d[ROWS];
    for (int i = 0; i < ROWS; ++i) d[i] = i < rows ? in[i * ld_in + k] : 0.0f;
    if (OUT) {
      float wv[W] = {};
      for (int64_t c = 0; c < cols; ++c) wv[c] = w[k * r + j + c];
      for (int i = 0; i < ROWS; ++i)
        for (int c = 0; c < W; ++c) acc[i][c] += d[i] * wv[c];
    }
    if (GRAD) {
      float* gk = w_grad + k * r + j;
      float g[W] = {};
      for (int64_t c = 0; c < cols; ++c) g[c] = gk[c];
      for (int i = 0; i < ROWS; ++i)
        for (int c = 0; c < W; ++c) g[c] += d[i] * x[i][c];
      for (int64_t c = 0; c < cols; ++c) gk[c] = g[c];
    }
  }
  if (OUT)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t c = 0; c < cols; ++c) out[i * ld_out + j + c] = scale * acc[i][c];
}

template <bool OUT, bool GRAD>
void skinny_rows(float* out, int64_t ld_out, float* w_grad, const float* in, int64_t ld_in, const float* w,
                 const float* xs, int64_t N, int64_t K, int64_t r, float scale) {
  for (int64_t n = 0; n < N; n += 4) {
    const int64_t rows = std::min<int64_t>(4, N - n);
    float* out_rows = OUT ? out + n * ld_out : nullptr;
    const float* xs_rows = GRAD ? xs + n * r : nullptr;
    for (int64_t j = 0; j < r; j += 8) {
      const int64_t width = std::min<int64_t>(8, r - j);
      if (width == 8)
        skinny_block<8, OUT, GRAD>(out_rows, ld_out, w_grad, in + n * ld_in, ld_in, w, xs_rows, rows, K, r, j, 8, scale);
      else
        skinny_block<7, OUT, GRAD>(out_rows, ld_out, w_grad, in + n * ld_in, ld_in, w, xs_rows, rows, K, r, j, width, scale);
    }
  }
}

// out[N, r] (row stride ld_out) = scale * in[N, K] (row stride ld_in) @ w[K, r] (out may be null:
// none); and, when w_grad is given, w_grad[K, r] += scale * in^T @ xs[N, r] in the same pass over `in`.
// A LoRA adapter's products with its rank r as the narrow side: as gemms each reads all of `in` for
// r columns of work, at a fraction of BLIS's rate; here four rows of `in` meet each row of w in
// registers.
void skinny_products(float* out, int64_t ld_out, float* w_grad, const float* in, int64_t ld_in, const float* w,
                     const float* xs, int64_t N, int64_t K, int64_t r, float scale) {
  if (out && w_grad) skinny_rows<true, true>(out, ld_out, w_grad, in, ld_in, w, xs, N, K, r, scale);
  else if (out) skinny_rows<true, false>(out, ld_out, w_grad, in, ld_in, w, xs, N, K, r, scale);
  else if (w_grad) skinny_rows<false, true>(out, ld_out, w_grad, in, ld_in, w, xs, N, K, r, scale);
}

// xa[N, r] = inp[N, IN] @ A^T (A [r, IN], transposed once into `at` so its rows meet inp's).
void input_times_a_t(float* xa, const float* inp, int64_t N, int64_t IN, const LoraAdapter& ad, std::vector<float>& at) {
  const int64_t r = ad.rank();
  at.resize(static_cast<size_t>(IN * r));
  for (int64_t k = 0; k < r; ++k)
    for (int64_t i = 0; i < IN; ++i) at[static_cast<size_t>(i * r + k)] = ad.a[k * IN + i];
  skinny_products(xa, r, nullptr, inp, IN, at.data(), nullptr, N, IN, r, 1.0f);
}

// dinp[N, IN] += (dxa[N, r] (row stride ld_dxa) @ A) * the adapter's dropout mask.
void add_lora_input_gradient(const LoraAdapter& ad, float* dinp, const float* dxa, int64_t ld_dxa, int64_t N, int64_t IN) {
  const int64_t r = ad.rank();
  if (!ad.drops()) {
    tensor::gemm(Trans::No, Trans::No, N, IN, r, 1.0f, dxa, ld_dxa, ad.a.data(), IN, 1.0f, dinp, IN);
    return;
  }
  std::vector<float> g(static_cast<size_t>(N * IN));  // [N, IN]
  tensor::gemm(Trans::No, Trans::No, N, IN, r, 1.0f, dxa, ld_dxa, ad.a.data(), IN, 0.0f, g.data(), IN);
  lora_input_gradient(ad, g.data(), N, IN);
  for (int64_t i = 0; i < N * IN; ++i) dinp[i] += g[static_cast<size_t>(i)];
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
  std::vector<float> xa, dropped, at;
  int64_t col = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (present(adapters, i) && rows[i] > 0) {
      const LoraAdapter& ad = adapters[i];
      const int64_t r = ad.rank();
      const float* x = lora_input(ad, inp, N, IN, dropped);
      xa.resize(static_cast<size_t>(N * r));  // [N, r] = x A^T
      input_times_a_t(xa.data(), x, N, IN, ad, at);
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
  std::vector<float> xa, dropped, at;
  int64_t col = 0, k = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (present(adapters, i)) {
      LoraAdapter& ad = adapters[i];
      const int64_t r = ad.rank();
      if (rows[i] == 0) {
        for (int64_t n = 0; n < N; ++n) std::fill(dxa + n * R + k, dxa + n * R + k + r, 0.0f);
      } else {
        xa.resize(static_cast<size_t>(N * r));  // x A^T, recomputed
        input_times_a_t(xa.data(), lora_input(ad, inp, N, IN, dropped), N, IN, ad, at);
        // dxa[:, k : k + r] = scale * dout[:, part] @ B[rows, r]; dB[rows, r] += scale * dout[:, part]^T @ xa
        skinny_products(dxa + k, R, ad.b_grad.data(), dout + col, OUT_local, ad.b.data(), xa.data(), N, rows[i], r,
                        ad.scale);
      }
      k += r;
    }
    col += rows[i];
  }
}

void lora_parts_input_gradients(float* dinp, const float* dxa, const float* inp, int64_t N, int64_t IN,
                                std::span<LoraAdapter> adapters) {
  const int64_t R = lora_rank_sum(adapters);
  std::vector<float> dropped;
  int64_t k = 0;
  for (auto& ad : adapters) {
    if (ad.a.empty()) continue;
    const int64_t r = ad.rank();
    if (dinp) add_lora_input_gradient(ad, dinp, dxa + k, R, N, IN);  // dinp += (dxa[:, k : k + r] @ A) * mask
    // dA[r, IN] += dxa[:, k : k + r]^T @ x
    tensor::gemm(Trans::Yes, Trans::No, r, IN, N, 1.0f, dxa + k, R, lora_input(ad, inp, N, IN, dropped), IN, 1.0f,
                 ad.a_grad.data(), IN);
    k += r;
  }
}

void lora_partial_xa(float* xa, const float* inp, int64_t N, const LoraAdapter& ad) {
  const int64_t IN = ad.a.dim(1);
  if (IN == 0) return;
  std::vector<float> dropped, at;
  input_times_a_t(xa, lora_input(ad, inp, N, IN, dropped), N, IN, ad, at);
}

void lora_add_output(float* out, const float* xa, int64_t N, const LoraAdapter& ad) {
  const int64_t OUT = ad.b.dim(0), r = ad.rank();
  tensor::gemm(Trans::No, Trans::Yes, N, OUT, r, ad.scale, xa, r, ad.b.data(), r, 1.0f, out, OUT);
}

void lora_mirrored_backward(float* dinp, const float* dout, const float* xa, const float* inp, int64_t N,
                            LoraAdapter& ad) {
  const int64_t OUT = ad.b.dim(0), IN = ad.a.dim(1), r = ad.rank();
  std::vector<float> dxa(static_cast<size_t>(N * r));  // [N, r] = scale * dout B; dB[OUT, r] += scale * dout^T xa
  skinny_products(dxa.data(), r, ad.b_grad.data(), dout, OUT, ad.b.data(), xa, N, OUT, r, ad.scale);
  if (IN == 0) return;
  if (dinp) add_lora_input_gradient(ad, dinp, dxa.data(), r, N, IN);  // dinp_local += (dxa A_local) * mask
  // dA_local[r, IN_local] += dxa^T x
  std::vector<float> dropped;
  tensor::gemm(Trans::Yes, Trans::No, r, IN, N, 1.0f, dxa.data(), r, lora_input(ad, inp, N, IN, dropped), IN, 1.0f,
               ad.a_grad.data(), IN);
}

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

namespace {

// mask[j] for row n: 0 or 1 / (1 - p), from the element's global indices.
void fill_mask(const LoraAdapter& ad, int64_t n, int64_t IN, std::vector<float>& mask) {
  const uint64_t row_key = mix64(mix64(ad.pass_seed ^ ad.stream) + static_cast<uint64_t>(ad.row_offset + n));
  const auto threshold = static_cast<uint64_t>(static_cast<double>(ad.dropout) * 0x1.0p24);
  const float keep = 1.0f / (1.0f - ad.dropout);
  mask.resize(static_cast<size_t>(IN));
  for (int64_t j = 0; j < IN; ++j)
    mask[static_cast<size_t>(j)] = (mix64(row_key + static_cast<uint64_t>(ad.column_offset + j)) >> 40) < threshold ? 0.0f : keep;
}

}  // namespace

const float* lora_input(const LoraAdapter& ad, const float* inp, int64_t N, int64_t IN, std::vector<float>& scratch) {
  if (!ad.drops()) return inp;
  scratch.resize(static_cast<size_t>(N * IN));
  std::vector<float> mask;
  for (int64_t n = 0; n < N; ++n) {
    fill_mask(ad, n, IN, mask);
    for (int64_t j = 0; j < IN; ++j) scratch[static_cast<size_t>(n * IN + j)] = inp[n * IN + j] * mask[static_cast<size_t>(j)];
  }
  return scratch.data();
}

void lora_input_gradient(const LoraAdapter& ad, float* g, int64_t N, int64_t IN) {
  if (!ad.drops()) return;
  std::vector<float> mask;
  for (int64_t n = 0; n < N; ++n) {
    fill_mask(ad, n, IN, mask);
    for (int64_t j = 0; j < IN; ++j) g[n * IN + j] *= mask[static_cast<size_t>(j)];
  }
}

}  // namespace tpcli::nn

#include "nn/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "tensor/blas.h"
#include "tensor/half_rows.h"
#include "tensor/vec_math.h"

namespace tpcli::nn {

int kv_dtype_bytes(KvDtype dtype) { return dtype == KvDtype::F32 ? 4 : 2; }

const char* kv_dtype_name(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::F32: return "f32";
    case KvDtype::BF16: return "bf16";
    case KvDtype::F16: return "f16";
  }
  return "?";
}

std::optional<KvDtype> kv_dtype_from_name(std::string_view name) {
  for (KvDtype d : {KvDtype::F32, KvDtype::BF16, KvDtype::F16})
    if (name == kv_dtype_name(d)) return d;
  return std::nullopt;
}

namespace {

// In-place softmax over x[0..n), llama2.c's order.
void softmax(float* x, int64_t n) {
  float max_val = x[0];
  for (int64_t i = 1; i < n; ++i) max_val = std::max(max_val, x[i]);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = expf(x[i] - max_val);
    sum += x[i];
  }
  for (int64_t i = 0; i < n; ++i) x[i] /= sum;
}

// Training's softmax of one row of scores: row[0..seen) <- softmax(row * scale) (the max taken
// before scaling: scale > 0), eight lanes at a time (tensor/vec_math.h); row[seen..T) <- 0.
void causal_softmax_row(float* row, int64_t seen, int64_t T, float scale) {
  const float max_val = tensor::max_of(row, seen);
  const float inv_sum = 1.0f / tensor::exp_sum(row, row, seen, scale, max_val * scale);
  for (int64_t i = 0; i < seen; ++i) row[i] *= inv_sum;
  std::fill(row + seen, row + T, 0.0f);
}

}  // namespace

// Rows of a sequence go in blocks of ATT_ROWS: block [r0, r0 + rows) attends to positions
// 0..r0+rows-1 only, so the gemms skip the masked square above the block diagonal (T = 256: 62% of
// the full square's flops), while each gemm stays large enough for BLIS.
constexpr int64_t ATT_ROWS = 64;

// Per sequence b, local head h and block of rows, as gemms over the head's strided columns of qkv
// (row stride QKV): scores = q k^T [rows, ctx], a row-wise softmax, out = att v. att[t, t'] is
// written for t' < ctx of t's block (zero above the diagonal); the rest of the row is not.
void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, const AttentionShape& s) {
  const int64_t HS = s.head_size, QKV = s.qkv_dim(), QL = s.q_dim(), KVL = s.kv_dim();
  const float scale = 1.0f / sqrtf(static_cast<float>(HS));
  using tensor::Trans;
  for (int64_t b = 0; b < B; ++b)
    for (int h = 0; h < s.heads; ++h) {
      const int64_t koff = QL + int64_t(s.kv_of[h]) * HS, voff = koff + KVL;
      const float* q = qkv + b * T * QKV + h * HS;  // [T, HS], row stride QKV
      const float* k = qkv + b * T * QKV + koff;
      const float* v = qkv + b * T * QKV + voff;
      float* a = att + (b * s.heads + h) * T * T;  // [T, T]
      for (int64_t r0 = 0; r0 < T; r0 += ATT_ROWS) {
        const int64_t rows = std::min(ATT_ROWS, T - r0), ctx = r0 + rows;
        float* a_blk = a + r0 * T;  // [rows, ctx], row stride T
        tensor::gemm(Trans::No, Trans::Yes, rows, ctx, HS, 1.0f, q + r0 * QKV, QKV, k, QKV, 0.0f, a_blk, T);
        for (int64_t n = 0; n < rows; ++n) causal_softmax_row(a_blk + n * T, r0 + n + 1, ctx, scale);
        tensor::gemm(Trans::No, Trans::No, rows, HS, ctx, 1.0f, a_blk, T, v, QKV, 0.0f, out + (b * T + r0) * QL + h * HS,
                     QL);
      }
    }
}

// The same per (b, h, block of rows): datt = dy v^T; dv += att^T dy; through the softmax
// dpre = att * (datt - rowsum(att * datt)) / sqrt(HS) (zero above the diagonal, where att is);
// dq += dpre k; dk += dpre^T q. Reads att only where attention_forward wrote it.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int64_t B, int64_t T,
                        const AttentionShape& s) {
  const int64_t HS = s.head_size, QKV = s.qkv_dim(), QL = s.q_dim(), KVL = s.kv_dim();
  const float scale = 1.0f / sqrtf(static_cast<float>(HS));
  using tensor::Trans;
  std::vector<float> datt(static_cast<size_t>(std::min(ATT_ROWS, T) * T));  // [rows, ctx] scratch, then dpre
  for (int64_t b = 0; b < B; ++b)
    for (int h = 0; h < s.heads; ++h) {
      const int64_t koff = QL + int64_t(s.kv_of[h]) * HS, voff = koff + KVL;
      const int64_t base = b * T * QKV;
      const float* a = att + (b * s.heads + h) * T * T;
      for (int64_t r0 = 0; r0 < T; r0 += ATT_ROWS) {
        const int64_t rows = std::min(ATT_ROWS, T - r0), ctx = r0 + rows;
        const float* a_blk = a + r0 * T;                       // [rows, ctx], row stride T
        const float* dy = dout + (b * T + r0) * QL + h * HS;  // [rows, HS], row stride QL
        float* d = datt.data();                               // [rows, ctx]
        tensor::gemm(Trans::No, Trans::Yes, rows, ctx, HS, 1.0f, dy, QL, qkv + base + voff, QKV, 0.0f, d, ctx);
        tensor::gemm(Trans::Yes, Trans::No, ctx, HS, rows, 1.0f, a_blk, T, dy, QL, 1.0f, dqkv + base + voff, QKV);
        for (int64_t n = 0; n < rows; ++n) {
          const int64_t t = r0 + n;
          const float* arow = a_blk + n * T;
          float* drow = d + n * ctx;
          float dot = 0.0f;
          for (int64_t t2 = 0; t2 <= t; ++t2) dot += arow[t2] * drow[t2];
          for (int64_t t2 = 0; t2 <= t; ++t2) drow[t2] = arow[t2] * (drow[t2] - dot) * scale;
          std::fill(drow + t + 1, drow + ctx, 0.0f);
        }
        tensor::gemm(Trans::No, Trans::No, rows, HS, ctx, 1.0f, d, ctx, qkv + base + koff, QKV, 1.0f,
                     dqkv + base + r0 * QKV + h * HS, QKV);
        tensor::gemm(Trans::Yes, Trans::No, ctx, HS, rows, 1.0f, d, ctx, qkv + base + r0 * QKV + h * HS, QKV, 1.0f,
                     dqkv + base + koff, QKV);
      }
    }
}

namespace {

// Calls visit(t, row offset, n) for runs of n positions t..t+n-1 that lie in one block (rows one
// KVL apart), covering 0..last in order (no division per position).
template <class Visit>
void for_runs(const KvBlocks& kv, int last, int64_t KVL, Visit&& visit) {
  for (int t = 0, b = 0; t <= last; ++b) {
    const int n = static_cast<int>(std::min<int64_t>(kv.block_size, last + 1 - t));
    visit(t, kv.blocks[static_cast<size_t>(b)] * kv.block_size * KVL, n);
    t += n;
  }
}

// att[j] = q . k_j / scale_div for n keys one KVL apart. Each dot product is one chain over the
// head's dims (llama2.c's order); eight chains run side by side, so the chains' latency overlaps
// instead of adding up (the same operations, in the same order, per position).
void scores(float* att, const float* q, const float* k, int n, int64_t HS, int64_t KVL, float scale_div) {
  constexpr int LANES = 8;
  int j = 0;
  for (; j + LANES <= n; j += LANES) {
    float s[LANES] = {};
    for (int64_t i = 0; i < HS; ++i)
      for (int r = 0; r < LANES; ++r) s[r] += q[i] * k[(j + r) * KVL + i];
    for (int r = 0; r < LANES; ++r) att[j + r] = s[r] / scale_div;
  }
  for (; j < n; ++j) {
    float score = 0.0f;
    for (int64_t i = 0; i < HS; ++i) score += q[i] * k[j * KVL + i];
    att[j] = score / scale_div;
  }
}

tensor::HalfKind half_kind(KvDtype dtype) { return dtype == KvDtype::BF16 ? tensor::HalfKind::BF16 : tensor::HalfKind::F16; }

void decode_f32(float* out, float* att, const float* q, const KvBlocks& kv, int pos, const AttentionShape& s) {
  const int64_t HS = s.head_size, KVL = s.kv_dim();
  const float scale_div = sqrtf(static_cast<float>(HS));
  const float* k = static_cast<const float*>(kv.k);
  const float* v = static_cast<const float*>(kv.v);
  for (int h = 0; h < s.heads; ++h) {
    const float* qh = q + h * HS;
    const int64_t koff = int64_t(s.kv_of[h]) * HS;
    for_runs(kv, pos, KVL, [&](int t, int64_t at, int n) { scores(att + t, qh, k + at + koff, n, HS, KVL, scale_div); });
    softmax(att, pos + 1);
    float* o = out + h * HS;
    std::fill(o, o + HS, 0.0f);
    for_runs(kv, pos, KVL, [&](int t, int64_t at, int n) {
      for (int j = 0; j < n; ++j) {
        const float* vj = v + at + j * KVL + koff;
        const float a = att[t + j];
        for (int64_t i = 0; i < HS; ++i) o[i] += a * vj[i];
      }
    });
  }
}

void decode_half(float* out, float* att, const float* q, const KvBlocks& kv, int pos, const AttentionShape& s) {
  const int64_t HS = s.head_size, KVL = s.kv_dim();
  const float scale_div = sqrtf(static_cast<float>(HS));
  const tensor::HalfKernel& kernel = tensor::half_kernel(half_kind(kv.dtype));
  const uint16_t* k = static_cast<const uint16_t*>(kv.k);
  const uint16_t* v = static_cast<const uint16_t*>(kv.v);
  for (int h = 0; h < s.heads; ++h) {
    const int64_t koff = int64_t(s.kv_of[h]) * HS;
    for_runs(kv, pos, KVL, [&](int t, int64_t at, int n) { kernel.dots(att + t, q + h * HS, k + at + koff, n, KVL, HS, scale_div); });
    softmax(att, pos + 1);
    float* o = out + h * HS;
    std::fill(o, o + HS, 0.0f);
    for_runs(kv, pos, KVL, [&](int t, int64_t at, int n) { kernel.weighted_sum(o, att + t, v + at + koff, n, KVL, HS); });
  }
}

}  // namespace

void attention_decode(float* out, float* att, const float* q, const KvBlocks& kv, int pos, const AttentionShape& s) {
  if (kv.dtype == KvDtype::F32) decode_f32(out, att, q, kv, pos, s);
  else decode_half(out, att, q, kv, pos, s);
}

namespace {

void store_kv_rows(const float* qkv, const KvBlocks& kv, int pos, int64_t P, const AttentionShape& s) {
  const int64_t QKV = s.qkv_dim(), QL = s.q_dim(), KVL = s.kv_dim();
  for (int64_t n = 0; n < P; ++n) {
    const float* row = qkv + n * QKV;
    const int64_t t = pos + n, at = (kv.blocks[t / kv.block_size] * kv.block_size + t % kv.block_size) * KVL;
    if (kv.dtype == KvDtype::F32) {
      std::copy(row + QL, row + QL + KVL, static_cast<float*>(kv.k) + at);
      std::copy(row + QL + KVL, row + QL + 2 * KVL, static_cast<float*>(kv.v) + at);
    } else {
      tensor::f32_to_half(static_cast<uint16_t*>(kv.k) + at, row + QL, KVL, half_kind(kv.dtype));
      tensor::f32_to_half(static_cast<uint16_t*>(kv.v) + at, row + QL + KVL, KVL, half_kind(kv.dtype));
    }
  }
}

// The first `positions` rows of a 16-bit cache [S, KVL] widened to f32: out[positions, KVL].
std::vector<float> widened(const void* cache, int64_t positions, int64_t KVL, KvDtype dtype) {
  std::vector<float> out(static_cast<size_t>(positions * KVL));
  tensor::half_to_f32(out.data(), static_cast<const uint16_t*>(cache), positions * KVL, half_kind(dtype));
  return out;
}

// Rows go in blocks: block [r0, r0 + rows) reads cache positions 0..pos+r0+rows-1 only, so the
// masked future a block computes is at most ROWS wide instead of P. k_cache, v_cache: [S, KVL].
void attention_gemm(float* out, float* att, const float* qkv, const float* k_cache, const float* v_cache, int pos,
                    int64_t P, const AttentionShape& s) {
  const int64_t HS = s.head_size, QKV = s.qkv_dim(), QL = s.q_dim(), KVL = s.kv_dim();
  constexpr int64_t ROWS = 64;
  const float scale_div = sqrtf(static_cast<float>(HS));
  for (int h = 0; h < s.heads; ++h) {
    const int64_t koff = int64_t(s.kv_of[h]) * HS;
    for (int64_t r0 = 0; r0 < P; r0 += ROWS) {
      const int64_t rows = std::min(ROWS, P - r0), ctx = pos + r0 + rows;  // cache positions read
      // att[rows, ctx] = q_h[rows, HS] @ k_h[ctx, HS]^T (q rows strided by QKV, cache rows by KVL)
      tensor::gemm(tensor::Trans::No, tensor::Trans::Yes, rows, ctx, HS, 1.0f, qkv + r0 * QKV + h * HS, QKV,
                   k_cache + koff, KVL, 0.0f, att, ctx);
      for (int64_t n = 0; n < rows; ++n) {  // scale as decode does, softmax over 0..pos+r0+n, zero the future
        float* a = att + n * ctx;
        const int64_t seen = pos + r0 + n + 1;
        for (int64_t t = 0; t < seen; ++t) a[t] /= scale_div;
        softmax(a, seen);
        std::fill(a + seen, a + ctx, 0.0f);
      }
      // out_h[rows, HS] (row stride QL) = att[rows, ctx] @ v_h[ctx, HS]
      tensor::gemm(tensor::Trans::No, tensor::Trans::No, rows, HS, ctx, 1.0f, att, ctx, v_cache + koff, KVL, 0.0f,
                   out + r0 * QL + h * HS, QL);
    }
  }
}

}  // namespace

void attention_cached(float* out, float* att, const float* qkv, const KvBlocks& kv, int pos, int64_t P,
                      const AttentionShape& s) {
  store_kv_rows(qkv, kv, pos, P, s);
  if (P > 1 && kv.contiguous() && !tensor::decode_rows()) {
    const int64_t KVL = s.kv_dim(), at = kv.blocks[0] * kv.block_size * KVL;
    if (kv.dtype == KvDtype::F32) {
      attention_gemm(out, att, qkv, static_cast<const float*>(kv.k) + at, static_cast<const float*>(kv.v) + at, pos, P, s);
    } else {  // BLIS reads f32: the positions the rows read, widened once for all heads
      const int64_t element = kv_dtype_bytes(kv.dtype);
      const std::vector<float> k = widened(static_cast<const char*>(kv.k) + at * element, pos + P, KVL, kv.dtype);
      const std::vector<float> v = widened(static_cast<const char*>(kv.v) + at * element, pos + P, KVL, kv.dtype);
      attention_gemm(out, att, qkv, k.data(), v.data(), pos, P, s);
    }
    return;
  }
  for (int64_t n = 0; n < P; ++n)
    attention_decode(out + n * s.q_dim(), att, qkv + n * s.qkv_dim(), kv, pos + static_cast<int>(n), s);
}

}  // namespace tpcli::nn

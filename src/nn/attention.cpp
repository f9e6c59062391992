#include "nn/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string_view>
#include <vector>

#include "tensor/blas.h"
#include "tensor/kv_products.h"
#include "tensor/quant_formats.h"
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

// One head's `rows` query rows at positions first.. (q row n at q + n * ldq) against cache
// positions 0..ctx-1 (ctx = first + rows), through the cache's rows at koff within each position.
struct HeadRows {
  const KvBlocks& kv;
  int64_t koff, head_size, kv_dim;
  int64_t first, rows;
  int64_t ctx() const { return first + rows; }
  tensor::KvRows cache_rows(const void* base, int64_t at, int64_t n) const {
    const int64_t bytes = kv_dtype_bytes(kv.dtype);
    return {static_cast<const char*>(base) + (at + koff) * bytes, kv.dtype, n, kv_dim, head_size};
  }
};

// scores[n, ctx] = row n's scores (tensor/kv_products.h), then row n's softmax over its own
// positions 0..first+n (llama2.c's).
void head_scores(float* scores, const float* q, int64_t ldq, const HeadRows& h, float scale_div) {
  const int64_t ctx = h.ctx();
  for_runs(h.kv, static_cast<int>(ctx - 1), h.kv_dim, [&](int t, int64_t at, int n) {
    tensor::kv_dots(scores + t, ctx, q, ldq, h.rows, h.cache_rows(h.kv.k, at, n), scale_div);
  });
  for (int64_t n = 0; n < h.rows; ++n) softmax(scores + n * ctx, h.first + n + 1);
}

// y row n (ldy apart) = row n's weights times the values: first the positions every row sees
// (0..first), then each later position t for the rows at or after it.
void head_values(float* y, int64_t ldy, const float* scores, const HeadRows& h) {
  const int64_t ctx = h.ctx();
  for (int64_t n = 0; n < h.rows; ++n) std::fill(y + n * ldy, y + n * ldy + h.head_size, 0.0f);
  for_runs(h.kv, static_cast<int>(h.first), h.kv_dim, [&](int t, int64_t at, int n) {
    tensor::kv_weighted_sums(y, ldy, scores + t, ctx, h.rows, h.cache_rows(h.kv.v, at, n));
  });
  for (int64_t t = h.first + 1; t < ctx; ++t) {
    const int64_t n0 = t - h.first, bs = h.kv.block_size, at = (h.kv.blocks[t / bs] * bs + t % bs) * h.kv_dim;
    tensor::kv_weighted_sums(y + n0 * ldy, ldy, scores + n0 * ctx + t, ctx, h.rows - n0, h.cache_rows(h.kv.v, at, 1));
  }
}

// Rows [0, P) of one sequence, at positions pos..pos+P-1 (their keys and values already in the
// cache): q row n at q + n * ldq, output row n at out + n * ldo. Per head and block of up to
// ROW_BLOCK rows, the scores, then the values weighed; the rows of a block share every key and
// value they read, and each row's arithmetic is the same whatever rows run beside it.
void attention_rows(float* out, int64_t ldo, const float* q, int64_t ldq, const KvBlocks& kv, int pos, int64_t P,
                    const AttentionShape& s) {
  constexpr int64_t ROW_BLOCK = 64;
  const float scale_div = sqrtf(static_cast<float>(s.head_size));
  thread_local std::vector<float> scores;  // [rows, ctx]
  for (int h = 0; h < s.heads; ++h)
    for (int64_t r0 = 0; r0 < P; r0 += ROW_BLOCK) {
      const HeadRows head{kv, int64_t(s.kv_of[h]) * s.head_size, s.head_size, s.kv_dim(), pos + r0, std::min(ROW_BLOCK, P - r0)};
      scores.resize(static_cast<size_t>(head.rows * head.ctx()));
      head_scores(scores.data(), q + r0 * ldq + h * s.head_size, ldq, head, scale_div);
      head_values(out + r0 * ldo + h * s.head_size, ldo, scores.data(), head);
    }
}

// dst[n] = src[n] in the cache's dtype.
void store_row(void* dst, const float* src, int64_t n, KvDtype dtype) {
  if (dtype == KvDtype::F32) {
    std::copy(src, src + n, static_cast<float*>(dst));
    return;
  }
  auto* half = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) half[i] = dtype == KvDtype::BF16 ? tensor::f32_to_bf16(src[i]) : tensor::f32_to_f16(src[i]);
}

void store_kv_rows(const float* qkv, const KvBlocks& kv, int pos, int64_t P, const AttentionShape& s) {
  const int64_t QKV = s.qkv_dim(), QL = s.q_dim(), KVL = s.kv_dim(), element = kv_dtype_bytes(kv.dtype);
  for (int64_t n = 0; n < P; ++n) {
    const float* row = qkv + n * QKV;
    const int64_t t = pos + n, at = (kv.blocks[t / kv.block_size] * kv.block_size + t % kv.block_size) * KVL * element;
    store_row(static_cast<char*>(kv.k) + at, row + QL, KVL, kv.dtype);
    store_row(static_cast<char*>(kv.v) + at, row + QL + KVL, KVL, kv.dtype);
  }
}

}  // namespace

void attention_decode(float* out, const float* q, const KvBlocks& kv, int pos, const AttentionShape& s) {
  attention_rows(out, s.q_dim(), q, s.qkv_dim(), kv, pos, 1, s);
}

void attention_cached(float* out, const float* qkv, const KvBlocks& kv, int pos, int64_t P, const AttentionShape& s) {
  store_kv_rows(qkv, kv, pos, P, s);
  attention_rows(out, s.q_dim(), qkv, s.qkv_dim(), kv, pos, P, s);
}

}  // namespace tpcli::nn

#include "nn/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "tensor/blas.h"

namespace tpcli::nn {

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

}  // namespace

void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, const AttentionShape& s) {
  const int64_t HS = s.head_size, QKV = s.qkv_dim(), QL = s.q_dim(), KVL = s.kv_dim();
  const float scale_div = sqrtf(static_cast<float>(HS));
  for (int64_t b = 0; b < B; ++b)
    for (int h = 0; h < s.heads; ++h) {
      const int64_t koff = QL + int64_t(s.kv_of[h]) * HS, voff = koff + KVL;
      for (int64_t t = 0; t < T; ++t) {
        const float* q = qkv + (b * T + t) * QKV + h * HS;
        float* a = att + ((b * s.heads + h) * T + t) * T;  // [T]
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const float* k = qkv + (b * T + t2) * QKV + koff;
          float score = 0.0f;
          for (int64_t i = 0; i < HS; ++i) score += q[i] * k[i];
          a[t2] = score / scale_div;
        }
        softmax(a, t + 1);
        std::fill(a + t + 1, a + T, 0.0f);
        float* o = out + (b * T + t) * QL + h * HS;
        std::fill(o, o + HS, 0.0f);
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const float* v = qkv + (b * T + t2) * QKV + voff;
          const float w = a[t2];
          for (int64_t i = 0; i < HS; ++i) o[i] += w * v[i];
        }
      }
    }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int64_t B, int64_t T,
                        const AttentionShape& s) {
  const int64_t HS = s.head_size, QKV = s.qkv_dim(), QL = s.q_dim(), KVL = s.kv_dim();
  const float scale = 1.0f / sqrtf(static_cast<float>(HS));
  std::vector<float> datt(static_cast<size_t>(T));  // [T] scratch
  for (int64_t b = 0; b < B; ++b)
    for (int h = 0; h < s.heads; ++h) {
      const int64_t koff = QL + int64_t(s.kv_of[h]) * HS, voff = koff + KVL;
      for (int64_t t = 0; t < T; ++t) {
        const float* a = att + ((b * s.heads + h) * T + t) * T;
        const float* dy = dout + (b * T + t) * QL + h * HS;
        // through the weighted sum of values
        float dot = 0.0f;  // sum_t2 a[t2] * datt[t2]
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const float* v = qkv + (b * T + t2) * QKV + voff;
          float* dv = dqkv + (b * T + t2) * QKV + voff;
          float d = 0.0f;
          for (int64_t i = 0; i < HS; ++i) {
            d += dy[i] * v[i];
            dv[i] += a[t2] * dy[i];
          }
          datt[static_cast<size_t>(t2)] = d;
          dot += a[t2] * d;
        }
        // through the softmax and the scaled dot products
        const float* q = qkv + (b * T + t) * QKV + h * HS;
        float* dq = dqkv + (b * T + t) * QKV + h * HS;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const float dpre = a[t2] * (datt[static_cast<size_t>(t2)] - dot) * scale;
          const float* k = qkv + (b * T + t2) * QKV + koff;
          float* dk = dqkv + (b * T + t2) * QKV + koff;
          for (int64_t i = 0; i < HS; ++i) {
            dq[i] += dpre * k[i];
            dk[i] += dpre * q[i];
          }
        }
      }
    }
}

void attention_decode(float* out, float* att, const float* q, const float* k_cache, const float* v_cache, int pos,
                      const AttentionShape& s) {
  const int64_t HS = s.head_size, KVL = s.kv_dim();
  const float scale_div = sqrtf(static_cast<float>(HS));
  for (int h = 0; h < s.heads; ++h) {
    const float* qh = q + h * HS;
    const int64_t koff = int64_t(s.kv_of[h]) * HS;
    for (int t = 0; t <= pos; ++t) {
      const float* k = k_cache + t * KVL + koff;
      float score = 0.0f;
      for (int64_t i = 0; i < HS; ++i) score += qh[i] * k[i];
      att[t] = score / scale_div;
    }
    softmax(att, pos + 1);
    float* o = out + h * HS;
    std::fill(o, o + HS, 0.0f);
    for (int t = 0; t <= pos; ++t) {
      const float* v = v_cache + t * KVL + koff;
      const float a = att[t];
      for (int64_t i = 0; i < HS; ++i) o[i] += a * v[i];
    }
  }
}

void attention_cached(float* out, float* att, const float* qkv, float* k_cache, float* v_cache, int pos, int64_t P,
                      const AttentionShape& s) {
  const int64_t HS = s.head_size, QKV = s.qkv_dim(), QL = s.q_dim(), KVL = s.kv_dim();
  for (int64_t n = 0; n < P; ++n) {  // k and v of each row into the cache at its position
    const float* row = qkv + n * QKV;
    std::copy(row + QL, row + QL + KVL, k_cache + (pos + n) * KVL);
    std::copy(row + QL + KVL, row + QL + 2 * KVL, v_cache + (pos + n) * KVL);
  }
  if (P == 1) {
    attention_decode(out, att, qkv, k_cache, v_cache, pos, s);
    return;
  }
  // Rows go in blocks: block [r0, r0 + rows) reads cache positions 0..pos+r0+rows-1 only, so the
  // masked future a block computes is at most ROWS wide instead of P.
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

}  // namespace tpcli::nn

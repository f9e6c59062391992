// Test reference: llama2.c run.c's forward(), transcribed loop for loop (serial, unsharded, no
// BLAS), over any WeightSource. The yardstick the sharded model and the generation loop are held to.
//
// Dimension legend: C dim, F hidden_dim, L layers, NH/NKV heads, HS head size, Q = NH * HS (C in
// llama2.c; Hugging Face's head_dim may make it differ), V vocab, S seq_len.
#pragma once

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "model/weights.h"

namespace tpcli::testing {

class ReferenceForward {
 public:
  explicit ReferenceForward(const model::WeightSource& w) : w_(w), c_(w.config()) {
    const size_t C = c_.dim, KV = c_.kv_dim(), S = c_.seq_len, L = c_.n_layers, Q = c_.q_dim();
    x_.resize(C);
    xb_.resize(std::max(C, Q));
    xb2_.resize(C);
    hb_.resize(c_.hidden_dim);
    hb2_.resize(c_.hidden_dim);
    q_.resize(Q);
    att_.resize(static_cast<size_t>(c_.n_heads) * S);
    logits_.resize(c_.vocab_size);
    key_cache_.resize(L * S * KV);
    value_cache_.resize(L * S * KV);
  }

  std::span<const float> forward(int token, int pos) {
    const int dim = c_.dim, kv_dim = c_.kv_dim(), kv_mul = c_.n_heads / c_.n_kv_heads, hidden = c_.hidden_dim;
    const int head_size = c_.head_size(), q_dim = c_.q_dim();
    const float* emb = w_.get("tok_embeddings").data();
    std::copy(emb + static_cast<size_t>(token) * dim, emb + static_cast<size_t>(token + 1) * dim, x_.begin());
    for (int l = 0; l < c_.n_layers; ++l) {
      const std::string p = "layers." + std::to_string(l) + ".";
      rmsnorm(xb_.data(), x_.data(), w_.get(p + "attention_norm").data(), dim);
      const size_t loff = static_cast<size_t>(l) * c_.seq_len * kv_dim;
      float* k = key_cache_.data() + loff + static_cast<size_t>(pos) * kv_dim;
      float* v = value_cache_.data() + loff + static_cast<size_t>(pos) * kv_dim;
      matmul(q_.data(), xb_.data(), w_.get(p + "wq").data(), dim, q_dim);
      matmul(k, xb_.data(), w_.get(p + "wk").data(), dim, kv_dim);
      matmul(v, xb_.data(), w_.get(p + "wv").data(), dim, kv_dim);
      // RoPE
      for (int i = 0; i < q_dim; i += 2) {
        const int head_dim = i % head_size;
        const float freq = 1.0f / powf(10000.0f, head_dim / static_cast<float>(head_size));
        const float val = pos * freq, fcr = cosf(val), fci = sinf(val);
        const int rotn = i < kv_dim ? 2 : 1;
        for (int r = 0; r < rotn; ++r) {
          float* vec = r == 0 ? q_.data() : k;
          const float v0 = vec[i], v1 = vec[i + 1];
          vec[i] = v0 * fcr - v1 * fci;
          vec[i + 1] = v0 * fci + v1 * fcr;
        }
      }
      for (int h = 0; h < c_.n_heads; ++h) {
        const float* q = q_.data() + h * head_size;
        float* att = att_.data() + static_cast<size_t>(h) * c_.seq_len;
        for (int t = 0; t <= pos; ++t) {
          const float* kt = key_cache_.data() + loff + static_cast<size_t>(t) * kv_dim + (h / kv_mul) * head_size;
          float score = 0.0f;
          for (int i = 0; i < head_size; ++i) score += q[i] * kt[i];
          att[t] = score / sqrtf(static_cast<float>(head_size));
        }
        softmax(att, pos + 1);
        float* xb = xb_.data() + h * head_size;
        std::fill(xb, xb + head_size, 0.0f);
        for (int t = 0; t <= pos; ++t) {
          const float* vt = value_cache_.data() + loff + static_cast<size_t>(t) * kv_dim + (h / kv_mul) * head_size;
          for (int i = 0; i < head_size; ++i) xb[i] += att[t] * vt[i];
        }
      }
      matmul(xb2_.data(), xb_.data(), w_.get(p + "wo").data(), q_dim, dim);
      for (int i = 0; i < dim; ++i) x_[i] += xb2_[i];
      rmsnorm(xb_.data(), x_.data(), w_.get(p + "ffn_norm").data(), dim);
      matmul(hb_.data(), xb_.data(), w_.get(p + "w1").data(), dim, hidden);
      matmul(hb2_.data(), xb_.data(), w_.get(p + "w3").data(), dim, hidden);
      for (int i = 0; i < hidden; ++i) {
        float val = hb_[i];
        val *= (1.0f / (1.0f + expf(-val)));
        hb_[i] = val * hb2_[i];
      }
      matmul(xb_.data(), hb_.data(), w_.get(p + "w2").data(), hidden, dim);
      for (int i = 0; i < dim; ++i) x_[i] += xb_[i];
    }
    rmsnorm(x_.data(), x_.data(), w_.get("norm").data(), dim);
    const float* cls = c_.shared_classifier ? emb : w_.get("output").data();
    matmul(logits_.data(), x_.data(), cls, dim, c_.vocab_size);
    return logits_;
  }

 private:
  static void rmsnorm(float* o, const float* x, const float* weight, int size) {
    float ss = 0.0f;
    for (int j = 0; j < size; ++j) ss += x[j] * x[j];
    ss /= size;
    ss += 1e-5f;
    ss = 1.0f / sqrtf(ss);
    for (int j = 0; j < size; ++j) o[j] = weight[j] * (ss * x[j]);
  }
  static void softmax(float* x, int size) {
    float max_val = x[0];
    for (int i = 1; i < size; ++i) max_val = std::max(max_val, x[i]);
    float sum = 0.0f;
    for (int i = 0; i < size; ++i) {
      x[i] = expf(x[i] - max_val);
      sum += x[i];
    }
    for (int i = 0; i < size; ++i) x[i] /= sum;
  }
  static void matmul(float* xout, const float* x, const float* w, int n, int d) {
    for (int i = 0; i < d; ++i) {
      float val = 0.0f;
      for (int j = 0; j < n; ++j) val += w[static_cast<size_t>(i) * n + j] * x[j];
      xout[i] = val;
    }
  }

  const model::WeightSource& w_;
  model::LlamaConfig c_;
  std::vector<float> x_, xb_, xb2_, hb_, hb2_, q_, att_, logits_;  // [C] x3, [F] x2, [C], [NH, S], [V]
  std::vector<float> key_cache_, value_cache_;                    // [L, S, KVD] each
};

}  // namespace tpcli::testing

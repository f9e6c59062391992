// tpcli::model — the trainable q/k/v biases and q/k norms (model/trainable_llama_layers.h).
#include <vector>

#include "model/trainable_llama_layers.h"
#include "nn/rmsnorm.h"

namespace tpcli::model {

void TrainableQkvExtras::forward(float* qkv, float* qk_in, float* qk_rstd, int64_t N, const nn::AttentionShape& shape,
                                 float eps) const {
  const int64_t QKV = shape.qkv_dim(), QL = shape.q_dim(), KVL = shape.kv_dim(), HS = shape.head_size;
  const int64_t heads = shape.heads, kv_heads = shape.kv_heads;
  for (int64_t n = 0; n < N; ++n) {
    float* row = qkv + n * QKV;
    if (has_bias()) {
      for (int64_t i = 0; i < QL; ++i) row[i] += bq[i];
      for (int64_t i = 0; i < KVL; ++i) row[QL + i] += bk[i];
      for (int64_t i = 0; i < KVL; ++i) row[QL + KVL + i] += bv[i];
    }
    if (!has_norms()) continue;
    float* in = qk_in + n * (QL + KVL);
    float* rstd = qk_rstd + n * (heads + kv_heads);
    std::copy(row, row + QL + KVL, in);
    nn::rmsnorm_forward(row, rstd, in, q_norm.data(), heads, HS, eps);
    nn::rmsnorm_forward(row + QL, rstd + heads, in + QL, k_norm.data(), kv_heads, HS, eps);
  }
}

void TrainableQkvExtras::backward(float* dqkv, const float* qk_in, const float* qk_rstd, int64_t N,
                                  const nn::AttentionShape& shape, bool frozen, dist::Group& group) {
  const int64_t QKV = shape.qkv_dim(), QL = shape.q_dim(), KVL = shape.kv_dim(), HS = shape.head_size;
  const int64_t heads = shape.heads, kv_heads = shape.kv_heads;
  if (has_norms()) {
    std::vector<float> gains(static_cast<size_t>(2 * HS), 0.0f);  // [2, HS] this call's q_norm, k_norm gradients
    std::vector<float> normed(static_cast<size_t>(QL + KVL));      // [QL+KVL] one row's gradient after the norms
    for (int64_t n = 0; n < N; ++n) {
      float* row = dqkv + n * QKV;
      const float* in = qk_in + n * (QL + KVL);
      const float* rstd = qk_rstd + n * (heads + kv_heads);
      std::copy(row, row + QL + KVL, normed.begin());
      std::fill(row, row + QL + KVL, 0.0f);
      nn::rmsnorm_backward(row, gains.data(), normed.data(), in, q_norm.data(), rstd, heads, HS);
      nn::rmsnorm_backward(row + QL, gains.data() + HS, normed.data() + QL, in + QL, k_norm.data(), rstd + heads,
                           kv_heads, HS);
    }
    if (!frozen) {
      if (group.size() > 1) group.all_sum(gains);
      for (int64_t i = 0; i < HS; ++i) {
        q_norm_grad[i] += gains[static_cast<size_t>(i)];
        k_norm_grad[i] += gains[static_cast<size_t>(HS + i)];
      }
    }
  }
  if (!has_bias() || frozen) return;
  for (int64_t n = 0; n < N; ++n) {
    const float* row = dqkv + n * QKV;
    for (int64_t i = 0; i < QL; ++i) bq_grad[i] += row[i];
    for (int64_t i = 0; i < KVL; ++i) bk_grad[i] += row[QL + i];
    for (int64_t i = 0; i < KVL; ++i) bv_grad[i] += row[QL + KVL + i];
  }
}

int64_t TrainableQkvExtras::bytes() const {
  return (bq.numel() + bk.numel() + bv.numel() + q_norm.numel() + k_norm.numel()) * static_cast<int64_t>(sizeof(float));
}

}  // namespace tpcli::model

#include "model/block_activations.h"

#include "nn/feed_forward.h"

namespace tpcli::model {

BlockActivationSizes block_activation_sizes(const LlamaConfig& c, const ShardPlan& plan, int B, int T,
                                            bool sequence_parallel) {
  const int64_t N = int64_t{B} * T, C = c.dim;
  const int64_t QL = plan.q_rows().count, KVL = plan.kv_rows().count;
  const int64_t R = sequence_parallel ? dist::even_split(N, plan.devices, plan.rank).count : N;
  BlockActivationSizes s;
  s.rows = R;
  s.x_in = s.xn1 = s.xm = s.xn2 = s.tmp = R * C;
  s.rstd1 = s.rstd2 = R;
  s.qkv = N * (QL + 2 * KVL);
  if (c.qk_norm) {
    s.qk_in = N * (QL + KVL);
    s.qk_rstd = N * (QL + KVL) / c.head_size();
  }
  s.att = int64_t{B} * plan.heads.count * T * T;
  s.y = N * QL;
  s.ffn = c.is_moe() ? 0 : nn::swiglu_activation_sizes(N, plan.ffn.count).total();
  return s;
}

HeadActivationSizes head_activation_sizes(const LlamaConfig& c, const ShardPlan& plan, int B, int T,
                                          bool sequence_parallel) {
  const BlockActivationSizes b = block_activation_sizes(c, plan, B, T, sequence_parallel);
  const int64_t N = int64_t{B} * T, C = c.dim;
  return {b.x_in, N * C, b.rows, N * plan.vocab.count, N};
}

}  // namespace tpcli::model

// tpcli::model — the collectives and FLOPs of one device (see comm_plan.h for the list and legend).
#include "model/comm_plan.h"

#include <stdexcept>

namespace tpcli::model {

namespace {

using dist::CollectiveKind;

void require_dense(const LlamaConfig& c) {
  if (c.is_moe())
    throw std::invalid_argument("communication plan: MoE feed-forwards move data-dependent amounts (all_to_all_v); "
                                "only dense models are planned");
}

PlannedCollective tensor_call(const char* name, CollectiveKind kind, int64_t floats, int64_t calls, std::string what) {
  return {Role::Tensor, name, kind, floats, calls, std::move(what)};
}

// 2 x MACs of one row through this device's weights: q|k|v, wo, w1|w3, w2 per layer, and the classifier.
double weight_flops_per_row(const LlamaConfig& c, const ShardPlan& p) {
  const double C = c.dim, QL = static_cast<double>(p.q_rows().count), KVL = static_cast<double>(p.kv_rows().count),
               FL = static_cast<double>(p.ffn.count), VL = static_cast<double>(p.vocab.count);
  const double per_layer = C * (QL + 2 * KVL) + QL * C + 3 * C * FL;
  return 2 * (c.n_layers * per_layer + C * VL);
}

}  // namespace

std::vector<PlannedCollective> plan_decode_collectives(const LlamaConfig& c, const ShardPlan& p, bool greedy) {
  require_dense(c);
  if (p.devices <= 1) return {};
  const int64_t C = c.dim, L = c.n_layers;
  return {tensor_call("all_gather", CollectiveKind::AllGather, C, 1, "embedding row"),
          tensor_call("all_sum", CollectiveKind::AllSum, C, L, "wo outputs"),
          tensor_call("all_sum", CollectiveKind::AllSum, C, L, "w2 outputs"),
          greedy ? tensor_call("all_gather", CollectiveKind::AllGather, 2 * int64_t{p.devices}, 1, "argmax (value, token) pairs")
                 : tensor_call("all_gather", CollectiveKind::AllGather, c.vocab_size, 1, "logits")};
}

std::vector<PlannedCollective> plan_train_collectives(const LlamaConfig& c, const ShardPlan& p, int64_t rows,
                                                      int64_t seq_len, bool recompute) {
  require_dense(c);
  if (p.devices <= 1) return {};
  const int64_t N = rows * seq_len, C = c.dim, L = c.n_layers, passes = recompute ? 2 : 1;
  std::vector<PlannedCollective> out = {
      tensor_call("all_gather", CollectiveKind::AllGather, N * C, 1, "embedding rows"),
      tensor_call("all_sum", CollectiveKind::AllSum, N * C, passes * L, recompute ? "wo outputs (forward, recompute)" : "wo outputs"),
      tensor_call("all_sum", CollectiveKind::AllSum, N * C, passes * L, recompute ? "w2 outputs (forward, recompute)" : "w2 outputs"),
      tensor_call("all_max", CollectiveKind::AllSum, N, 1, "cross-entropy row maxima"),
      tensor_call("all_sum", CollectiveKind::AllSum, 2 * N, 1, "cross-entropy sums, target logits"),
      tensor_call("all_sum", CollectiveKind::AllSum, N * C, 1, "classifier input gradient"),
      tensor_call("all_sum", CollectiveKind::AllSum, N * C, L, "w1|w3 input gradients"),
      tensor_call("all_sum", CollectiveKind::AllSum, N * C, L, "wq|wk|wv input gradients")};
  if (p.kv_replicated)
    out.push_back(tensor_call("all_sum", CollectiveKind::AllSum, 2 * int64_t{c.kv_dim()} * C, L, "replicated wk|wv gradients"));
  return out;
}

double decode_flops(const LlamaConfig& c, const ShardPlan& p, int64_t pos) {
  const double attention = 2.0 * 2.0 * static_cast<double>(p.heads.count) * c.head_size() * static_cast<double>(pos + 1);
  return weight_flops_per_row(c, p) + c.n_layers * attention;
}

double train_flops(const LlamaConfig& c, const ShardPlan& p, int64_t rows, int64_t seq_len, bool recompute) {
  const double N = static_cast<double>(rows * seq_len);
  // Causal attention: scores and weighted values, T(T+1)/2 pairs per row and local head.
  const double attention = 2.0 * 2.0 * static_cast<double>(rows) * static_cast<double>(p.heads.count) * c.head_size() *
                           static_cast<double>(seq_len * (seq_len + 1) / 2);
  const double forward = N * weight_flops_per_row(c, p) + c.n_layers * attention;
  return forward * (recompute ? 4.0 : 3.0);
}

}  // namespace tpcli::model

// tpcli::model — the collectives and FLOPs of one device (see comm_plan.h for the list and legend).
#include "model/comm_plan.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

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

// This device's [out, in] of a dense block's linear m (model/block_matrices.h): its rows of an
// AllToSharded weight, its columns of a ShardedToAll one.
std::pair<int64_t, int64_t> local_shape(Matrix m, const LlamaConfig& c, const ShardPlan& p) {
  const tensor::Shape full = block_shape(m, c);
  const MatrixFacts& f = facts(m);
  const int64_t mine = p.range_of(f.sharded_dim).count;
  return f.columns ? std::pair{full[0], mine} : std::pair{mine, full[1]};
}

// 2 x MACs of one row through this device's weights: every linear of a block (q|k|v, wo, w1|w3,
// w2) per layer, and the classifier.
double weight_flops_per_row(const LlamaConfig& c, const ShardPlan& p) {
  double per_layer = 0;
  for (const MatrixFacts& f : block_matrices())
    if (is_dense_linear(f)) {
      const auto [out, in] = local_shape(f.matrix, c, p);
      per_layer += static_cast<double>(out * in);
    }
  return 2 * (c.n_layers * per_layer + static_cast<double>(c.dim) * static_cast<double>(p.vocab.count));
}

}  // namespace

std::vector<PlannedCollective> plan_decode_collectives(const LlamaConfig& c, const ShardPlan& p, bool greedy) {
  require_dense(c);
  if (p.devices <= 1) return {};
  const int64_t C = c.dim, L = c.n_layers;
  return {tensor_call("all_gather", CollectiveKind::AllGather, C, 1, "embedding row"),
          tensor_call("all_sum", CollectiveKind::AllSum, C, L, "wo outputs"),
          tensor_call("all_sum", CollectiveKind::AllSum, C, L, "w2 outputs"),
          greedy ? tensor_call("all_gather", CollectiveKind::AllGather, 2 * int64_t{p.devices}, 1, "argmax (logit, token) records")
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

namespace {

constexpr int64_t F32 = 4;               // bytes
constexpr int64_t ATTENTION_ROWS = 64;   // nn/attention.cpp's ATT_ROWS: rows per block of causal attention

using Kind = PlannedWork::Kind;
using Gemm = PlannedWork::Gemm;
using Op = PlannedWork::Op;

struct WorkList {
  std::vector<PlannedWork> items;
  bool backward = false;  // items added now belong to the backward pass
  void matmul(const std::string& what, PlannedWork::Gemm gemm, int64_t m, int64_t n, int64_t k, int64_t calls) {
    if (m > 0 && n > 0 && k > 0 && calls > 0) items.push_back({Kind::Matmul, what, m, n, k, 0, 0, calls, backward, gemm});
  }
  void memory(const std::string& what, int64_t bytes, int64_t calls) {
    if (bytes > 0 && calls > 0) items.push_back({Kind::Memory, what, 0, 0, 0, bytes, 0, calls, backward});
  }
  // nn/rmsnorm.h over [N, C]; nn/rope.h over N rows at positions 0..T-1, heads + kv_heads a row.
  void rmsnorm(const std::string& what, PlannedWork::Op op, int64_t N, int64_t C, int64_t calls) {
    PlannedWork c{Kind::Call, what, N, C, 0, 0, 0, calls, backward};
    c.op = op;
    if (N > 0 && calls > 0) items.push_back(c);
  }
  void rope(const std::string& what, PlannedWork::Op op, int64_t N, int64_t T, int64_t heads, int64_t kv_heads, int64_t HS,
            int64_t calls) {
    PlannedWork c{Kind::Call, what, N, T, 0, 0, 0, calls, backward};
    c.op = op, c.heads = heads, c.kv_heads = kv_heads, c.head_size = HS;
    if (N > 0 && calls > 0) items.push_back(c);
  }
  void exps(const std::string& what, int64_t elements, int64_t calls) {
    if (elements > 0 && calls > 0) items.push_back({Kind::Exp, what, 0, 0, 0, 0, elements, calls, backward});
  }
  // y[N, out] = x[N, in] @ W[out, in]^T (nn/linear.cpp); backward dx[N, in] += dy @ W, dW[out, in] += dy^T @ x.
  void linear(const std::string& name, int64_t N, int64_t out, int64_t in, int64_t forwards, int64_t backwards) {
    matmul(name + " forward", Gemm::NT, N, out, in, forwards);
    const bool was = std::exchange(backward, true);
    matmul(name + " input gradient", Gemm::NN, N, in, out, backwards);
    matmul(name + " weight gradient", Gemm::TN, out, in, N, backwards);
    backward = was;
  }
};

// nn/attention.cpp's attention_forward / attention_backward on B sequences of T rows: per local
// head and block of rows [r0, r0 + rows) attending to ctx = r0 + rows positions, scores q k^T
// [rows, ctx] and att v forward (2 gemms, a causal softmax between), 4 gemms backward.
void add_attention(WorkList& w, int64_t B, int64_t T, int64_t heads, int64_t kv_heads, int64_t HS, int64_t forwards,
                   int64_t backwards) {
  double forward_flops = 0;
  for (int64_t r0 = 0; r0 < T; r0 += ATTENTION_ROWS) {
    const int64_t rows = std::min(ATTENTION_ROWS, T - r0), ctx = r0 + rows;
    forward_flops += 2.0 * 2.0 * static_cast<double>(rows * ctx * HS * B * heads);
  }
  PlannedWork call{Kind::Call, "attention forward", B, T, 0, 0, 0, forwards};
  call.op = Op::AttentionForward;
  call.heads = heads, call.kv_heads = kv_heads, call.head_size = HS, call.call_flops = forward_flops;
  if (forwards > 0 && heads > 0) w.items.push_back(call);
  call.what = "attention backward", call.op = Op::AttentionBackward, call.calls = backwards;
  call.backward = true, call.call_flops = 2 * forward_flops;
  if (backwards > 0 && heads > 0) w.items.push_back(call);
}

}  // namespace

std::vector<PlannedWork> plan_train_work(const LlamaConfig& c, const ShardPlan& p, int64_t rows, int64_t seq_len,
                                         bool recompute) {
  require_dense(c);
  const int64_t N = rows * seq_len, C = c.dim, L = c.n_layers, HS = c.head_size();
  const int64_t QL = p.q_rows().count, KVL = p.kv_rows().count, FL = p.ffn.count, VL = p.vocab.count;
  const int64_t fwd = L * (recompute ? 2 : 1);  // block forwards per micro-batch
  WorkList w;
  w.memory("embedding rows", 2 * F32 * N * C, 1);
  // per block: attention rmsnorm, wq|wk|wv, RoPE, attention, wo, residual, ffn rmsnorm, w1|w3, SwiGLU, w2, residual
  w.memory("x_in saved", 2 * F32 * N * C, fwd);
  w.rmsnorm("rmsnorm", Op::RmsNormForward, N, C, 2 * fwd);
  // a block's linear m: each of its parts (model/block_matrices.h) at this device's shape
  const auto linear = [&](Matrix m) {
    for (Matrix part : linear_parts(m)) {
      const auto [out, in] = local_shape(part, c, p);
      w.linear(linear_name(m), N, out, in, fwd, L);
    }
  };
  linear(Matrix::Wq);
  w.rope("RoPE", Op::RopeForward, N, seq_len, p.heads.count, p.kv_heads.count, HS, fwd);
  add_attention(w, rows, seq_len, p.heads.count, p.kv_heads.count, HS, fwd, L);
  linear(Matrix::Wo);
  w.memory("residual adds", 3 * F32 * N * C, 2 * fwd);
  linear(Matrix::W1);
  w.memory("SwiGLU", 3 * F32 * N * FL, fwd);
  w.exps("SwiGLU sigmoids", N * FL, fwd);
  linear(Matrix::W2);
  // final rmsnorm, classifier, vocab-split cross-entropy: max, exp-sum (read + write), normalise (read + write)
  w.rmsnorm("rmsnorm", Op::RmsNormForward, N, C, 1);
  w.linear("classifier", N, VL, C, 1, 1);
  w.memory("cross-entropy", 5 * F32 * N * VL, 1);
  w.exps("cross-entropy exps", N * VL, 1);
  // backward: dlogits zero-filled then probs added; rmsnorm backward reads dy and x, adds into dx
  w.backward = true;
  w.memory("cross-entropy backward", 4 * F32 * N * VL, 1);
  w.rmsnorm("rmsnorm backward", Op::RmsNormBackward, N, C, 1 + 2 * L);
  w.memory("SwiGLU backward", 5 * F32 * N * FL, L);
  w.exps("SwiGLU sigmoids", N * FL, L);
  w.rope("RoPE backward", Op::RopeBackward, N, seq_len, p.heads.count, p.kv_heads.count, HS, L);
  // gradient buffers zero-filled per call: dxf, dx; per block dxn (twice), dy, dqkv, dg
  w.memory("zero-filled gradient buffers", F32 * 2 * N * C, 1);
  w.memory("zero-filled gradient buffers", F32 * N * (2 * C + QL + (QL + 2 * KVL) + FL), L);
  // AllToShardedLinear::backward on T > 1: a zeroed partial dx, then added into dx (wq|wk|wv, w1|w3, classifier)
  if (p.devices > 1) w.memory("partial input gradients", 4 * F32 * N * C, 2 * L + 1);
  w.memory("embedding backward", 3 * F32 * N * C, 1);
  return w.items;
}

std::vector<PlannedWork> plan_decode_work(const LlamaConfig& c, const ShardPlan& p, int64_t pos,
                                          const DecodeStorage& storage) {
  require_dense(c);
  const int64_t L = c.n_layers, C = c.dim, KVL = p.kv_rows().count;
  WorkList w;
  const auto matrix = [&](const std::string& what, const std::string& tensor, int64_t rows, int64_t cols, int64_t calls) {
    if (rows > 0 && cols > 0)
      w.items.push_back({Kind::Weights, what, rows, 0, cols, storage.bytes(tensor, rows, cols), 0, calls, false,
                         Gemm::NT, tensor});
  };
  // every linear of a block once, at its first part (wq|wk|wv, wo, w1|w3, w2); the parts of a
  // fused one as one matrix, its rows the parts' (layer 0's first part names the stored format)
  for (const MatrixFacts& f : block_matrices()) {
    const std::vector<Matrix> parts = linear_parts(f.matrix);
    if (!is_dense_linear(f) || parts.front() != f.matrix) continue;
    const std::string what = linear_name(f.matrix);
    int64_t fused_rows = 0;
    for (Matrix part : parts) {
      const auto [rows, cols] = local_shape(part, c, p);
      if (!storage.fused) matrix(what, tensor_name({0, part}), rows, cols, L);
      fused_rows += rows;
    }
    if (storage.fused) matrix(what, tensor_name({0, f.matrix}), fused_rows, local_shape(f.matrix, c, p).second, L);
  }
  matrix("classifier", c.shared_classifier ? "tok_embeddings" : "output", p.vocab.count, C, 1);
  w.memory("KV cache", 2 * F32 * L * (pos + 1) * KVL, 1);
  w.exps("attention softmax exps", p.heads.count * (pos + 1), L);
  w.exps("SwiGLU sigmoids", p.ffn.count, L);
  return w.items;
}

double total_flops(const std::vector<PlannedWork>& work) {
  double total = 0;
  for (const PlannedWork& item : work) total += item.flops();
  return total;
}

double decode_flops(const LlamaConfig& c, const ShardPlan& p, int64_t pos) {
  const double attention = 2.0 * 2.0 * static_cast<double>(p.heads.count) * c.head_size() * static_cast<double>(pos + 1);
  return weight_flops_per_row(c, p) + c.n_layers * attention;
}

double train_flops(const LlamaConfig& c, const ShardPlan& p, int64_t rows, int64_t seq_len, bool recompute) {
  return total_flops(plan_train_work(c, p, rows, seq_len, recompute));
}

}  // namespace tpcli::model

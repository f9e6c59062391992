// tpcli::nn — mixture-of-experts feed-forward: top-k routing, SwiGLU experts, expert parallelism
// over a Group by ragged all_to_all_v (tokens travel, activations are never gathered).
//
// Dimension legend: N tokens on this device, C dim, FE expert hidden dim (FE_local: this device's
// slice when the experts are also tensor-parallel), E experts, E_local experts owned here,
// K top-k, G expert-group size, A assignments sent by this device (<= N*K; fewer when a capacity
// drops some), R rows received by this device (sum over sources), T tensor-parallel group size.
//
// Forward on every member of the expert group (same calls, same order):
//   logits[N,E] = x @ router^T;  probs = softmax(logits);  top-k experts per token (ties -> lower
//   index); gates = chosen probs / their sum (Mixtral).
//   Assignments (token, slot) sorted by expert -> send buffer [A,C]; experts are dealt out over
//   the group by even_split (member m owns experts [off_m, off_m + E_m)).
//   all_to_all_v  (per-expert row counts)            E_m floats to member m
//   all_to_all_v  (rows)                              -> [R,C] in source order
//   permute to expert-major; each local expert runs one SwiGLU over its contiguous block
//   (grouped matmul: three gemms per expert, never a [tokens, C, FE] array)
//   [all_sum over the tensor-parallel group when experts are split on FE: ShardedToAll]
//   all_to_all_v  (results, the reverse direction)   -> [A,C] back at the sender
//   out[t] = sum_k gate[t,k] * y[t,k]
//   Switch load-balancing loss: aux = coef * E * sum_e f_e * P_e, f_e = (assignments to e over the
//   whole group, before capacity drops) / (N_group * K), P_e = mean over this device's tokens of
//   probs[:,e]. One all_sum of E floats gives the group-wide counts, so f_e (and the reported
//   token counts) are those of the global batch. At perfect balance aux = coef.
// Backward is forward read in reverse; the VJP of an all_to_all_v is the reverse all_to_all_v
// (rows go back the way they came).
//
// Capacity (optional): each device keeps at most ceil(capacity_factor * N * K / E) assignments per
// expert, first-choice slots first, then second choices, ..., each in token order; the rest are
// dropped (they add nothing to out; the gates are not renormalised again) and counted in
// MoeStats::dropped. Without a capacity factor nothing is ever dropped and no padding is sent.
//
// ---- Gradient semantics, and what data-parallel training must do ----
// moe_backward gives, on each device:
//   dinp    exact gradient for this device's tokens.
//   drouter this device's tokens' term only (partial over the group), like any replicated weight
//           under data parallelism.
//   dw1/dw2/dw3 of the local experts: the sum over the tokens of EVERY member that routed to them
//           (complete, not partial).
// If the global loss is L = sum over devices of L_d (each device's dout = dL_d/dout), then
// all_sum(drouter) over the group and the local expert gradients as they are equal the
// single-device gradient of L. The training loop instead uses L = mean over the D data ranks of
// the per-rank mean loss L_d, and pmeans replicated gradients over the data axis (all_sum / D).
// For the expert weights that rule is wrong (each member holds different experts); the equivalent
// rule is:
//   expert weights: grad *= 1 / G (G = expert-group size), and NO pmean over the expert axis;
//                   if the data-parallel axes include axes other than the expert axis, pmean over
//                   those other axes only (the experts are replicated there).
//   router:         an ordinary replicated weight (pmean over the data axes).
// Why 1/G: when the expert axis is the data axis (G = D) the owner's gradient is sum_d dL_d/dW and
// dL/dW = (1/D) sum_d dL_d/dW. When the tokens are mirrored over the expert group (expert axis =
// a tensor axis), the owner receives G identical copies of each token, so again it holds G times
// the gradient. Pass d_aux = 1 on every device: the aux loss term uses the group-wide f_e and the
// local P_e, so mean_d(aux_d) is the global aux loss and pmean(drouter) is its exact gradient
// (with equal token counts per device).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "distributed/group.h"
#include "nn/feed_forward.h"
#include "nn/quantized_linear.h"
#include "tensor/tensor.h"

namespace tpcli::nn {

struct MoeSizes {
  int64_t dim = 0;     // C
  int64_t hidden = 0;  // FE (the full expert hidden dim, before any tensor-parallel split)
  int n_experts = 0;   // E
  int top_k = 0;       // K
  float aux_coef = 0.0f;
  std::optional<float> capacity_factor;
  bool renormalise = true;  // the top-k gates sum to 1; false: their softmax probabilities over all E
};

// Experts [offset, offset + count) owned by member `rank` of a group of `size` (even_split).
dist::Range local_experts(int n_experts, int size, int rank);
// The member that owns expert e.
int expert_owner(int e, int n_experts, int size);

// This device's weights. router mirrored; experts: only the local ones, and with a tensor-parallel
// group only this member's FE_local slice (rows of w1/w3, columns of w2; FE dealt by even_split).
struct MoeWeights {
  std::span<const float> router;  // [E, C]
  std::span<const float> w1;      // [E_local, FE_local, C]
  std::span<const float> w2;      // [E_local, C, FE_local]
  std::span<const float> w3;      // [E_local, FE_local, C]
};

struct MoeGrads {  // same shapes as MoeWeights; accumulated into (+=); all empty: frozen, none computed
  std::span<float> router;  // [E, C]
  std::span<float> w1;      // [E_local, FE_local, C]
  std::span<float> w2;      // [E_local, C, FE_local]
  std::span<float> w3;      // [E_local, FE_local, C]
};

// What one forward (+ backward) did, for stderr and metrics.
struct MoeStats {
  std::vector<int64_t> tokens_per_expert;  // [E] assignments routed to each expert, whole group, before drops
  int64_t assignments = 0;                 // N * K on this device
  int64_t dropped = 0;                     // this device's assignments dropped by the capacity
  int64_t rows_sent = 0;                   // A: rows this device sent out in the forward dispatch
  int64_t rows_received = 0;               // R: rows its experts processed
  uint64_t bytes_sent = 0;                 // this device, every all_to_all_v of forward (+ backward)
  uint64_t bytes_received = 0;
  float aux_loss = 0.0f;                   // this device's aux term (already times coef)
};

// What forward saves for backward (owned by the caller, reused across steps to avoid allocation).
struct MoeActivations {
  int64_t n_tokens = 0;                 // N
  std::vector<float> probs;             // [N, E]
  std::vector<int32_t> expert;          // [N, K] chosen experts, best first
  std::vector<float> gate;              // [N, K] renormalised gate weights
  std::vector<int64_t> row;             // [N, K] row of the assignment in the send buffer; -1 dropped
  std::vector<float> fraction;          // [E] f_e (group-wide)
  // [E] when set: f_e of a larger batch this forward is part of (gradient accumulation: the K
  // micro-batches' counts), used instead of this forward's own in the aux loss and its gradient.
  std::vector<float> batch_fraction;
  std::vector<int64_t> send_counts;     // [G] rows to each member
  std::vector<int64_t> recv_counts;     // [G] rows from each member
  std::vector<int64_t> expert_offsets;  // [E_local + 1] blocks of the expert-major receive buffer
  std::vector<int64_t> to_expert_major; // [R] source-order row -> expert-major row
  std::vector<float> xe;                // [R, C] received tokens, expert-major
  std::vector<float> h1;                // [R, FE_local] x @ w1^T
  std::vector<float> h3;                // [R, FE_local] x @ w3^T
  std::vector<float> y;                 // [A, C] expert outputs back at the sender, send order
  MoeStats stats;
};

// out[N,C] = MoE(inp[N,C]). `experts` is the expert group (each member its own tokens, or all the
// same tokens); `tensor` (optional) splits every expert's FE over its members (they must hold the
// same tokens). Returns this device's aux loss (also in acts.stats.aux_loss).
float moe_forward(std::span<float> out, MoeActivations& acts, std::span<const float> inp, const MoeWeights& w,
                  const MoeSizes& sizes, int64_t n_tokens, dist::Group& experts, dist::Group* tensor = nullptr);

// dinp += dL/dinp, grads += dL/dweights (see the gradient semantics above). dout[N,C] = dL/dout,
// d_aux = dL/d(aux loss returned by forward). Adds the backward's bytes to acts.stats.
void moe_backward(std::span<float> dinp, const MoeGrads& g, std::span<const float> dout, float d_aux,
                  std::span<const float> inp, const MoeWeights& w, MoeActivations& acts, const MoeSizes& sizes,
                  dist::Group& experts, dist::Group* tensor = nullptr);

// The MoE as a transformer block's feed-forward (model/llama_core.cpp loads it when config.is_moe()).
// Input and output [N, C] are mirrored over the tensor group and split (each member its own
// tokens) over the expert group. Experts: member e of the expert group owns local_experts(E, G, e);
// with a tensor group of size T > 1 every expert's FE is split over it as well (w1/w3 rows,
// w2 columns, dist::even_split), so tpcli infer runs a MoE model on any device count <= FE.
// Parameter names: PREFIX + "router" [E, C], "experts.w1" [E, FE, C], "experts.w2" [E, C, FE],
// "experts.w3" [E, FE, C] (full shapes; this device holds [EL, FL, C] etc.). The constructor does
// no communication (it slices full tensors).
class MoeFeedForward : public TrainableFeedForward {
 public:
  // router [E, C], w1/w3 [E, FE, C], w2 [E, C, FE]: the FULL tensors; this device keeps its slices.
  MoeFeedForward(const MoeSizes& sizes, std::span<const float> router, std::span<const float> w1,
                 std::span<const float> w2, std::span<const float> w3, dist::Group experts, dist::Group tensor,
                 std::string prefix);

  void forward(float* out, const float* inp, int64_t N) override;
  void backward(float* dinp, const float* dout, const float* inp, int64_t N) override;
  std::vector<ParamRef> parameters() override;
  // Collective over the tensor group, then the expert group: every member of both must call it.
  std::vector<std::pair<std::string, tensor::Tensor>> gather_full() override;
  float aux_loss() const override { return acts_.stats.aux_loss; }
  int64_t parameter_bytes() const override;

  // Gradient accumulation: the aux loss's f_e of the whole accumulated batch (MoeActivations::
  // batch_fraction), for every forward until cleared (empty).
  void set_batch_fraction(std::vector<float> fraction) { acts_.batch_fraction = std::move(fraction); }
  // Routing and traffic of the last forward (+ backward): per-expert counts, drops, bytes.
  const MoeStats& stats() const { return acts_.stats; }
  const MoeSizes& sizes() const { return sizes_; }
  // Frozen (LoRA's base): backward computes the input gradient alone, and parameters() is empty.
  void freeze() { frozen_ = true; }

 private:
  MoeWeights weights() const;
  MoeGrads grads();
  dist::Group* tensor_or_null() { return tensor_.size() > 1 ? &tensor_ : nullptr; }

  MoeSizes sizes_;
  dist::Group experts_, tensor_;
  std::string prefix_;
  dist::Range mine_;    // local experts, of E
  dist::Range hidden_;  // this member's rows of FE
  tensor::Tensor router_, router_grad_;  // [E, C]
  tensor::Tensor w1_, w1_grad_;          // [EL, FL, C]
  tensor::Tensor w2_, w2_grad_;          // [EL, C, FL]
  tensor::Tensor w3_, w3_grad_;          // [EL, FL, C]
  MoeActivations acts_;
  bool frozen_ = false;
};

// One local expert over frozen packed weights (a quantized or 16-bit checkpoint): this member's
// FL rows of w1 and w3 and FL columns of w2, in their stored format.
struct PackedExpert {
  QuantizedLinear w1;  // [FL, C]
  QuantizedLinear w3;  // [FL, C]
  QuantizedLinear w2;  // [C, FL]
};

// MoeFeedForward over packed experts (inference only): the same routing (f32 router), dispatch,
// combine and communication, with each local expert's SwiGLU read from its packed weights by the
// quantized kernels (tensor/packed_matrix.h), never dequantized to an f32 copy. Forward only: no
// backward, no trainable parameters.
class QuantizedMoeFeedForward : public FeedForward {
 public:
  // router [E, C] (mirrored); local: the experts local_experts(E, G, rank) of the expert group, in
  // order, each holding this member's FL of FE (the tensor group splits FE; FL equal for all).
  QuantizedMoeFeedForward(const MoeSizes& sizes, tensor::Tensor router, std::vector<PackedExpert> local,
                          dist::Group experts, dist::Group tensor);

  void forward(float* out, const float* inp, int64_t N) override;
  int64_t parameter_bytes() const override;  // the f32 router plus the experts as stored

  const MoeStats& stats() const { return acts_.stats; }

 private:
  MoeSizes sizes_;
  dist::Group experts_, tensor_;
  tensor::Tensor router_;            // [E, C]
  std::vector<PackedExpert> local_;  // [EL]
  MoeActivations acts_;
};

}  // namespace tpcli::nn

// tpcli::model — what one device of a tensor-parallel Llama communicates and computes, derived
// from the shard plan (model/shard_plan.h) and the dims alone: the collectives the model's code
// makes, in kind and size, per decoded token and per training micro-batch, and the work of this
// device item by item (gemms at their shapes, nn/ calls at theirs, passes over memory,
// exponentials, decode's matrices; PlannedWork). `tpcli inspect` and the benches' predictions
// read it; tests check it against the collectives a real decode and training step record (tests/model/test_comm_plan.cpp),
// so a change to the model's communication that is not made here too fails them.
//
// Dimension legend: C dim, V vocab, L layers, N rows of a micro-batch (B_local * T), T tensor
// devices; QL/KVL/FL/VL this device's q rows / kv rows / ffn rows / vocab rows.
//
// Per decoded token (Llama::forward), over the tensor group:
//   all_gather  C      the token's embedding row from its owner (nn/embedding.h)
//   all_sum     C      x L: wo's partial outputs            (ShardedToAll)
//   all_sum     C      x L: the feed-forward's w2 outputs   (ShardedToAll)
//   all_gather  V      the logits (sampling); greedy decoding (forward_argmax) gathers 2T floats instead
// Per training micro-batch (TrainableLlama::forward_backward), over the tensor group:
//   all_gather  N C    embedding rows;  all_sum N C x 2L forward (x 4L with recompute)
//   all_max N, all_sum 2N   the vocab-split cross-entropy
//   all_sum N C        the classifier's input gradient; all_sum N C x 2L: w1|w3's and wq|wk|wv's
//                      input gradients (sum_gradients)
//   all_sum 2 KV C     x L when KV heads are replicated over devices (their wk/wv gradients)
// MoE feed-forwards (ragged all_to_all_v, data-dependent) are not planned: plan_* throws.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "distributed/links.h"
#include "model/llama_config.h"
#include "model/shard_plan.h"

namespace tpcli::model {

// The mesh role of the group a collective runs on (the cli maps roles to axis names).
enum class Role { Tensor, Data, World };

struct PlannedCollective {
  Role role = Role::Tensor;
  const char* name = "";  // as dist::Group names it in traces: "all_sum", "all_gather", ...
  dist::CollectiveKind kind = dist::CollectiveKind::AllSum;
  int64_t floats = 0;     // the array the call is about (distributed/links.h's B = 4 x floats)
  int64_t calls = 1;      // how many such calls
  std::string what;       // "wo outputs", "logits", ...
  int64_t bytes() const { return floats * 4; }
};

// One decoded token at one device of `plan`: sampling (Llama::forward: the logits are gathered) or
// greedy (Llama::forward_argmax: a (value, token) pair per device).
std::vector<PlannedCollective> plan_decode_collectives(const LlamaConfig& config, const ShardPlan& plan,
                                                       bool greedy = false);
// One forward_backward of rows x seq_len tokens on one device of `plan`.
std::vector<PlannedCollective> plan_train_collectives(const LlamaConfig& config, const ShardPlan& plan, int64_t rows,
                                                      int64_t seq_len, bool recompute);

// One kind of work a device does, as the model's code does it, priced by perf/cost_model.h at rates
// measured in the same run: a matrix product (a BLIS gemm of [m, k] @ [k, n]; its rate depends on
// the shape), a pass over memory (bytes read + written per call: the working set sets the rate,
// cache or DRAM), exponentials (softmax, sigmoid: tensor/vec_math.h's vector exp sets the rate),
// weights streamed through the decode matvec kernels (one matrix of [m, k] as stored, `bytes` a call:
// the format's kernel at that shape sets the rate; it may dequantize slower than memory delivers).
// A call (an nn/ operation too entangled to price by parts: attention's small gemms, with softmax
// rows between them, are bound by BLIS's per-call cost and the strided operands; the norms' and
// RoPE's short scalar rows run well below the memory rate) is priced by running that operation
// at its shape.
struct PlannedWork {
  enum class Kind { Matmul, Memory, Exp, Weights, Call };
  // Call: nn/attention.h's on m = B sequences of n = T rows; nn/rmsnorm.h's on [m = N, n = C];
  // nn/rope.h's over m = N rows of n = T positions (q's heads and k's kv_heads each row).
  enum class Op { AttentionForward, AttentionBackward, RmsNormForward, RmsNormBackward, RopeForward, RopeBackward };
  // Which operands the gemm reads transposed (row-major): NT = a[m, k] @ b[n, k]^T (a linear
  // forward), NN = a[m, k] @ b[k, n] (an input gradient), TN = a[k, m]^T @ b[k, n] (a weight
  // gradient). BLIS packs each layout differently, so each has its own rate.
  enum class Gemm { NT, NN, TN };
  Kind kind = Kind::Matmul;
  std::string what;           // "w1|w3 forward", "attention softmax", ... (lines of equal `what` add up)
  int64_t m = 0, n = 0, k = 0;  // Matmul
  int64_t bytes = 0;          // Memory, Weights: per call
  int64_t elements = 0;       // Exp, per call
  int64_t calls = 1;
  bool backward = false;      // part of the backward pass (data-parallel buckets overlap with it)
  Gemm gemm = Gemm::NT;       // Matmul
  std::string tensor;         // Weights: the parameter read (llama_parameters' name, layer 0: its stored format)
  Op op = Op::AttentionForward;  // Call
  int64_t heads = 0, kv_heads = 0, head_size = 0;  // Call: local heads, local KV heads, HS
  double call_flops = 0;      // Call: the FLOPs of its gemms, per call
  double flops() const {
    const double c = static_cast<double>(calls);
    if (kind == Kind::Call) return call_flops * c;
    return kind == Kind::Matmul ? 2.0 * static_cast<double>(m * n) * static_cast<double>(k) * c : 0.0;
  }
};

// What one forward_backward of rows x seq_len tokens does on one device of `plan`, item by item:
// every gemm of the linear layers (forward; backward: input gradient and weight gradient), the
// blocked causal attention as calls (nn/attention.cpp: blocks of 64 rows, 2 gemms and a softmax
// forward, 4 gemms and the softmax's gradient backward; their FLOPs are the gemms'),
// the classifier, the norms and RoPE as calls, and the passes over memory around them (residuals,
// SwiGLU, cross-entropy, the zero-filled gradient buffers). With recompute, the blocks' forward
// twice. Dense models only (throws for MoE, like the collectives).
std::vector<PlannedWork> plan_train_work(const LlamaConfig& config, const ShardPlan& plan, int64_t rows, int64_t seq_len,
                                         bool recompute);
double total_flops(const std::vector<PlannedWork>& work);
// How decode holds its matrices: the bytes of this device's [rows, cols] of a parameter as stored
// (model/packed_weights.h stored_bytes), and whether wq|wk|wv and w1|w3 are one fused f32 matrix
// each (a trainable model, nn/linear.h) or run part by part (a frozen one, nn/quantized_linear.h).
struct DecodeStorage {
  std::function<int64_t(const std::string& tensor, int64_t rows, int64_t cols)> bytes;
  bool fused = false;
};
// One decoded token at position pos on one device: every matrix read once through the matvec
// kernels, one Weights item per matrix shape (wq|wk|wv or wq, wk, wv; wo; w1|w3 or w1, w3; w2 --
// L calls each -- and the classifier: `output`, or the embedding when shared), the KV cache read up
// to pos, the attention softmax and SwiGLU exponentials. Decode streams the weights: memory (or the
// kernel's dequantizing), not FLOPs, bounds it. The embedding's one row is not counted.
std::vector<PlannedWork> plan_decode_work(const LlamaConfig& config, const ShardPlan& plan, int64_t pos,
                                          const DecodeStorage& storage);

// Multiply-add FLOPs (2 per MAC) of this device's matrix products: one decoded token at position
// pos (weights and attention over pos + 1 cached positions), and one forward_backward (the gemms of
// plan_train_work: 3x the forward's; 4x with recompute; attention's blocks include the masked part
// of the diagonal block, which the gemms compute).
double decode_flops(const LlamaConfig& config, const ShardPlan& plan, int64_t pos);
double train_flops(const LlamaConfig& config, const ShardPlan& plan, int64_t rows, int64_t seq_len, bool recompute);

}  // namespace tpcli::model

// tpcli::nn — LoRA adapters (Hu et al., 2021) on the tensor-parallel linears: a frozen W gains a
// trained low-rank update, y = x W^T + scale * (x A^T) B^T, with A [r, IN], B [OUT, r] and
// scale = alpha / r. An adapter is sharded like the layer it adapts, so its output is laid out
// like the base's and it adds no collective of its own:
//
//   on AllToShardedLinear (output rows split; wq wk wv w1 w3):
//     A [r, IN] replicated, B [OUT_local, r] split by rows like W.
//     forward:  xa = x A^T [N, r] (the same on every device), out_local += scale * xa B_local^T.
//               No communication.
//     backward: dxa_partial = scale * dout_local B_local [N, r]; it rides in the base's all-sum
//               (sum_gradients), widened from [N, IN] to [N, IN + r]. Then dinp += dxa A,
//               dA += dxa^T x (the same on every device, as a replicated parameter must be),
//               dB_local += scale * dout_local^T xa.
//   on ShardedToAllLinear (input columns split; wo w2):
//     A [r, IN_local] split by columns like W, B [OUT, r] replicated.
//     forward:  xa_partial = x_local A_local^T [N, r] joins the base's all-sum, widened from
//               [N, OUT] to [N, OUT + r]; then out += scale * xa B^T on every device.
//     backward: dxa = scale * dout B [N, r] (dout is mirrored), dinp_local += dxa A_local,
//               dA_local += dxa^T x_local, dB += scale * dout^T xa. No communication.
//
// The base W stays frozen (the layers' freeze(): no weight gradient is computed). B starts at zero,
// so a fresh adapter leaves the model's outputs unchanged.
//
// Dropout (PEFT's lora_dropout) acts on the adapter's input alone: x A^T becomes (x * mask) A^T,
// mask = 0 with probability p, else 1 / (1 - p); the backward scales the adapter's input gradient
// by the same mask. The mask of element (row, column) is a hash of (the pass's seed, the adapter's
// stream, the row's and the column's GLOBAL indices): every tensor device of a row draws the same
// mask (as a replicated A needs), and every mesh draws the same masks as one device.
//
// The adapter arithmetic is the functions below, whatever the base: the f32 linears (nn/linear.h)
// and the packed ones (nn/quantized_linear.h: QLoRA, a frozen quantized or 16-bit base) call the
// same ones, so an adapter trains alike on both; only the base's products differ.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace tpcli::nn {

struct LoraAdapter {
  tensor::Tensor a;       // [r, IN] (AllToSharded) or [r, IN_local] (ShardedToAll)
  tensor::Tensor b;       // [OUT_local, r] (AllToSharded) or [OUT, r] (ShardedToAll)
  tensor::Tensor a_grad;  // same shape as a
  tensor::Tensor b_grad;  // same shape as b
  float scale = 1.0f;     // alpha / r

  float dropout = 0.0f;        // p in [0, 1)
  uint64_t stream = 0;         // this adapter's random stream
  int64_t column_offset = 0;   // global index of the input's first column (ShardedToAll: this device's)
  // Set for each training pass (model/trainable_llama.h); pass_seed 0 = no dropout (evaluation).
  uint64_t pass_seed = 0;
  int64_t row_offset = 0;      // global index of the pass's first row

  int64_t rank() const { return a.dim(0); }
  bool drops() const { return dropout > 0.0f && pass_seed != 0; }
};

// splitmix64's finaliser: the adapters' random streams (A's initial values, dropout's masks).
uint64_t mix64(uint64_t x);

// An adapter with zero gradients: a and b as given, scale = alpha / rank.
LoraAdapter make_lora_adapter(tensor::Tensor a, tensor::Tensor b, double alpha);

// ---- on an AllToSharded base ----
// adapters[i] sits on part i of the base (wq|wk|wv, w1|w3), whose rows[i] output rows follow the
// earlier parts' in a row of out [N, OUT_local] (OUT_local = the sum of rows); an adapter with an
// empty a (or past the end of adapters) is none. IN = the input features.

// R: the adapters' ranks added up (0: none).
int64_t lora_rank_sum(std::span<const LoraAdapter> adapters);
// out[N, OUT_local] += every adapter's scale * (inp[N, IN] A^T) B^T. No communication.
void lora_parts_forward(float* out, const float* inp, int64_t N, int64_t IN, std::span<const int64_t> rows,
                        std::span<const LoraAdapter> adapters);
// dxa[N, R] = every adapter's scale * dout[:, part] @ B (column blocks in part order; partial:
// the caller all-sums it with the base's dinp), and dB += scale * dout[:, part]^T (inp A^T).
void lora_parts_output_gradients(float* dxa, const float* dout, const float* inp, int64_t N, int64_t IN,
                                 std::span<const int64_t> rows, std::span<LoraAdapter> adapters);
// After the all-sum of dxa: dinp[N, IN] += dxa @ A (dinp may be null) and dA += dxa^T inp.
void lora_parts_input_gradients(float* dinp, const float* dxa, const float* inp, int64_t N, int64_t IN,
                                std::span<LoraAdapter> adapters);

// ---- on a ShardedToAll base ----
// xa[N, r] = inp[N, IN_local] @ A_local^T (partial: the caller all-sums it with the base's output).
// IN_local = 0: xa is left as it is (the caller's zeros).
void lora_partial_xa(float* xa, const float* inp, int64_t N, const LoraAdapter& ad);
// out[N, OUT] += scale * xa[N, r] @ B^T, xa summed over the group.
void lora_add_output(float* out, const float* xa, int64_t N, const LoraAdapter& ad);
// dout[N, OUT] mirrored, xa[N, r] the forward's (summed): dB += scale * dout^T xa; then
// dinp[N, IN_local] += dxa A_local (dinp may be null) and dA_local += dxa^T inp, with
// dxa = scale * dout B. No communication.
void lora_mirrored_backward(float* dinp, const float* dout, const float* xa, const float* inp, int64_t N,
                            LoraAdapter& ad);
// The adapter's input inp[N, IN] after its dropout: inp itself when it drops nothing this pass, else
// scratch filled with inp * mask.
const float* lora_input(const LoraAdapter& adapter, const float* inp, int64_t N, int64_t IN, std::vector<float>& scratch);
// g[N, IN] *= mask (dropout's backward; nothing when it drops nothing).
void lora_input_gradient(const LoraAdapter& adapter, float* g, int64_t N, int64_t IN);

}  // namespace tpcli::nn

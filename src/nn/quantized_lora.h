// tpcli::nn — LoRA's low-rank update beside the inference model's linears (nn/quantized_linear.h,
// f32 or packed), unmerged and frozen: out += scale * (inp @ A^T) @ B^T beside the base layer's
// out = inp @ W^T, sharded as that layer. (Training's adapters, with gradients, on the f32 linears
// of nn/linear.h: nn/lora.h.)
//
// Dimension legend: N rows (tokens), IN input features, OUT output features, r rank;
// *_local = this device's shard.
//
// LoraAllToSharded (beside an AllToSharded base: wq wk wv, w1 w3): A [r, IN] mirrored, B's rows
//   split as the base's rows (B_local [OUT_local, r]); t[N, r] = inp @ A^T is computed whole on
//   every device and out_local += scale * t @ B_local^T. No communication.
// LoraShardedToAll (beside a ShardedToAll base: wo, w2): A split by columns as the base
//   (A_local [r, IN_local]), B [OUT, r] mirrored. t_local[N, r] = inp_local @ A_local^T is partial;
//   one all_sum of [N, r] (its own, r floats per row: small beside the base's [N, OUT]) makes it
//   mirrored, then out += scale * t @ B^T on every device.
//   Like the base (nn/quantized_linear.h), t adds its input columns in lanes: the device's IN_local
//   columns are cut into the base's lane count, each lane's product is computed alone and the
//   lanes are added as distributed/tree_reduce.h's tree, which the all_sum continues; so on a
//   split-invariant mesh the update, too, is the same bits on 1 device and on D.
// Every product is a plain loop in a fixed order (row by row), so a row's bits depend on nothing
// but that row: the batched engine's rows match forward() alone.
#pragma once

#include <cstdint>
#include <vector>

#include "distributed/group.h"
#include "tensor/tensor.h"

namespace tpcli::nn {

class LoraAllToSharded {
 public:
  // One adapted part of the base's output: its columns [column, column + OUT_local) of out's rows.
  struct Part {
    tensor::Tensor a;    // [r, IN] mirrored
    tensor::Tensor b;    // [OUT_local, r] this device's rows of B
    int64_t column = 0;  // where the part's OUT_local columns start in a row of out
  };
  LoraAllToSharded() = default;
  LoraAllToSharded(std::vector<Part> parts, float scale);

  bool empty() const { return parts_.empty(); }
  // out[N, ld_out] (its parts' columns) += scale * (inp[N, IN] @ A^T) @ B_local^T. No communication.
  void forward_add(float* out, int64_t ld_out, const float* inp, int64_t N) const;
  int64_t bytes() const;

 private:
  std::vector<Part> parts_;
  float scale_ = 1.0f;
};

class LoraShardedToAll {
 public:
  LoraShardedToAll() = default;
  // a_local [r, IN_local] (IN_local a multiple of lanes), b [OUT, r].
  LoraShardedToAll(tensor::Tensor a_local, tensor::Tensor b, int lanes, float scale, dist::Group group);

  // out[N, OUT] += scale * all_sum(inp[N, IN_local] @ A_local^T) @ B^T. A collective (all_sum of [N, r]).
  void forward_add(float* out, const float* inp, int64_t N);
  int64_t bytes() const { return (a_.numel() + b_.numel()) * static_cast<int64_t>(sizeof(float)); }

 private:
  tensor::Tensor a_;  // [r, IN_local]
  tensor::Tensor b_;  // [OUT, r]
  int lanes_ = 1;
  float scale_ = 1.0f;
  dist::Group group_;
};

}  // namespace tpcli::nn

// tpcli::nn — Linear and its tensor-parallel forms (MLX's recipe).
//
// Dimension legend: N rows (tokens: B*T in training, 1 in decode), IN input features, OUT output
// features; *_local = this device's shard.
//
// Layout transitions and their communication:
//   Linear              [N, IN] -> [N, OUT]              no communication
//   AllToShardedLinear  mirrored [N, IN] -> split [N, OUT_local]
//                       forward: local rows only; backward: all_sum of dinp (MLX sum_gradients)
//   ShardedToAllLinear  split [N, IN_local] -> mirrored [N, OUT]
//                       forward: local columns, then all_sum; backward: gradient passes through
// Weights are [OUT, IN] (rows are output features, as PyTorch, llama2.c, MLX). A fused weight
// (e.g. QKV, or w1|w3) is split segment by segment: each segment keeps its own row range.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "distributed/group.h"
#include "nn/lora.h"
#include "tensor/tensor.h"

namespace tpcli::nn {

class Linear {
 public:
  Linear() = default;
  explicit Linear(tensor::Tensor weight);  // [OUT, IN]

  int64_t out_features() const { return weight_.dim(0); }
  int64_t in_features() const { return weight_.dim(1); }
  tensor::Tensor& weight() { return weight_; }
  const tensor::Tensor& weight() const { return weight_; }
  tensor::Tensor& grad();  // [OUT, IN], allocated (zero) on first use
  bool has_grad() const { return !grad_.empty(); }
  // A frozen weight (LoRA's base, a fine-tune's classifier) gets no gradient: backward computes
  // only dinp.
  void set_frozen(bool frozen) { frozen_ = frozen; }
  bool frozen() const { return frozen_; }

  // out[N, OUT] (row stride ld_out, 0 = OUT) = inp[N, IN] @ weight^T. N == 1 uses matvec.
  void forward(float* out, const float* inp, int64_t N, int64_t ld_out = 0) const;
  // dinp[N, IN] += dout @ weight (skipped when dinp is null); dweight += dout^T @ inp (skipped
  // when frozen). dout has row stride ld_dout (0 = OUT).
  void backward(float* dinp, const float* dout, const float* inp, int64_t N, int64_t ld_dout = 0);

 private:
  tensor::Tensor weight_;  // [OUT, IN]
  tensor::Tensor grad_;    // [OUT, IN] or empty
  bool frozen_ = false;
};

// One segment of a fused dimension: `size` rows (or columns) of the full weight, of which this
// device keeps `local` (offset relative to the segment's start). Ranges come from the planner.
struct Segment {
  int64_t size = 0;
  dist::Range local;
};
// `parts` equal segments of n, each split by dist::even_split over the group (MLX's segments=k).
std::vector<Segment> even_segments(int64_t n, int parts, const dist::Group& group);

class AllToShardedLinear {
 public:
  AllToShardedLinear() = default;
  // parts: this device's rows of each segment, in segment order (all with the same IN).
  AllToShardedLinear(std::vector<Linear> parts, dist::Group group);

  int64_t in_features() const { return parts_.at(0).in_features(); }
  int64_t out_features() const { return out_local_; }  // OUT_local: sum of the parts' rows
  int n_parts() const { return static_cast<int>(parts_.size()); }
  Linear& part(int i) { return parts_.at(static_cast<size_t>(i)); }
  const Linear& part(int i) const { return parts_.at(static_cast<size_t>(i)); }
  // Every part's weight frozen (no weight gradients).
  void freeze();
  // LoRA on part i (nn/lora.h): a [r, IN], b [part's OUT_local rows, r]. Whole rows only: the
  // sequence-parallel products (forward_columns, input_gradient, weight_gradients) ignore adapters.
  void set_adapter(int i, LoraAdapter adapter);
  // Part i's adapter, or null.
  LoraAdapter* adapter(int i);

  // out[N, OUT_local] = inp[N, IN] @ W_local^T (+ the adapters'), the segments' local outputs
  // concatenated per row.
  void forward(float* out, const float* inp, int64_t N) const;
  // out[N, OUT_local] (+)= inp[N, cols] (row stride ld_inp) @ W_local[:, col0 : col0 + cols]^T: the
  // product over one block of the input features (the contraction-gathering collective matmul).
  void forward_columns(float* out, const float* inp, int64_t ld_inp, int64_t N, int64_t col0, int64_t cols,
                       bool accumulate) const;
  // dinp[N, IN] += all_sum over the group of dout[N, OUT_local] @ W_local; dW_local += dout^T @ inp
  // (unless frozen); the adapters' gradients (nn/lora.h). A collective: every member calls it.
  void backward(float* dinp, const float* dout, const float* inp, int64_t N);
  // The two halves of backward without its all-sum (sequence parallelism reduce-scatters instead):
  // target[N, IN] (+)= dout[N, OUT_local] @ W_local, one product over every part when fused;
  // dW_part += dout[:, part's columns]^T @ inp for every part.
  void input_gradient(float* target, const float* dout, int64_t N, bool accumulate) const;
  void weight_gradients(const float* dout, const float* inp, int64_t N);

 private:
  // Whether the parts' weights still sit one after another in fused_ (a copy of this object gives
  // each part its own storage: then every product goes part by part).
  bool fused() const;
  int64_t adapter_rank_sum() const;  // R: the adapters' ranks added up (0: none)
  std::vector<int64_t> part_rows() const;  // every part's OUT_local rows

  std::vector<Linear> parts_;      // weights: views of fused_, in segment order
  tensor::Tensor fused_;           // [OUT_local, IN] W_local, the parts' rows one after another
  int64_t out_local_ = 0;
  dist::Group group_;
  std::vector<LoraAdapter> adapters_;  // per part; empty a = none
  std::vector<float> dinp_partial_;  // [N, IN + R] scratch: the base's partial dinp, then the adapters' dxa
};

class ShardedToAllLinear {
 public:
  ShardedToAllLinear() = default;
  ShardedToAllLinear(Linear local, dist::Group group);  // local: [OUT, IN_local]

  int64_t in_features() const { return local_.in_features(); }  // IN_local
  int64_t out_features() const { return local_.out_features(); }
  Linear& local() { return local_; }
  const Linear& local() const { return local_; }
  void freeze() { local_.set_frozen(true); }
  // LoRA (nn/lora.h): a [r, IN_local], b [OUT, r].
  void set_adapter(LoraAdapter adapter);
  LoraAdapter* adapter() { return adapter_.a.empty() ? nullptr : &adapter_; }

  // out[N, OUT] (mirrored) = all_sum(inp[N, IN_local] @ W_local^T) (+ the adapter's). A collective.
  void forward(float* out, const float* inp, int64_t N);
  // dinp[N, IN_local] += dout[N, OUT] @ W_local; dW_local += dout^T @ inp (unless frozen); the
  // adapter's gradients. No communication.
  void backward(float* dinp, const float* dout, const float* inp, int64_t N);

 private:
  void forward_with_adapter(float* out, const float* inp, int64_t N);

  Linear local_;
  dist::Group group_;
  LoraAdapter adapter_;          // a empty: none
  std::vector<float> summed_;    // [N, OUT + r] scratch: the widened all-sum
  std::vector<float> xa_;        // [N, r] the last forward's inp A^T, summed over the group
};

enum class Sharding { AllToSharded, ShardedToAll };
using ShardedLinear = std::variant<AllToShardedLinear, ShardedToAllLinear>;

// MLX's shard_linear: this device's shard of a full Linear. AllToSharded splits output rows,
// ShardedToAll input columns, segment by segment (empty segments: one segment, even split).
// The segment sizes must add up to the split dimension.
ShardedLinear shard_linear(const Linear& linear, Sharding sharding, dist::Group group,
                           std::vector<Segment> segments = {});
// MLX's shard_inplace: slice the parameters the same way, keep a plain Linear (no communication
// is added: the caller does its own).
void shard_inplace(Linear& linear, Sharding sharding, const dist::Group& group, std::vector<Segment> segments = {});

// Slicing helpers (also used by the model loader, which copies only its slices from a full tensor).
// Rows [r.offset, +r.count) of a row-major [rows, cols] matrix.
tensor::Tensor slice_rows(const float* full, int64_t cols, dist::Range r);
// Columns of a row-major [rows, cols] matrix: the listed ranges, concatenated.
tensor::Tensor slice_columns(const float* full, int64_t rows, int64_t cols, const std::vector<dist::Range>& ranges);

}  // namespace tpcli::nn

// tpcli::nn — MLX's QuantizedLinear and its tensor-parallel forms (QuantizedAllToShardedLinear,
// QuantizedShardedToAllLinear), over tensor::PackedMatrix: affine (bits, group size), mxfp8, or
// 16-bit float storage (bf16/f16 checkpoints), all computed with f32 accumulation.
//
// Dimension legend: N rows (tokens), IN input features, OUT output features, GS group size;
// *_local = this device's shard.
//
// The weights are frozen (no weight gradients), but the input gradient flows through them
// (QLoRA: LoRA adapters train beside a frozen quantized base): backward is dinp += dout @ W with W
// dequantized a column block at a time (tensor::PackedMatrix::transposed_product), never as a
// whole f32 copy. Communication is that of the f32 twins (nn/linear.h):
//   QuantizedLinear              forward: none;     backward: none
//   QuantizedAllToShardedLinear  forward: none;     backward: all_sum of dinp (MLX sum_gradients)
//   QuantizedShardedToAllLinear  forward: all_sum;  backward: none (the gradient passes through)
// Trained LoRA adapters (nn/lora.h) sit on the sharded forms as on their f32 twins, with the same
// arithmetic (nn/lora.h's functions) and collectives: on QuantizedAllToShardedLinear the adapters'
// dxa [N, R] rides in backward's all_sum, widened from [N, IN] to [N, IN + R]; on
// QuantizedShardedToAllLinear the adapter's xa [N, r] rides in forward's, widened from [N, OUT] to
// [N, OUT + r]. (Frozen, unmerged adapters for inference: nn/quantized_lora.h.)
// Sharding by input columns keeps whole groups (MLX: each rank holds whole groups): groups are
// dealt out as evenly as possible, and a split that would cut a group is an error naming it.
#pragma once

#include <cstdint>
#include <variant>
#include <vector>

#include "distributed/group.h"
#include "nn/linear.h"
#include "tensor/packed_matrix.h"

namespace tpcli::nn {

class QuantizedLinear {
 public:
  QuantizedLinear() = default;
  explicit QuantizedLinear(tensor::PackedMatrix weight);  // [OUT, IN]
  // A device's input columns that cut the weight's quantization groups: `weight` holds the whole
  // groups they touch, [OUT, lead + IN + the rest], and the input sits among zeros at `lead`, so
  // the stored blocks are kept (no f32 copy) and the zeros add nothing to any sum.
  QuantizedLinear(tensor::PackedMatrix weight, int64_t lead, int64_t in_features);
  // MLX's QuantizedLinear.from_linear: the f32 weight in `format` (IN % GS == 0 when quantized).
  static QuantizedLinear from_linear(const Linear& linear, tensor::WeightFormat format);

  int64_t out_features() const { return weight_.rows(); }
  int64_t in_features() const { return in_; }
  const tensor::WeightFormat& format() const { return weight_.format(); }  // bits, group size, mode
  const tensor::PackedMatrix& weight() const { return weight_; }
  int64_t bytes() const { return weight_.bytes(); }

  // out[N, OUT] (row stride ld_out, 0 = OUT) = inp[N, IN] @ W^T. N == 1: the packed matvec kernels.
  void forward(float* out, const float* inp, int64_t N, int64_t ld_out = 0) const;
  // dinp[N, IN] += dout[N, OUT] (row stride ld_dout, 0 = OUT) @ W. No weight gradient, no communication.
  void backward(float* dinp, const float* dout, int64_t N, int64_t ld_dout = 0) const {
    input_gradient(dinp, dout, N, true, ld_dout);
  }
  // target[N, IN] (row stride ld_target, 0 = IN) (+)= dout[N, OUT] (row stride ld_dout) @ W.
  void input_gradient(float* target, const float* dout, int64_t N, bool accumulate, int64_t ld_dout = 0,
                      int64_t ld_target = 0) const;

 private:
  bool padded() const { return in_ != weight_.cols(); }

  tensor::PackedMatrix weight_;  // [OUT, lead_ + IN + the rest]
  int64_t lead_ = 0, in_ = 0;
};

// Replicated in, split out: out[N, OUT_local] = inp @ W_local^T, the segments' outputs concatenated
// per row (as AllToShardedLinear). No communication.
class QuantizedAllToShardedLinear {
 public:
  QuantizedAllToShardedLinear() = default;
  QuantizedAllToShardedLinear(std::vector<QuantizedLinear> parts, dist::Group group);

  int64_t in_features() const { return parts_.at(0).in_features(); }
  int64_t out_features() const { return out_local_; }
  int n_parts() const { return static_cast<int>(parts_.size()); }
  const QuantizedLinear& part(int i) const { return parts_.at(static_cast<size_t>(i)); }
  int64_t bytes() const;  // the packed weights' (not the adapters')
  // A trained LoRA adapter on part i (nn/lora.h): a [r, IN], b [part's OUT_local rows, r].
  void set_adapter(int i, LoraAdapter adapter);
  LoraAdapter* adapter(int i);  // part i's adapter, or null

  // out[N, OUT_local] = inp @ W_local^T (+ the adapters').
  void forward(float* out, const float* inp, int64_t N) const;
  // dinp[N, IN] += all_sum over the group of dout[N, OUT_local] @ W_local (partial -> mirrored:
  // MLX's sum_gradients). A collective: every member calls it (dinp null: the sum still runs,
  // nothing is added). Without adapters only.
  void backward(float* dinp, const float* dout, int64_t N);
  // The same with the adapters' gradients (inp[N, IN] is forward's input): their dxa joins the
  // all_sum, then dinp += dxa A, dA and dB accumulate (nn/lora.h).
  void backward(float* dinp, const float* dout, const float* inp, int64_t N);
  // backward without its all_sum: target[N, IN] (+)= dout[N, OUT_local] @ W_local, part by part
  // (dout's columns are the parts' rows in order). No communication.
  void input_gradient(float* target, const float* dout, int64_t N, bool accumulate) const;

 private:
  std::vector<int64_t> part_rows() const;  // every part's OUT_local rows

  std::vector<QuantizedLinear> parts_;
  int64_t out_local_ = 0;
  dist::Group group_;
  std::vector<LoraAdapter> adapters_;  // per part; empty a = none
  std::vector<float> dinp_partial_;  // [N, IN + R] backward's scratch: the base's dinp, then the adapters' dxa
};

// Split in, replicated out: out[N, OUT] = all_sum(inp[N, IN_local] @ W_local^T). A collective.
//
// Lanes fix the order of the sum over IN (inference's split-invariant sum): the full matrix's
// columns are cut into L equal lanes, this device holds a run of them, each lane's product is
// computed alone and the lanes are added as the balanced tree of distributed/tree_reduce.h, which
// the all_sum (the same tree over the devices) continues. When every device holds a whole subtree
// (L / D lanes, D a power of two), out is the same bits on 1 device and on D.
class QuantizedShardedToAllLinear {
 public:
  QuantizedShardedToAllLinear() = default;
  QuantizedShardedToAllLinear(QuantizedLinear local, dist::Group group);  // one lane
  // lanes: this device's lanes in order, each [OUT, IN_local / lanes.size()].
  QuantizedShardedToAllLinear(std::vector<QuantizedLinear> lanes, dist::Group group);

  int64_t in_features() const { return in_local_; }  // IN_local
  int64_t out_features() const { return lanes_.at(0).out_features(); }
  int lanes() const { return static_cast<int>(lanes_.size()); }
  const QuantizedLinear& lane(int i) const { return lanes_.at(static_cast<size_t>(i)); }
  int64_t bytes() const;  // the packed weights' (not the adapter's)
  // A trained LoRA adapter (nn/lora.h): a [r, IN_local], b [OUT, r].
  void set_adapter(LoraAdapter adapter);
  LoraAdapter* adapter() { return adapter_.a.empty() ? nullptr : &adapter_; }

  // With an adapter, its partial xa [N, r] joins the all_sum and out += scale * xa B^T.
  void forward(float* out, const float* inp, int64_t N);
  // dinp[N, IN_local] += dout[N, OUT] (mirrored) @ W_local: every lane's product into its own
  // columns of dinp. No communication (forward's all_sum is the gradient's pass-through).
  void backward(float* dinp, const float* dout, int64_t N) const { input_gradient(dinp, dout, N, true); }
  // The same and the adapter's gradients (inp[N, IN_local]: forward's input). No communication.
  void backward(float* dinp, const float* dout, const float* inp, int64_t N);
  void input_gradient(float* target, const float* dout, int64_t N, bool accumulate) const;

 private:
  void local_forward(float* out, const float* inp, int64_t N) const;  // the partial sum, lane by lane

  std::vector<QuantizedLinear> lanes_;
  int64_t in_local_ = 0;
  dist::Group group_;
  LoraAdapter adapter_;        // a empty: none
  std::vector<float> summed_;  // [N, OUT + r] scratch: the widened all_sum
  std::vector<float> xa_;      // [N, r] the last forward's inp A^T, summed over the group
};

using QuantizedShardedLinear = std::variant<QuantizedAllToShardedLinear, QuantizedShardedToAllLinear>;

// MLX's shard_linear for a QuantizedLinear (format carried over). AllToSharded splits output rows
// segment by segment; ShardedToAll splits input columns on whole groups: with no segments, the
// row's groups are dealt out by even_split; given segments must start and end on group boundaries
// (std::invalid_argument naming the columns and the group size otherwise).
QuantizedShardedLinear shard_linear(const QuantizedLinear& linear, Sharding sharding, dist::Group group,
                                    std::vector<Segment> segments = {});
// MLX's shard_inplace for quantized parameters: the same slicing, kept as a plain QuantizedLinear.
void shard_inplace(QuantizedLinear& linear, Sharding sharding, const dist::Group& group,
                   std::vector<Segment> segments = {});
// `parts` equal segments of n columns, each split over the group in whole units of `unit`
// columns (a group size), dealt out as evenly as possible.
std::vector<Segment> even_group_segments(int64_t n, int parts, int64_t unit, const dist::Group& group);

}  // namespace tpcli::nn

// tpcli::nn — int8 group-wise quantized Linear and its tensor-parallel forms (MLX's
// QuantizedAllToShardedLinear / QuantizedShardedToAllLinear). Inference layers: the weights are
// frozen, backward gives only the input gradient (so a quantized model can still be fine-tuned
// through, or probed).
//
// Dimension legend: N rows, IN input features, OUT output features, G group size, NG = ceil(IN/G)
// groups per row (the last may be shorter); *_local = this device's shard.
// Quantization: per row and group of G consecutive inputs, scale = max|w| / 127 and
// q = round(w / scale) in [-127, 127]; dequantized w' = q * scale (|w - w'| <= scale / 2).
// Sharding happens on the float weights first (shard_linear), then each shard is quantized, so a
// ShardedToAll shard's groups start at its own first column.
#pragma once

#include <cstdint>
#include <vector>

#include "dist/group.h"
#include "nn/linear.h"
#include "tensor/tensor.h"

namespace tpcli::nn {

class QuantizedLinear {
 public:
  QuantizedLinear() = default;
  // weight [OUT, IN]; group_size >= 1.
  QuantizedLinear(const tensor::Tensor& weight, int group_size);

  int64_t out_features() const { return out_; }
  int64_t in_features() const { return in_; }
  int group_size() const { return group_; }
  int64_t bytes() const;  // int8 values + f32 scales
  tensor::Tensor dequantize() const;  // [OUT, IN]

  // out[N, OUT] (row stride ld_out, 0 = OUT) = inp[N, IN] @ dequant(W)^T, dequantizing on the fly.
  void forward(float* out, const float* inp, int64_t N, int64_t ld_out = 0) const;
  // dinp[N, IN] += dout[N, OUT] (row stride ld_dout, 0 = OUT) @ dequant(W).
  void backward_input(float* dinp, const float* dout, int64_t N, int64_t ld_dout = 0) const;

 private:
  int64_t out_ = 0, in_ = 0, groups_ = 0;  // OUT, IN, NG
  int group_ = 32;                          // G
  std::vector<int8_t> q_;                   // [OUT, IN]
  std::vector<float> scales_;               // [OUT, NG]
};

// Replicated in, split out: forward local rows (no communication); backward all_sums dinp.
class QuantizedAllToShardedLinear {
 public:
  QuantizedAllToShardedLinear(const AllToShardedLinear& layer, dist::Group group, int group_size);
  int64_t out_features() const { return out_local_; }
  // out[N, OUT_local], the segments' outputs concatenated per row (as AllToShardedLinear).
  void forward(float* out, const float* inp, int64_t N) const;
  // dinp[N, IN] += all_sum(dout @ dequant(W_local)). A collective.
  void backward(float* dinp, const float* dout, int64_t N);
  int64_t bytes() const;

 private:
  std::vector<QuantizedLinear> parts_;
  int64_t out_local_ = 0;
  dist::Group group_;
  std::vector<float> scratch_;  // [N, IN]
};

// Split in, replicated out: forward ends in an all_sum; backward passes the gradient through.
class QuantizedShardedToAllLinear {
 public:
  QuantizedShardedToAllLinear(const ShardedToAllLinear& layer, dist::Group group, int group_size);
  // out[N, OUT] = all_sum(inp[N, IN_local] @ dequant(W_local)^T). A collective.
  void forward(float* out, const float* inp, int64_t N);
  // dinp[N, IN_local] += dout[N, OUT] @ dequant(W_local). No communication.
  void backward(float* dinp, const float* dout, int64_t N) const;
  int64_t bytes() const { return local_.bytes(); }

 private:
  QuantizedLinear local_;
  dist::Group group_;
};

}  // namespace tpcli::nn

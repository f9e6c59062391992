#include "nn/quantized_linear.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace tpcli::nn {

QuantizedLinear::QuantizedLinear(const tensor::Tensor& weight, int group_size) : group_(group_size) {
  if (weight.rank() != 2)
    throw std::invalid_argument("quantized linear: weight must be [out, in], got " + tensor::to_string(weight.shape()));
  if (group_size < 1) throw std::invalid_argument("quantized linear: group size " + std::to_string(group_size) + " < 1");
  out_ = weight.dim(0);
  in_ = weight.dim(1);
  groups_ = (in_ + group_ - 1) / group_;
  q_.resize(static_cast<size_t>(out_ * in_));
  scales_.resize(static_cast<size_t>(out_ * groups_));
  for (int64_t o = 0; o < out_; ++o)
    for (int64_t g = 0; g < groups_; ++g) {
      const int64_t first = g * group_, last = std::min(in_, first + group_);
      const float* w = weight.data() + o * in_;
      float amax = 0.0f;
      for (int64_t i = first; i < last; ++i) amax = std::max(amax, std::abs(w[i]));
      const float scale = amax / 127.0f;
      scales_[static_cast<size_t>(o * groups_ + g)] = scale;
      const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
      for (int64_t i = first; i < last; ++i)
        q_[static_cast<size_t>(o * in_ + i)] = static_cast<int8_t>(std::lround(std::clamp(w[i] * inv, -127.0f, 127.0f)));
    }
}

int64_t QuantizedLinear::bytes() const {
  return static_cast<int64_t>(q_.size()) + static_cast<int64_t>(scales_.size() * sizeof(float));
}

tensor::Tensor QuantizedLinear::dequantize() const {
  tensor::Tensor w({out_, in_});
  for (int64_t o = 0; o < out_; ++o)
    for (int64_t i = 0; i < in_; ++i)
      w[o * in_ + i] = static_cast<float>(q_[static_cast<size_t>(o * in_ + i)]) * scales_[static_cast<size_t>(o * groups_ + i / group_)];
  return w;
}

void QuantizedLinear::forward(float* out, const float* inp, int64_t N, int64_t ld_out) const {
  const int64_t ld = ld_out ? ld_out : out_;
  for (int64_t n = 0; n < N; ++n) {
    const float* x = inp + n * in_;
    for (int64_t o = 0; o < out_; ++o) {
      const int8_t* q = q_.data() + o * in_;
      const float* s = scales_.data() + o * groups_;
      float acc = 0.0f;
      for (int64_t g = 0; g < groups_; ++g) {
        const int64_t first = g * group_, last = std::min(in_, first + group_);
        float part = 0.0f;  // the group's dot product, scaled once
        for (int64_t i = first; i < last; ++i) part += static_cast<float>(q[i]) * x[i];
        acc += part * s[g];
      }
      out[n * ld + o] = acc;
    }
  }
}

void QuantizedLinear::backward_input(float* dinp, const float* dout, int64_t N, int64_t ld_dout) const {
  const int64_t ld = ld_dout ? ld_dout : out_;
  for (int64_t n = 0; n < N; ++n) {
    float* dx = dinp + n * in_;
    for (int64_t o = 0; o < out_; ++o) {
      const float d = dout[n * ld + o];
      const int8_t* q = q_.data() + o * in_;
      const float* s = scales_.data() + o * groups_;
      for (int64_t i = 0; i < in_; ++i) dx[i] += d * s[i / group_] * static_cast<float>(q[i]);
    }
  }
}

QuantizedAllToShardedLinear::QuantizedAllToShardedLinear(const AllToShardedLinear& layer, dist::Group group,
                                                         int group_size)
    : group_(std::move(group)) {
  for (int i = 0; i < layer.n_parts(); ++i) {
    parts_.emplace_back(layer.part(i).weight(), group_size);
    out_local_ += parts_.back().out_features();
  }
}

void QuantizedAllToShardedLinear::forward(float* out, const float* inp, int64_t N) const {
  int64_t col = 0;
  for (const auto& p : parts_) {
    p.forward(out + col, inp, N, out_local_);
    col += p.out_features();
  }
}

void QuantizedAllToShardedLinear::backward(float* dinp, const float* dout, int64_t N) {
  const int64_t IN = parts_.at(0).in_features();
  scratch_.assign(static_cast<size_t>(N * IN), 0.0f);  // [N, IN] partial
  int64_t col = 0;
  for (const auto& p : parts_) {
    p.backward_input(scratch_.data(), dout + col, N, out_local_);
    col += p.out_features();
  }
  group_.all_sum(scratch_);  // sum_gradients
  for (int64_t i = 0; i < N * IN; ++i) dinp[i] += scratch_[static_cast<size_t>(i)];
}

int64_t QuantizedAllToShardedLinear::bytes() const {
  int64_t b = 0;
  for (const auto& p : parts_) b += p.bytes();
  return b;
}

QuantizedShardedToAllLinear::QuantizedShardedToAllLinear(const ShardedToAllLinear& layer, dist::Group group,
                                                         int group_size)
    : local_(layer.local().weight(), group_size), group_(std::move(group)) {}

void QuantizedShardedToAllLinear::forward(float* out, const float* inp, int64_t N) {
  local_.forward(out, inp, N);
  group_.all_sum(std::span<float>(out, static_cast<size_t>(N * local_.out_features())));
}

void QuantizedShardedToAllLinear::backward(float* dinp, const float* dout, int64_t N) const {
  local_.backward_input(dinp, dout, N);
}

}  // namespace tpcli::nn

#include "nn/quantized_lora.h"

#include <stdexcept>
#include <string>

#include "distributed/tree_reduce.h"

namespace tpcli::nn {

namespace {

// t[N, r] = inp[N, IN] (row stride ld_in, columns [c0, c0 + n)) @ A[r, IN_a] (columns [a0, a0 + n))^T.
void low_rank_in(float* t, const float* inp, int64_t ld_in, int64_t c0, const tensor::Tensor& a, int64_t a0, int64_t n,
                 int64_t N) {
  const int64_t r = a.dim(0), IN_a = a.dim(1);
  for (int64_t row = 0; row < N; ++row) {
    const float* x = inp + row * ld_in + c0;
    for (int64_t k = 0; k < r; ++k) {
      const float* ak = a.data() + k * IN_a + a0;
      float s = 0.0f;
      for (int64_t i = 0; i < n; ++i) s += x[i] * ak[i];
      t[row * r + k] = s;
    }
  }
}

// out[N, ld_out] columns [0, OUT) += scale * t[N, r] @ B[OUT, r]^T.
void low_rank_out(float* out, int64_t ld_out, const float* t, const tensor::Tensor& b, float scale, int64_t N) {
  const int64_t OUT = b.dim(0), r = b.dim(1);
  for (int64_t row = 0; row < N; ++row) {
    const float* tr = t + row * r;
    float* y = out + row * ld_out;
    for (int64_t o = 0; o < OUT; ++o) {
      const float* bo = b.data() + o * r;
      float s = 0.0f;
      for (int64_t k = 0; k < r; ++k) s += tr[k] * bo[k];
      y[o] += scale * s;
    }
  }
}

}  // namespace

// ---- LoraAllToSharded ----

LoraAllToSharded::LoraAllToSharded(std::vector<Part> parts, float scale) : parts_(std::move(parts)), scale_(scale) {
  for (const Part& p : parts_)
    if (p.a.rank() != 2 || p.b.rank() != 2 || p.a.dim(0) != p.b.dim(1))
      throw std::invalid_argument("lora all-to-sharded: A " + tensor::to_string(p.a.shape()) + " and B " +
                                  tensor::to_string(p.b.shape()) + " do not share a rank");
}

void LoraAllToSharded::forward_add(float* out, int64_t ld_out, const float* inp, int64_t N) const {
  thread_local std::vector<float> t;  // [N, r]
  for (const Part& p : parts_) {
    const int64_t IN = p.a.dim(1);
    t.resize(static_cast<size_t>(N * p.a.dim(0)));
    low_rank_in(t.data(), inp, IN, 0, p.a, 0, IN, N);
    low_rank_out(out + p.column, ld_out, t.data(), p.b, scale_, N);
  }
}

int64_t LoraAllToSharded::bytes() const {
  int64_t n = 0;
  for (const Part& p : parts_) n += p.a.numel() + p.b.numel();
  return n * static_cast<int64_t>(sizeof(float));
}

// ---- LoraShardedToAll ----

LoraShardedToAll::LoraShardedToAll(tensor::Tensor a_local, tensor::Tensor b, int lanes, float scale, dist::Group group)
    : a_(std::move(a_local)), b_(std::move(b)), lanes_(lanes), scale_(scale), group_(std::move(group)) {
  if (a_.rank() != 2 || b_.rank() != 2 || a_.dim(0) != b_.dim(1))
    throw std::invalid_argument("lora sharded-to-all: A " + tensor::to_string(a_.shape()) + " and B " + tensor::to_string(b_.shape()) +
                                " do not share a rank");
  if (lanes_ < 1 || a_.dim(1) % lanes_ != 0)
    throw std::invalid_argument("lora sharded-to-all: " + std::to_string(a_.dim(1)) + " input columns do not split into " +
                                std::to_string(lanes_) + " lanes");
}

void LoraShardedToAll::forward_add(float* out, const float* inp, int64_t N) {
  const int64_t r = a_.dim(0), IN_local = a_.dim(1), IN_lane = IN_local / lanes_, rows = N * r;
  thread_local std::vector<float> t, lane_t;  // [N, r], [lanes, N, r]
  thread_local std::vector<const float*> parts;
  t.resize(static_cast<size_t>(rows));
  if (lanes_ == 1) {
    low_rank_in(t.data(), inp, IN_local, 0, a_, 0, IN_local, N);
  } else {
    lane_t.resize(static_cast<size_t>(lanes_ * rows));
    parts.resize(static_cast<size_t>(lanes_));
    for (int l = 0; l < lanes_; ++l) {
      float* y = lane_t.data() + l * rows;
      low_rank_in(y, inp, IN_local, l * IN_lane, a_, l * IN_lane, IN_lane, N);
      parts[static_cast<size_t>(l)] = y;
    }
    dist::tree_reduce(t.data(), parts.data(), lanes_, 0, rows, [](float x, float y) { return x + y; });
  }
  group_.all_sum(std::span<float>(t.data(), static_cast<size_t>(rows)));  // partial -> mirrored
  low_rank_out(out, b_.dim(0), t.data(), b_, scale_, N);
}

}  // namespace tpcli::nn

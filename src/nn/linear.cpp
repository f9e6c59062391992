#include "nn/linear.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "tensor/blas.h"

namespace tpcli::nn {

using tensor::Tensor;
using tensor::Trans;

Linear::Linear(Tensor weight) : weight_(std::move(weight)) {
  if (weight_.rank() != 2)
    throw std::invalid_argument("linear: weight must be [out, in], got " + tensor::to_string(weight_.shape()));
}

Tensor& Linear::grad() {
  if (grad_.empty()) grad_ = Tensor(weight_.shape());
  return grad_;
}

void Linear::forward(float* out, const float* inp, int64_t N, int64_t ld_out) const {
  const int64_t OUT = out_features(), IN = in_features();
  if (N == 1) {  // decode: memory-bound matrix-vector product
    tensor::matvec(out, weight_.data(), inp, OUT, IN);
    return;
  }
  if (tensor::decode_rows()) {  // rows of different sequences, each as if alone (tensor/blas.h)
    tensor::matvec_batch(out, ld_out, weight_.data(), inp, N, OUT, IN);
    return;
  }
  tensor::gemm(Trans::No, Trans::Yes, N, OUT, IN, 1.0f, inp, IN, weight_.data(), IN, 0.0f, out, ld_out ? ld_out : OUT);
}

void Linear::backward(float* dinp, const float* dout, const float* inp, int64_t N, int64_t ld_dout) {
  const int64_t OUT = out_features(), IN = in_features();
  const int64_t ld = ld_dout ? ld_dout : OUT;
  if (dinp)  // dinp[N, IN] += dout[N, OUT] @ W[OUT, IN]
    tensor::gemm(Trans::No, Trans::No, N, IN, OUT, 1.0f, dout, ld, weight_.data(), IN, 1.0f, dinp, IN);
  if (frozen_) return;
  // dW[OUT, IN] += dout^T[OUT, N] @ inp[N, IN]
  tensor::gemm(Trans::Yes, Trans::No, OUT, IN, N, 1.0f, dout, ld, inp, IN, 1.0f, grad().data(), IN);
}

// ---- AllToShardedLinear ----

AllToShardedLinear::AllToShardedLinear(std::vector<Linear> parts, dist::Group group)
    : parts_(std::move(parts)), group_(std::move(group)) {
  if (parts_.empty()) throw std::invalid_argument("all-to-sharded linear: no parts");
  for (const auto& p : parts_) {
    if (p.in_features() != parts_[0].in_features())
      throw std::invalid_argument("all-to-sharded linear: parts have different input sizes");
    out_local_ += p.out_features();
  }
  // One [OUT_local, IN] weight, the parts views of its row ranges: the forward and the input
  // gradient are then one product each instead of one per segment (wq|wk|wv: three), which
  // packs the input once and keeps the products wide when the segments are split over devices.
  const int64_t IN = in_features();
  fused_ = Tensor({out_local_, IN});
  int64_t row = 0;
  for (auto& p : parts_) {
    const int64_t rows = p.out_features();
    std::span<float> storage = fused_.span().subspan(static_cast<size_t>(row * IN), static_cast<size_t>(rows * IN));
    std::copy(p.weight().span().begin(), p.weight().span().end(), storage.begin());
    Tensor grad = p.has_grad() ? std::move(p.grad()) : Tensor();
    p = Linear(Tensor::view({rows, IN}, storage));  // (moved in: copying a view would copy its floats)
    if (!grad.empty()) p.grad() = std::move(grad);
    row += rows;
  }
}

void AllToShardedLinear::freeze() {
  for (auto& p : parts_) p.set_frozen(true);
}

void AllToShardedLinear::set_adapter(int i, LoraAdapter adapter) {
  const Linear& p = parts_.at(static_cast<size_t>(i));
  if (adapter.a.dim(1) != in_features() || adapter.b.dim(0) != p.out_features() || adapter.b.dim(1) != adapter.rank())
    throw std::invalid_argument("all-to-sharded linear: adapter A " + tensor::to_string(adapter.a.shape()) + ", B " +
                                tensor::to_string(adapter.b.shape()) + " do not fit a part of " +
                                tensor::to_string(p.weight().shape()));
  adapters_.resize(parts_.size());
  adapters_[static_cast<size_t>(i)] = std::move(adapter);
}

LoraAdapter* AllToShardedLinear::adapter(int i) {
  if (static_cast<size_t>(i) >= adapters_.size() || adapters_[static_cast<size_t>(i)].a.empty()) return nullptr;
  return &adapters_[static_cast<size_t>(i)];
}

int64_t AllToShardedLinear::adapter_rank_sum() const { return lora_rank_sum(adapters_); }

std::vector<int64_t> AllToShardedLinear::part_rows() const {
  std::vector<int64_t> rows;
  for (const auto& p : parts_) rows.push_back(p.out_features());
  return rows;
}

bool AllToShardedLinear::fused() const {
  if (fused_.empty()) return false;
  const float* at = fused_.data();
  for (const auto& p : parts_) {
    if (p.weight().numel() > 0 && p.weight().data() != at) return false;
    at += p.weight().numel();
  }
  return true;
}

void AllToShardedLinear::forward(float* out, const float* inp, int64_t N) const {
  const int64_t IN = in_features();
  if (N == 1 && fused()) tensor::matvec(out, fused_.data(), inp, out_local_, IN);
  else if (tensor::decode_rows() && fused()) tensor::matvec_batch(out, out_local_, fused_.data(), inp, N, out_local_, IN);
  else if (N == 1 || tensor::decode_rows()) {
    int64_t col = 0;
    for (const auto& p : parts_) {
      if (p.out_features() > 0) p.forward(out + col, inp, N, out_local_);
      col += p.out_features();
    }
  } else forward_columns(out, inp, IN, N, 0, IN, false);
  if (!adapters_.empty()) lora_parts_forward(out, inp, N, IN, part_rows(), adapters_);
}

void AllToShardedLinear::forward_columns(float* out, const float* inp, int64_t ld_inp, int64_t N, int64_t col0,
                                         int64_t cols, bool accumulate) const {
  const int64_t IN = in_features();
  const float beta = accumulate ? 1.0f : 0.0f;
  if (fused()) {
    tensor::gemm(Trans::No, Trans::Yes, N, out_local_, cols, 1.0f, inp, ld_inp, fused_.data() + col0, IN, beta, out,
                 out_local_);
    return;
  }
  int64_t col = 0;
  for (const auto& p : parts_) {
    if (p.out_features() > 0)
      tensor::gemm(Trans::No, Trans::Yes, N, p.out_features(), cols, 1.0f, inp, ld_inp, p.weight().data() + col0, IN,
                   beta, out + col, out_local_);
    col += p.out_features();
  }
}

void AllToShardedLinear::input_gradient(float* target, const float* dout, int64_t N, bool accumulate) const {
  const int64_t IN = in_features();
  if (fused()) {
    tensor::gemm(Trans::No, Trans::No, N, IN, out_local_, 1.0f, dout, out_local_, fused_.data(), IN,
                 accumulate ? 1.0f : 0.0f, target, IN);
    return;
  }
  if (!accumulate) std::fill(target, target + N * IN, 0.0f);
  int64_t col = 0;
  for (const auto& p : parts_) {  // target[N, IN] += dout[:, part's columns] @ W_part
    if (p.out_features() > 0)
      tensor::gemm(Trans::No, Trans::No, N, IN, p.out_features(), 1.0f, dout + col, out_local_, p.weight().data(), IN,
                   1.0f, target, IN);
    col += p.out_features();
  }
}

// Where the parts' gradients sit one after another (the model lays wq|wk|wv's out so: model/llama.h
// grad_buffer()), they are one [OUT_local, IN] matrix and take one product; else part by part.
void AllToShardedLinear::weight_gradients(const float* dout, const float* inp, int64_t N) {
  const int64_t IN = in_features();
  float* first = nullptr;
  const float* next = nullptr;
  bool adjacent = true;
  for (auto& p : parts_) {
    if (p.out_features() == 0 || p.frozen()) continue;
    float* g = p.grad().data();
    if (!first) first = g;
    else if (g != next) adjacent = false;
    next = g + p.grad().numel();
  }
  if (!first) return;
  if (adjacent) {  // dW_local[OUT_local, IN] += dout^T[OUT_local, N] @ inp[N, IN]
    tensor::gemm(Trans::Yes, Trans::No, out_local_, IN, N, 1.0f, dout, out_local_, inp, IN, 1.0f, first, IN);
    return;
  }
  int64_t col = 0;
  for (auto& p : parts_) {  // dW_part += dout[:, part's columns]^T @ inp
    if (p.out_features() > 0 && !p.frozen()) p.backward(nullptr, dout + col, inp, N, out_local_);
    col += p.out_features();
  }
}

void AllToShardedLinear::backward(float* dinp, const float* dout, const float* inp, int64_t N) {
  const int64_t IN = in_features(), R = adapter_rank_sum();
  const bool sum = group_.size() > 1;
  weight_gradients(dout, inp, N);
  if (!sum && R == 0) {  // nothing to sum over: straight into dinp
    if (dinp) input_gradient(dinp, dout, N, true);
    return;
  }
  // [N, IN] the base's partial dinp, then [N, R] the adapters' partial dxa: one all-sum for both.
  dinp_partial_.resize(static_cast<size_t>(N * (IN + R)));
  float* dxa = dinp_partial_.data() + N * IN;
  if (dinp || sum) input_gradient(dinp_partial_.data(), dout, N, false);
  if (R > 0) lora_parts_output_gradients(dxa, dout, inp, N, IN, part_rows(), adapters_);
  if (sum) group_.all_sum(dinp_partial_);  // sum_gradients: partial -> mirrored
  if (dinp)
    for (int64_t i = 0; i < N * IN; ++i) dinp[i] += dinp_partial_[static_cast<size_t>(i)];
  if (R > 0) lora_parts_input_gradients(dinp, dxa, inp, N, IN, adapters_);
}

// ---- ShardedToAllLinear ----

ShardedToAllLinear::ShardedToAllLinear(Linear local, dist::Group group)
    : local_(std::move(local)), group_(std::move(group)) {}

void ShardedToAllLinear::set_adapter(LoraAdapter adapter) {
  if (adapter.a.dim(1) != in_features() || adapter.b.dim(0) != out_features() || adapter.b.dim(1) != adapter.rank())
    throw std::invalid_argument("sharded-to-all linear: adapter A " + tensor::to_string(adapter.a.shape()) + ", B " +
                                tensor::to_string(adapter.b.shape()) + " do not fit " +
                                tensor::to_string(local_.weight().shape()));
  adapter_ = std::move(adapter);
}

void ShardedToAllLinear::forward(float* out, const float* inp, int64_t N) {
  if (adapter()) return forward_with_adapter(out, inp, N);
  const int64_t OUT = out_features();
  if (in_features() > 0)
    local_.forward(out, inp, N);
  else
    std::fill(out, out + N * OUT, 0.0f);
  group_.all_sum(std::span<float>(out, static_cast<size_t>(N * OUT)));  // partial -> mirrored
}

void ShardedToAllLinear::forward_with_adapter(float* out, const float* inp, int64_t N) {
  const int64_t OUT = out_features(), IN = in_features(), r = adapter_.rank();
  summed_.assign(static_cast<size_t>(N * (OUT + r)), 0.0f);  // [N, OUT] base, then [N, r] xa
  float* xa = summed_.data() + N * OUT;
  if (IN > 0) local_.forward(summed_.data(), inp, N);
  lora_partial_xa(xa, inp, N, adapter_);
  group_.all_sum(summed_);  // partial -> mirrored, the adapter's xa with the base's output
  std::copy(summed_.begin(), summed_.begin() + N * OUT, out);
  xa_.assign(xa, xa + N * r);  // for backward's dB
  lora_add_output(out, xa, N, adapter_);  // out += scale * xa B^T
}

void ShardedToAllLinear::backward(float* dinp, const float* dout, const float* inp, int64_t N) {
  if (in_features() > 0) local_.backward(dinp, dout, inp, N);
  if (adapter()) lora_mirrored_backward(dinp, dout, xa_.data(), inp, N, adapter_);
}

// ---- shard_linear / shard_inplace ----

std::vector<Segment> even_segments(int64_t n, int parts, const dist::Group& group) {
  if (parts < 1 || n % parts != 0)
    throw std::invalid_argument("shard_linear: " + std::to_string(parts) + " segments do not divide " + std::to_string(n));
  std::vector<Segment> segs;
  for (int s = 0; s < parts; ++s) segs.push_back({n / parts, dist::even_split(n / parts, group.size(), group.rank())});
  return segs;
}

Tensor slice_rows(const float* full, int64_t cols, dist::Range r) {
  Tensor t({r.count, cols});
  std::copy(full + r.offset * cols, full + (r.offset + r.count) * cols, t.data());
  return t;
}

Tensor slice_columns(const float* full, int64_t rows, int64_t cols, const std::vector<dist::Range>& ranges) {
  int64_t local = 0;
  for (auto r : ranges) local += r.count;
  Tensor t({rows, local});
  for (int64_t i = 0; i < rows; ++i) {
    float* dst = t.data() + i * local;
    for (auto r : ranges) dst = std::copy(full + i * cols + r.offset, full + i * cols + r.offset + r.count, dst);
  }
  return t;
}

namespace {

// Absolute ranges of the split dimension (length n) that this device keeps, segment by segment.
std::vector<dist::Range> local_ranges(int64_t n, const dist::Group& group, std::vector<Segment> segments) {
  if (segments.empty()) segments.push_back({n, dist::even_split(n, group.size(), group.rank())});
  std::vector<dist::Range> ranges;
  int64_t start = 0;
  for (const auto& s : segments) {
    if (s.local.offset < 0 || s.local.count < 0 || s.local.offset + s.local.count > s.size)
      throw std::invalid_argument("shard_linear: local range [" + std::to_string(s.local.offset) + ", +" +
                                  std::to_string(s.local.count) + ") outside a segment of " + std::to_string(s.size));
    ranges.push_back({start + s.local.offset, s.local.count});
    start += s.size;
  }
  if (start != n)
    throw std::invalid_argument("shard_linear: segments add up to " + std::to_string(start) + ", the weight has " +
                                std::to_string(n));
  return ranges;
}

}  // namespace

ShardedLinear shard_linear(const Linear& linear, Sharding sharding, dist::Group group, std::vector<Segment> segments) {
  const Tensor& w = linear.weight();
  const int64_t OUT = linear.out_features(), IN = linear.in_features();
  if (sharding == Sharding::AllToSharded) {
    std::vector<Linear> parts;
    for (auto r : local_ranges(OUT, group, std::move(segments))) parts.emplace_back(slice_rows(w.data(), IN, r));
    return AllToShardedLinear(std::move(parts), std::move(group));
  }
  auto ranges = local_ranges(IN, group, std::move(segments));
  return ShardedToAllLinear(Linear(slice_columns(w.data(), OUT, IN, ranges)), std::move(group));
}

void shard_inplace(Linear& linear, Sharding sharding, const dist::Group& group, std::vector<Segment> segments) {
  const Tensor& w = linear.weight();
  const int64_t OUT = linear.out_features(), IN = linear.in_features();
  if (sharding == Sharding::AllToSharded) {
    std::vector<dist::Range> ranges = local_ranges(OUT, group, std::move(segments));
    int64_t rows = 0;
    for (auto r : ranges) rows += r.count;
    Tensor local({rows, IN});
    float* dst = local.data();
    for (auto r : ranges) dst = std::copy(w.data() + r.offset * IN, w.data() + (r.offset + r.count) * IN, dst);
    linear = Linear(std::move(local));
  } else {
    linear = Linear(slice_columns(w.data(), OUT, IN, local_ranges(IN, group, std::move(segments))));
  }
}

}  // namespace tpcli::nn

#include "nn/feed_forward.h"

#include <algorithm>
#include <stdexcept>

#include "nn/collective_matmul.h"
#include "nn/gather.h"
#include "nn/sequence_parallel.h"
#include "nn/swiglu.h"

namespace tpcli::nn {

namespace {
std::vector<Linear> two(tensor::Tensor a, tensor::Tensor b) {
  std::vector<Linear> v;
  v.emplace_back(std::move(a));
  v.emplace_back(std::move(b));
  return v;
}
}  // namespace

SwiGluFeedForward::SwiGluFeedForward(tensor::Tensor w1, tensor::Tensor w3, tensor::Tensor w2, dist::Group group,
                                     std::string prefix, std::vector<dist::Range> ffn_ranges, int64_t hidden_dim)
    : w13_(two(std::move(w1), std::move(w3)), group),
      w2_(Linear(std::move(w2)), group),
      group_(group),
      prefix_(std::move(prefix)),
      ffn_ranges_(std::move(ffn_ranges)),
      hidden_dim_(hidden_dim) {}

void SwiGluFeedForward::forward(float* out, const float* inp, int64_t N) {
  const int64_t FL = w2_.in_features();
  h13_.resize(static_cast<size_t>(N * 2 * FL));
  g_.resize(static_cast<size_t>(N * FL));
  w13_.forward(h13_.data(), inp, N);           // [N, 2*FL] split
  swiglu_forward(g_.data(), h13_.data(), N, FL);  // [N, FL] split
  w2_.forward(out, g_.data(), N);              // [N, C] mirrored (all_sum)
}

void SwiGluFeedForward::backward(float* dinp, const float* dout, const float* inp, int64_t N) {
  const int64_t FL = w2_.in_features();
  dg_.assign(static_cast<size_t>(N * FL), 0.0f);
  dh13_.resize(static_cast<size_t>(N * 2 * FL));  // overwritten by swiglu_backward
  w2_.backward(dg_.data(), dout, g_.data(), N);                 // pass-through: no communication
  swiglu_backward(dh13_.data(), dg_.data(), h13_.data(), N, FL);
  w13_.backward(dinp, dh13_.data(), inp, N);                    // all_sum of dinp (sum_gradients)
}

void FeedForward::forward_sequence_split(float*, const float*, int64_t) {
  throw std::invalid_argument("feed-forward: sequence parallelism needs the dense SwiGLU layer");
}

void FeedForward::backward_sequence_split(float*, const float*, const float*, int64_t) {
  throw std::invalid_argument("feed-forward: sequence parallelism needs the dense SwiGLU layer");
}

void SwiGluFeedForward::forward_sequence_split(float* out, const float* inp, int64_t N) {
  const int64_t FL = w2_.in_features();
  h13_.resize(static_cast<size_t>(N * 2 * FL));
  g_.resize(static_cast<size_t>(N * FL));
  all_gather_matmul(h13_.data(), inp, N, w13_, group_);    // [NL, C] split -> [N, 2*FL] sharded
  swiglu_forward(g_.data(), h13_.data(), N, FL);           // [N, FL] sharded
  matmul_reduce_scatter(out, g_.data(), N, w2_, group_);  // -> [NL, C] split
}

void SwiGluFeedForward::backward_sequence_split(float* dinp, const float* dout, const float* inp, int64_t N) {
  const int64_t FL = w2_.in_features();
  dg_.assign(static_cast<size_t>(N * FL), 0.0f);
  dh13_.assign(static_cast<size_t>(N * 2 * FL), 0.0f);
  matmul_reduce_scatter_backward(dg_.data(), dout, g_.data(), N, w2_, group_);  // all_gather of dout
  swiglu_backward(dh13_.data(), dg_.data(), h13_.data(), N, FL);
  all_gather_matmul_backward(dinp, dh13_.data(), inp, N, w13_, group_);  // reduce_scatter of dinp
}

void SwiGluFeedForward::release_activations() {
  for (auto* v : {&h13_, &g_, &dg_, &dh13_}) std::vector<float>().swap(*v);
}

int64_t SwiGluFeedForward::activation_bytes() const {
  size_t n = 0;
  for (const auto* v : {&h13_, &g_, &dg_, &dh13_}) n += v->capacity();
  return static_cast<int64_t>(n * sizeof(float));
}

std::vector<ParamRef> SwiGluFeedForward::parameters() {
  return {{prefix_ + "w1", &w13_.part(0).weight(), &w13_.part(0).grad()},
          {prefix_ + "w2", &w2_.local().weight(), &w2_.local().grad()},
          {prefix_ + "w3", &w13_.part(1).weight(), &w13_.part(1).grad()}};
}

std::vector<std::pair<std::string, tensor::Tensor>> SwiGluFeedForward::gather_full() {
  const int64_t C = w2_.out_features();
  std::vector<std::pair<std::string, tensor::Tensor>> out;
  out.emplace_back(prefix_ + "w1", gather_rows(group_, w13_.part(0).weight().data(), ffn_ranges_, hidden_dim_, C));
  out.emplace_back(prefix_ + "w2", gather_columns(group_, w2_.local().weight().data(), ffn_ranges_, C, hidden_dim_));
  out.emplace_back(prefix_ + "w3", gather_rows(group_, w13_.part(1).weight().data(), ffn_ranges_, hidden_dim_, C));
  return out;
}

int64_t SwiGluFeedForward::parameter_bytes() const {
  return static_cast<int64_t>(sizeof(float)) *
         (w13_.part(0).weight().numel() + w13_.part(1).weight().numel() + w2_.local().weight().numel());
}

// ---- QuantizedSwiGluFeedForward ----

QuantizedSwiGluFeedForward::QuantizedSwiGluFeedForward(QuantizedAllToShardedLinear w13, QuantizedShardedToAllLinear w2)
    : FrozenFeedForward("a quantized (frozen) layer"), w13_(std::move(w13)), w2_(std::move(w2)) {}

void QuantizedSwiGluFeedForward::forward(float* out, const float* inp, int64_t N) {
  const int64_t FL = w2_.in_features();
  h13_.resize(static_cast<size_t>(N * 2 * FL));
  g_.resize(static_cast<size_t>(N * FL));
  w13_.forward(h13_.data(), inp, N);              // [N, 2*FL] split
  swiglu_forward(g_.data(), h13_.data(), N, FL);  // [N, FL] split
  w2_.forward(out, g_.data(), N);                 // [N, C] mirrored (all_sum)
}

void FrozenFeedForward::refuse(const char* call) const {
  throw std::invalid_argument(std::string("feed-forward: ") + call + " of " + what_ +
                              ": training a quantized model is not supported");
}

void FrozenFeedForward::backward(float*, const float*, const float*, int64_t) { refuse("backward"); }
std::vector<ParamRef> FrozenFeedForward::parameters() { refuse("parameters"); }
std::vector<std::pair<std::string, tensor::Tensor>> FrozenFeedForward::gather_full() { refuse("gather_full"); }

}  // namespace tpcli::nn

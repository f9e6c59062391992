#include "nn/feed_forward.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "nn/collective_matmul.h"
#include "nn/gather.h"
#include "nn/sequence_parallel.h"
#include "nn/swiglu.h"

namespace tpcli::nn {

SwiGluActivationSizes swiglu_activation_sizes(int64_t N, int64_t FL) {
  return {N * 2 * FL, N * FL, N * FL, N * 2 * FL};
}

namespace {
std::vector<Linear> two(tensor::Tensor a, tensor::Tensor b) {
  std::vector<Linear> v;
  v.emplace_back(std::move(a));
  v.emplace_back(std::move(b));
  return v;
}

// The one SwiGLU feed-forward, f32 or packed, whole rows or sequence split: out = w2(silu(w1 inp)
// * w3 inp), saving h13[N, 2*FL] and g[N, FL]. The products are the caller's:
// gate_up(h13, inp) -> [N, 2*FL] sharded, down(out, g) -> out mirrored (all_sum) or split
// (reduce_scatter).
template <class GateUp, class Down>
void swiglu_ffn_forward(float* out, std::vector<float>& h13, std::vector<float>& g, const float* inp, int64_t N,
                        int64_t FL, GateUp&& gate_up, Down&& down) {
  const SwiGluActivationSizes n = swiglu_activation_sizes(N, FL);
  h13.resize(static_cast<size_t>(n.h13));
  g.resize(static_cast<size_t>(n.g));
  gate_up(h13.data(), inp);                     // [N, 2*FL] sharded
  swiglu_forward(g.data(), h13.data(), N, FL);  // [N, FL] sharded
  down(out, g.data());                          // [N, C]
}

// The same over whole rows, for a linear pair of either kind: AllToShardedLinear and
// ShardedToAllLinear (f32) or their quantized twins (packed).
template <class W13, class W2>
void swiglu_ffn_forward(float* out, std::vector<float>& h13, std::vector<float>& g, const float* inp, int64_t N,
                        const W13& w13, W2& w2) {
  swiglu_ffn_forward(
      out, h13, g, inp, N, w2.in_features(), [&](float* h, const float* x) { w13.forward(h, x, N); },
      [&](float* y, const float* act) { w2.forward(y, act, N); });  // all_sum
}

// swiglu_ffn_forward in reverse, on what it saved: dinp += ..., the linears' grads +=. The
// products' transposes are the caller's: down_back(dg, dout, g) (dg += ; all_gather of dout when
// sequence split), gate_up_back(dinp, dh13, inp) (all_sum or reduce_scatter of dinp).
template <class DownBack, class GateUpBack>
void swiglu_ffn_backward(float* dinp, std::vector<float>& dh13, std::vector<float>& dg, const float* dout,
                         const std::vector<float>& h13, const std::vector<float>& g, const float* inp, int64_t N,
                         int64_t FL, DownBack&& down_back, GateUpBack&& gate_up_back) {
  const SwiGluActivationSizes n = swiglu_activation_sizes(N, FL);
  dg.assign(static_cast<size_t>(n.dg), 0.0f);
  dh13.resize(static_cast<size_t>(n.dh13));  // overwritten by swiglu_backward
  down_back(dg.data(), dout, g.data());
  swiglu_backward(dh13.data(), dg.data(), h13.data(), N, FL);
  gate_up_back(dinp, dh13.data(), inp);
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
  swiglu_ffn_forward(out, h13_, g_, inp, N, w13_, w2_);
}

void SwiGluFeedForward::backward(float* dinp, const float* dout, const float* inp, int64_t N) {
  swiglu_ffn_backward(
      dinp, dh13_, dg_, dout, h13_, g_, inp, N, w2_.in_features(),
      [&](float* dg, const float* dy, const float* g) { w2_.backward(dg, dy, g, N); },  // no communication
      [&](float* dx, const float* dh13, const float* x) { w13_.backward(dx, dh13, x, N); });  // all_sum of dinp
}

void TrainableFeedForward::forward_sequence_split(float*, const float*, int64_t) {
  throw std::invalid_argument("feed-forward: sequence parallelism needs the dense SwiGLU layer");
}

void TrainableFeedForward::backward_sequence_split(float*, const float*, const float*, int64_t) {
  throw std::invalid_argument("feed-forward: sequence parallelism needs the dense SwiGLU layer");
}

void SwiGluFeedForward::forward_sequence_split(float* out, const float* inp, int64_t N) {
  swiglu_ffn_forward(
      out, h13_, g_, inp, N, w2_.in_features(),
      [&](float* h13, const float* x) { all_gather_matmul(h13, x, N, w13_, group_); },  // [NL, C] split in
      [&](float* y, const float* g) { matmul_reduce_scatter(y, g, N, w2_, group_); });  // [NL, C] split out
}

void SwiGluFeedForward::backward_sequence_split(float* dinp, const float* dout, const float* inp, int64_t N) {
  swiglu_ffn_backward(
      dinp, dh13_, dg_, dout, h13_, g_, inp, N, w2_.in_features(),
      [&](float* dg, const float* dy, const float* g) {
        matmul_reduce_scatter_backward(dg, dy, g, N, w2_, group_);  // all_gather of dout
      },
      [&](float* dx, const float* dh13, const float* x) {
        all_gather_matmul_backward(dx, dh13, x, N, w13_, group_);  // reduce_scatter of dinp
      });
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
    : w13_(std::move(w13)), w2_(std::move(w2)) {}

void QuantizedSwiGluFeedForward::forward(float* out, const float* inp, int64_t N) {
  // One scratch per thread (a device), not per layer: every layer's would be sized for the
  // largest step (a prompt's rows) and kept.
  thread_local std::vector<float> h13, g;  // [N, 2*FL], [N, FL]
  std::vector<float>& h13_kept = keep_ ? h13_ : h13;
  std::vector<float>& g_kept = keep_ ? g_ : g;
  if (w13_lora_.empty() && !w2_lora_) return swiglu_ffn_forward(out, h13_kept, g_kept, inp, N, w13_, w2_);
  const int64_t FL = w2_.in_features();
  swiglu_ffn_forward(
      out, h13_kept, g_kept, inp, N, FL,
      [&](float* h, const float* x) {
        w13_.forward(h, x, N);
        w13_lora_.forward_add(h, 2 * FL, x, N);  // no communication
      },
      [&](float* y, const float* act) {
        w2_.forward(y, act, N);                          // all_sum
        if (w2_lora_) w2_lora_->forward_add(y, act, N);  // all_sum of [N, r]
      });
}

void QuantizedSwiGluFeedForward::keep_activations(bool on) {
  keep_ = on;
  if (!on) release_activations();
}

void QuantizedSwiGluFeedForward::backward(float* dinp, const float* dout, int64_t N) {
  backward(dinp, dout, nullptr, N);
}

void QuantizedSwiGluFeedForward::backward(float* dinp, const float* dout, const float* inp, int64_t N) {
  const int64_t FL = w2_.in_features();
  if (!keep_ || h13_.size() != static_cast<size_t>(swiglu_activation_sizes(N, FL).h13))
    throw std::logic_error("quantized swiglu feed-forward: backward for " + std::to_string(N) +
                           " rows needs a forward on them after keep_activations(true)");
  const bool adapters = w13_.adapter(0) || w13_.adapter(1) || w2_.adapter();
  if (adapters && !inp) throw std::logic_error("quantized swiglu feed-forward: the adapters' backward needs the input");
  thread_local std::vector<float> dg, dh13;  // [N, FL], [N, 2*FL] scratch
  swiglu_ffn_backward(
      dinp, dh13, dg, dout, h13_, g_, inp, N, FL,
      [&](float* dgate, const float* dy, const float* g) {  // no communication
        if (w2_.adapter()) w2_.backward(dgate, dy, g, N);
        else w2_.backward(dgate, dy, N);
      },
      [&](float* dx, const float* dh, const float* x) {  // all_sum of dinp (and the adapters' dxa)
        if (adapters) w13_.backward(dx, dh, x, N);
        else w13_.backward(dx, dh, N);
      });
}

void QuantizedSwiGluFeedForward::release_activations() {
  std::vector<float>().swap(h13_);
  std::vector<float>().swap(g_);
}

int64_t QuantizedSwiGluFeedForward::activation_bytes() const {
  return static_cast<int64_t>((h13_.capacity() + g_.capacity()) * sizeof(float));
}

int64_t QuantizedSwiGluFeedForward::parameter_bytes() const {
  return w13_.bytes() + w2_.bytes() + w13_lora_.bytes() + (w2_lora_ ? w2_lora_->bytes() : 0);
}

void QuantizedSwiGluFeedForward::set_lora(LoraAllToSharded w13, std::optional<LoraShardedToAll> w2) {
  w13_lora_ = std::move(w13);
  w2_lora_ = std::move(w2);
}

}  // namespace tpcli::nn

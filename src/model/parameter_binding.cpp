// tpcli::model — the parameter binding (see parameter_binding.h).
#include "model/parameter_binding.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

namespace tpcli::model {

void ParameterBinding::bind(int stage, const ParamSpec& spec, tensor::Tensor& value, tensor::Tensor& grad) {
  if (!buffer_.empty()) throw std::logic_error("parameter binding: '" + spec.name + "' bound after the layout");
  bound_.push_back({stage, {&spec, &value, &grad, -1}});
}

void ParameterBinding::lay_out(std::span<const ParamSpec> specs) {
  std::vector<size_t> order(bound_.size());  // buffer order: by stage, experts last
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::ranges::stable_sort(order, {}, [&](size_t i) {
    const Bound& b = bound_[i];
    return b.p.spec->expert ? std::pair{1, 0} : std::pair{0, b.stage};
  });
  int64_t size = 0;
  for (size_t i : order) {
    Parameter& p = bound_[i].p;
    p.grad_offset = size;
    size += p.value->numel();
    if (p.spec->expert) continue;
    if (stage_ends_.size() <= static_cast<size_t>(bound_[i].stage)) stage_ends_.resize(static_cast<size_t>(bound_[i].stage) + 1, 0);
    stage_ends_[static_cast<size_t>(bound_[i].stage)] = size;
  }
  for (size_t s = 1; s < stage_ends_.size(); ++s) stage_ends_[s] = std::max(stage_ends_[s], stage_ends_[s - 1]);
  buffer_.assign(static_cast<size_t>(size), 0.0f);
  by_spec_.assign(specs.size(), {});
  for (Bound& b : bound_) {
    Parameter& p = b.p;
    const std::span<float> storage = std::span<float>(buffer_).subspan(static_cast<size_t>(p.grad_offset),
                                                                      static_cast<size_t>(p.value->numel()));
    if (!p.grad->empty()) std::ranges::copy(p.grad->span(), storage.begin());
    *p.grad = tensor::Tensor::view(p.value->shape(), storage);
    const size_t index = static_cast<size_t>(p.spec - specs.data());
    if (index >= specs.size() || by_spec_[index].spec)
      throw std::logic_error("parameter binding: '" + p.spec->name + "' is not a parameter of the list, or bound twice");
    by_spec_[index] = p;
  }
  for (size_t i = 0; i < specs.size(); ++i)
    if (!by_spec_[i].spec) throw std::logic_error("parameter binding: parameter '" + specs[i].name + "' is not held by the model");
}

int64_t ParameterBinding::end_of_stage(int s) const {
  if (s < 0) throw std::out_of_range("parameter binding: stage " + std::to_string(s));
  if (static_cast<size_t>(s) < stage_ends_.size()) return stage_ends_[static_cast<size_t>(s)];
  return stage_ends_.empty() ? 0 : stage_ends_.back();
}

}  // namespace tpcli::model

#include "train/optimizer.h"

#include <cmath>
#include <numbers>
#include <stdexcept>

#include "tensor/vec_math.h"

namespace tpcli::train {

AdamW::AdamW(AdamWOptions options, const std::vector<int64_t>& sizes) : options_(options) {
  for (int64_t n : sizes) {
    m_.emplace_back(tensor::Shape{n});
    v_.emplace_back(tensor::Shape{n});
  }
}

void AdamW::step(std::span<const Slot> slots, double lr) {
  if (slots.size() != m_.size())
    throw std::logic_error("AdamW: " + std::to_string(slots.size()) + " slots for " + std::to_string(m_.size()) +
                           " moment buffers");
  ++t_;
  const double b1 = options_.beta1, b2 = options_.beta2;
  // torch.optim.AdamW (single-tensor path): bias corrections in double, the update in f32.
  const double bias_correction1 = 1.0 - std::pow(b1, static_cast<double>(t_));
  const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(b2, static_cast<double>(t_)));
  const auto step_size = static_cast<float>(lr / bias_correction1);
  const auto decay_scale = static_cast<float>(1.0 - lr * options_.weight_decay);
  const auto one_minus_b1 = static_cast<float>(1.0 - b1), fb2 = static_cast<float>(b2),
             one_minus_b2 = static_cast<float>(1.0 - b2), eps = static_cast<float>(options_.eps),
             inv_bc2 = static_cast<float>(1.0 / bias_correction2_sqrt);
  for (size_t i = 0; i < slots.size(); ++i) {
    const Slot& s = slots[i];
    float* p = s.value.data();
    const float* g = s.grad.data();
    float* m = m_[i].data();
    float* v = v_[i].data();
    if (static_cast<int64_t>(s.value.size()) != m_[i].numel() || s.grad.size() != s.value.size())
      throw std::logic_error("AdamW: slot " + std::to_string(i) + " changed size");
    const size_t n = s.value.size();
    for (size_t j = 0; j < n; ++j) {
      if (s.decay) p[j] *= decay_scale;                            // decoupled weight decay: p -= lr*wd*p
      m[j] += (g[j] - m[j]) * one_minus_b1;                        // exp_avg.lerp_(grad, 1 - beta1)
      v[j] = v[j] * fb2 + one_minus_b2 * g[j] * g[j];              // exp_avg_sq.mul_(b2).addcmul_(g, g, 1 - b2)
      const float denom = std::sqrt(v[j]) * inv_bc2 + eps;         // sqrt(v) / sqrt(bc2) + eps
      p[j] -= step_size * m[j] / denom;                            // p.addcdiv_(m, denom, -lr / bc1)
    }
  }
}

double local_grad_sq(std::span<const Slot> slots) {
  double total = 0.0;
  for (const Slot& s : slots) {
    if (s.row_norm_weights.empty()) {
      total += s.norm_weight * tensor::sum_of_squares(s.grad.data(), static_cast<int64_t>(s.grad.size()));
      continue;
    }
    const size_t rows = s.row_norm_weights.size(), row = s.grad.size() / rows;
    for (size_t r = 0; r < rows; ++r) {
      total += s.row_norm_weights[r] * tensor::sum_of_squares(s.grad.data() + r * row, static_cast<int64_t>(row));
    }
  }
  return total;
}

double clip_grads(std::span<const Slot> slots, double total_norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0;
  const double scale = max_norm / (total_norm + 1e-6);
  if (scale >= 1.0) return 1.0;
  const auto f = static_cast<float>(scale);
  for (const Slot& s : slots)
    for (float& g : s.grad) g *= f;
  return scale;
}

Decay parse_decay(const std::string& name) {
  if (name == "cosine") return Decay::Cosine;
  if (name == "constant") return Decay::Constant;
  throw std::invalid_argument("train.decay = \"" + name + "\" is not \"cosine\" or \"constant\"");
}

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps + 1);
  if (decay == Decay::Constant) return lr;
  if (step >= total_steps) return min_lr;
  const double span = static_cast<double>(total_steps - warmup_steps);
  const double ratio = span > 0 ? static_cast<double>(step - warmup_steps) / span : 1.0;
  const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * ratio));
  return min_lr + coeff * (lr - min_lr);
}

}  // namespace tpcli::train

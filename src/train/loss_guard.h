// tpcli::train — when a checkpoint is sound: the rule that keeps a diverging run from replacing
// the last good checkpoint with a ruined one (train/loop.cpp).
//
// The checkpoint of step s holds the weights after s updates. It is judged by the step that
// follows it: the loss those weights give on step s + 1's batch and that batch's gradient norm,
// both known before step s + 1's update runs, so the weights in the model are still the ones to
// save. It is sound when
//   loss and norm are finite, and
//   loss <= SPIKE_FACTOR * max(median of the last RECENT_STEPS step losses, ln(vocab_size)).
// ln(vocab_size) is the loss of a uniform guess, and training starts near it and falls below, so
// only a model that is confidently wrong crosses 3x of it; an ordinary loss spike stays well
// under. The norm catches what the loss may not: after lr = 1e9 (|w| ~ 1e9) the tiny configs give
// a loss near ln(vocab_size) and a NaN gradient norm. The median (not the mean) keeps one earlier
// spike from raising the bar.
#pragma once

#include <deque>
#include <string>

namespace tpcli::train {

class LossGuard {
 public:
  static constexpr double SPIKE_FACTOR = 3.0;
  static constexpr size_t RECENT_STEPS = 16;

  explicit LossGuard(int vocab_size);

  // "" when weights that give (loss, norm) are sound, else why not, for a message:
  // "loss 3.1e+10, more than 3 x 4.17439 (the median recent loss, or ln(vocab_size) if larger)".
  std::string unsound(double loss, double norm) const;
  // Remembers a step's loss (non-finite losses are not kept).
  void add(double loss);

 private:
  double bar() const;  // the largest sound loss

  double uniform_loss_;       // ln(vocab_size)
  std::deque<double> recent_;  // the last RECENT_STEPS finite step losses, oldest first
};

}  // namespace tpcli::train

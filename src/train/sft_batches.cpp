#include "train/sft_batches.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>

namespace tpcli::train {

namespace {

std::mt19937_64 generator(uint64_t seed, int64_t pass, uint32_t purpose) {
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), static_cast<uint32_t>(pass),
                    static_cast<uint32_t>(static_cast<uint64_t>(pass) >> 32), purpose};
  return std::mt19937_64(seq);
}

}  // namespace

LengthBatches::LengthBatches(std::shared_ptr<const std::vector<EncodedExample>> examples, int batch_size, int seq_len,
                             bool shuffle, uint64_t seed, int pad_token, int t_multiple)
    : examples_(std::move(examples)),
      batch_size_(batch_size),
      seq_len_(seq_len),
      shuffle_(shuffle),
      seed_(seed),
      pad_token_(pad_token),
      t_multiple_(t_multiple) {
  if (batch_size < 1 || seq_len < 1 || t_multiple < 1 || seq_len % t_multiple != 0)
    throw std::invalid_argument("sft batches: batch_size, seq_len and t_multiple must be >= 1, t_multiple dividing seq_len");
  if (!examples_ || examples_->empty()) throw std::invalid_argument("sft batches: no example");
  for (size_t i = 0; i < examples_->size(); ++i) {
    const size_t n = (*examples_)[i].tokens.size();
    if (n < 2 || n > static_cast<size_t>(seq_len) + 1 || (*examples_)[i].counted.size() != n)
      throw std::invalid_argument("sft batches: example " + std::to_string(i) + " has " + std::to_string(n) +
                                  " tokens, not in [2, seq_len + 1 = " + std::to_string(seq_len + 1) + "]");
  }
  const auto n = static_cast<int64_t>(examples_->size());
  steps_per_pass_ = (n + batch_size - 1) / batch_size;
}

const std::vector<size_t>& LengthBatches::pass_order(int64_t pass) const {
  // Callers hold mutex_.
  if (pass == cached_pass_) return cached_order_;
  const std::vector<EncodedExample>& ex = *examples_;
  const size_t n = ex.size(), B = static_cast<size_t>(batch_size_), S = static_cast<size_t>(steps_per_pass_);
  std::vector<uint64_t> tie(n);  // ties between equal lengths: shuffled, or by index
  std::iota(tie.begin(), tie.end(), uint64_t{0});
  if (shuffle_) {
    std::mt19937_64 gen = generator(seed_, pass, 1);
    for (uint64_t& t : tie) t = gen();
  }
  std::vector<size_t> sorted(n);
  std::iota(sorted.begin(), sorted.end(), size_t{0});
  std::sort(sorted.begin(), sorted.end(), [&](size_t a, size_t b) {
    const size_t la = ex[a].tokens.size(), lb = ex[b].tokens.size();
    return la != lb ? la < lb : tie[a] != tie[b] ? tie[a] < tie[b] : a < b;
  });
  std::vector<size_t> batches(S);  // batch order
  std::iota(batches.begin(), batches.end(), size_t{0});
  if (shuffle_) {
    std::mt19937_64 gen = generator(seed_, pass, 2);
    for (size_t i = S; i > 1; --i) std::swap(batches[i - 1], batches[static_cast<size_t>(gen() % i)]);  // Fisher-Yates
  }
  cached_order_.assign(S * B, 0);
  for (size_t j = 0; j < S; ++j) {
    const size_t batch = batches[j];
    // The last batch is the B longest (overlapping the one before) so its lengths stay alike.
    const size_t first = n >= B ? std::min(batch * B, n - B) : 0;
    for (size_t r = 0; r < B; ++r) cached_order_[j * B + r] = sorted[n >= B ? first + r : r % n];
  }
  cached_pass_ = pass;
  return cached_order_;
}

size_t LengthBatches::example_of(int64_t step, int row) const {
  if (step < 0 || row < 0 || row >= batch_size_) throw std::out_of_range("sft batches: no row " + std::to_string(row));
  std::lock_guard lock(mutex_);
  const std::vector<size_t>& order = pass_order(step / steps_per_pass_);
  return order[static_cast<size_t>(step % steps_per_pass_) * static_cast<size_t>(batch_size_) + static_cast<size_t>(row)];
}

int LengthBatches::step_len(int64_t step) const {
  size_t longest = 0;
  for (int r = 0; r < batch_size_; ++r) longest = std::max(longest, (*examples_)[example_of(step, r)].tokens.size());
  const int T = static_cast<int>(longest) - 1;
  return (T + t_multiple_ - 1) / t_multiple_ * t_multiple_;  // <= seq_len: t_multiple divides it
}

std::optional<int64_t> LengthBatches::counted_targets(int64_t step) const {
  int64_t counted = 0;
  for (int r = 0; r < batch_size_; ++r) counted += (*examples_)[example_of(step, r)].counted_targets();
  return counted;
}

void LengthBatches::fill(int64_t step, int row_begin, int row_end, std::span<int> inputs, std::span<int> targets) const {
  const auto rows = static_cast<size_t>(row_end - row_begin), T = static_cast<size_t>(step_len(step));
  if (inputs.size() != rows * T || targets.size() != rows * T)
    throw std::invalid_argument("sft batches: buffers do not hold (rows * T) tokens");
  for (int r = row_begin; r < row_end; ++r) {
    const EncodedExample& e = (*examples_)[example_of(step, r)];
    const size_t out = static_cast<size_t>(r - row_begin) * T, n = e.tokens.size();
    for (size_t t = 0; t < T; ++t) {
      const bool real = t + 1 < n;
      inputs[out + t] = real ? e.tokens[t] : pad_token_;
      targets[out + t] = real && e.counted[t + 1] ? e.tokens[t + 1] : -1;
    }
  }
}

}  // namespace tpcli::train

#include "train/step.h"

#include <algorithm>
#include <numeric>
#include <optional>

#include "model/trainable_llama.h"

namespace tpcli::train {

namespace {

// Clears the model's gradients-ready hook however the call ends (it points into the caller's frame).
struct ReadyHook {
  model::TrainableLlama& llama;
  ReadyHook(model::TrainableLlama& m, const std::function<void(int64_t)>& ready) : llama(m) { llama.set_gradients_ready(ready); }
  ~ReadyHook() { llama.set_gradients_ready({}); }
  ReadyHook(const ReadyHook&) = delete;
  ReadyHook& operator=(const ReadyHook&) = delete;
};

// MoE: the load-balancing loss of the K-times batch uses f_e over all its tokens. Routing only
// depends on the weights and tokens, so forward passes over the K micro-batches give the counts
// (before any capacity drop) that the K forward_backward passes then use. Cleared on exit.
class BatchFractions {
 public:
  BatchFractions(model::TrainableLlama& llama) : llama_(llama) {}
  ~BatchFractions() { llama_.set_moe_batch_fractions({}); }
  BatchFractions(const BatchFractions&) = delete;
  BatchFractions& operator=(const BatchFractions&) = delete;

  void add_counts() {
    const std::vector<nn::MoeStats> stats = llama_.moe_stats();
    counts_.resize(stats.size());
    for (size_t b = 0; b < stats.size(); ++b) {
      counts_[b].resize(stats[b].tokens_per_expert.size());
      for (size_t e = 0; e < counts_[b].size(); ++e) counts_[b][e] += stats[b].tokens_per_expert[e];
    }
  }
  void apply() {
    std::vector<std::vector<float>> fractions;
    for (const auto& c : counts_) {
      const double total = std::accumulate(c.begin(), c.end(), 0.0);  // every assignment, N * top_k
      auto& f = fractions.emplace_back();
      for (int64_t n : c) f.push_back(total > 0 ? static_cast<float>(static_cast<double>(n) / total) : 0.0f);
    }
    llama_.set_moe_batch_fractions(fractions);
  }

 private:
  model::TrainableLlama& llama_;
  std::vector<std::vector<int64_t>> counts_;  // [blocks][E] assignments over the K micro-batches
};

}  // namespace

double accumulate_gradients(model::TrainableLlama& llama, const StepBatches& batches, int64_t step, RowRange rows,
                            int micro_batches, std::vector<int>& inputs, std::vector<int>& targets,
                            const std::function<void(int64_t end)>& last_ready) {
  const int T = batches.step_len(step), R = (rows.end - rows.begin) / micro_batches;
  std::optional<double> divisor;  // the global count's share of this micro-batch (step.h)
  if (const std::optional<int64_t> counted = batches.counted_targets(step)) {
    const int data_ranks = batches.batch_size() / (rows.end - rows.begin);
    divisor = static_cast<double>(std::max<int64_t>(*counted, 1)) / (static_cast<double>(data_ranks) * micro_batches);
  }
  inputs.resize(static_cast<size_t>(R) * T);
  targets.resize(inputs.size());
  llama.zero_grad();
  BatchFractions fractions(llama);
  const model::LlamaConfig& c = llama.config();
  if (micro_batches > 1 && c.is_moe() && c.moe_aux_loss != 0.0f) {
    for (int k = 0; k < micro_batches; ++k) {
      const int first = rows.begin + k * R;
      batches.fill(step, first, first + R, inputs, targets);
      llama.loss(inputs, targets, R, T);
      fractions.add_counts();
    }
    fractions.apply();
  }
  double sum = 0;
  for (int k = 0; k < micro_batches; ++k) {
    const int first = rows.begin + k * R;
    batches.fill(step, first, first + R, inputs, targets);
    llama.set_dropout_pass(static_cast<uint64_t>(step) + 1, int64_t{first} * T);  // LoRA dropout: the step's masks
    if (k + 1 < micro_batches || !last_ready) {
      sum += llama.forward_backward(inputs, targets, R, T, divisor);
      continue;
    }
    ReadyHook hook(llama, last_ready);
    sum += llama.forward_backward(inputs, targets, R, T, divisor);
  }
  return sum / micro_batches;
}

double data_parallel_gradients(model::TrainableLlama& llama, const ParallelAxes& axes, std::span<const int> inputs,
                               std::span<const int> targets, int rows, int seq_len) {
  llama.zero_grad();
  float loss = llama.forward_backward(inputs, targets, rows, seq_len);
  for (auto& p : llama.parameters()) {
    std::span<float> g = p.grad->span();
    if (p.spec->expert) {
      const float scale = 1.0f / static_cast<float>(axes.expert_group_size);
      for (float& x : g) x *= scale;
      if (!axes.experts_on_data_axis) axes.data->mean(g);
    } else {
      axes.data->mean(g);
    }
  }
  axes.data->mean(std::span<float>(&loss, 1));
  return loss;
}

}  // namespace tpcli::train

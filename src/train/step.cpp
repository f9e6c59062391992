#include "train/step.h"

#include "model/llama.h"

namespace tpcli::train {

double accumulate_gradients(model::Llama& llama, const BatchSampler& batches, int64_t step, RowRange rows,
                            int micro_batches, std::vector<int>& inputs, std::vector<int>& targets) {
  const int T = batches.seq_len(), R = (rows.end - rows.begin) / micro_batches;
  inputs.resize(static_cast<size_t>(R) * T);
  targets.resize(inputs.size());
  llama.zero_grad();
  double sum = 0;
  for (int k = 0; k < micro_batches; ++k) {
    const int first = rows.begin + k * R;
    batches.fill(step, first, first + R, inputs, targets);
    sum += llama.forward_backward(inputs, targets, R, T);
  }
  return sum / micro_batches;
}

double data_parallel_gradients(model::Llama& llama, const ParallelAxes& axes, std::span<const int> inputs,
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

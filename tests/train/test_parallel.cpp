// The data + tensor parallel training step against the single-device model: every parameter's
// gradient, on meshes 1x2, 2x1, 2x2, 1x4, 2x4 (data x model), for a random model with fewer KV
// heads than tensor devices and an unshared classifier.
#include <catch2/catch.hpp>

#include <cmath>
#include <mutex>
#include <random>
#include <vector>

#include "distributed/runtime.h"
#include "support/rel_diff.h"
#include "model/trainable_llama.h"
#include "model/random_init.h"
#include "train/loop.h"

using namespace tpcli;

namespace {

using tpcli::testing::rel_diff;

model::LlamaConfig small_config() {
  model::LlamaConfig c{.dim = 32, .hidden_dim = 56, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .vocab_size = 37,
      .seq_len = 16, .shared_classifier = false};
  return c;
}


}  // namespace

TEST_CASE("data + tensor parallel gradients equal the single-device gradients") {
  const auto config = small_config();
  const auto weights = model::random_weights(config, 7);
  const int B = 4, T = 8;
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> token(0, config.vocab_size - 1);
  std::vector<int> inputs(B * T), targets(B * T);  // (B, T)
  for (auto& t : inputs) t = token(rng);
  for (auto& t : targets) t = token(rng);

  // Reference: one device, the whole batch.
  model::TrainableLlama ref(weights, dist::Group());
  ref.zero_grad();
  const float ref_loss = ref.forward_backward(inputs, targets, B, T);
  std::map<std::string, std::vector<float>> ref_grads;
  for (auto& p : ref.parameters()) ref_grads[p.spec->name].assign(p.grad->data(), p.grad->data() + p.grad->numel());

  for (auto [D, TP] : std::vector<std::pair<int, int>>{{1, 2}, {2, 1}, {2, 2}, {1, 4}, {2, 4}}) {
    DYNAMIC_SECTION("mesh data=" << D << ",model=" << TP) {
      dist::Mesh mesh({{"data", D}, {"model", TP}});
      std::mutex mu;
      std::vector<std::string> failures;
      std::vector<double> losses;
      dist::run_on_mesh(mesh, [&](dist::Device& dev) {
        dist::Group& data = dev.axis("data");
        train::ParallelAxes axes{&data, &dev.world(), D, TP, D, true};
        model::TrainableLlama llama(weights, dev.axis("model"));
        const auto rows = train::data_rows(B, D, data.rank());
        const auto first = static_cast<size_t>(rows.begin * T), n = static_cast<size_t>((rows.end - rows.begin) * T);
        double loss = train::data_parallel_gradients(llama, axes, std::span(inputs).subspan(first, n),
                                                     std::span(targets).subspan(first, n), rows.end - rows.begin, T);
        model::TensorWeights grads = train::gather_gradients(llama);
        std::lock_guard lock(mu);
        losses.push_back(loss);
        for (const auto& spec : model::llama_parameters(config)) {
          double d = rel_diff(grads.get(spec.name), ref_grads.at(spec.name));
          if (!(d <= 1e-4))
            failures.push_back("device " + std::to_string(dev.rank()) + " " + spec.name + " rel " + std::to_string(d));
        }
      });
      for (const auto& f : failures) UNSCOPED_INFO(f);
      CHECK(failures.empty());
      for (double l : losses) CHECK(l == Approx(ref_loss).epsilon(1e-5));
    }
  }
}

TEST_CASE("global-norm weights count every distinct gradient element once") {
  // On a 2x4 mesh with 2 KV heads, the world-wide weighted sum of squares equals the
  // single-device sum of squares of the full gradients.
  const auto config = small_config();
  const auto weights = model::random_weights(config, 3);
  const int B = 2, T = 8;
  std::vector<int> inputs(B * T), targets(B * T);
  std::mt19937 rng(5);
  for (auto& t : inputs) t = static_cast<int>(rng() % 37);
  for (auto& t : targets) t = static_cast<int>(rng() % 37);
  model::TrainableLlama ref(weights, dist::Group());
  ref.zero_grad();
  ref.forward_backward(inputs, targets, B, T);
  double ref_sq = 0;
  for (auto& p : ref.parameters())
    for (float g : p.grad->span()) ref_sq += static_cast<double>(g) * g;

  dist::Mesh mesh({{"data", 2}, {"model", 4}});
  std::mutex mu;
  std::vector<double> totals;
  dist::run_on_mesh(mesh, [&](dist::Device& dev) {
    dist::Group& data = dev.axis("data");
    train::ParallelAxes axes{&data, &dev.world(), 2, 4, 2, true};
    model::TrainableLlama llama(weights, dev.axis("model"));
    const auto rows = train::data_rows(B, 2, data.rank());
    train::data_parallel_gradients(llama, axes, std::span(inputs).subspan(static_cast<size_t>(rows.begin * T), T),
                                   std::span(targets).subspan(static_cast<size_t>(rows.begin * T), T), 1, T);
    auto slots = train::make_slots(llama, config, axes, dev.axis("model").rank());
    float sq = static_cast<float>(train::local_grad_sq(slots));
    dev.world().all_sum(std::span<float>(&sq, 1));
    std::lock_guard lock(mu);
    totals.push_back(sq);
  });
  for (double t : totals) CHECK(t == Approx(ref_sq).epsilon(1e-5));
}

TEST_CASE("sequence parallel loss and gradients equal the same mesh without it (model=2, data=2 x model=2, uneven rows, recompute, q/k/v biases and q/k norms)") {
  for (const bool qwen : {false, true}) {
  model::LlamaConfig config = small_config();
  if (qwen) {  // Qwen2's biases and Qwen3's norms, heads of 16 (q 64 wide on dim 32)
    config.head_dim = 16;
    config.qkv_bias = config.qk_norm = true;
  }
  const auto weights = model::random_weights(config, 13);
  // The collective matmuls sum q and k in another order; the norms' backward (a difference of two
  // terms per head) magnifies that rounding in q, k and their weights' gradients.
  const double tolerance = qwen ? 1e-4 : 1e-5;
  std::mt19937 rng(17);
  std::uniform_int_distribution<int> token(0, config.vocab_size - 1);
  struct Case {
    int D, TP, B, T;
    bool recompute;
  };
  // 1x2 B=1 T=5: 5 rows over 2 devices (3 and 2); 1x4: 4 devices, 2 per KV head; 1x4 B=1 T=3: a
  // device without rows.
  for (const Case c : {Case{1, 2, 4, 8, false}, Case{2, 2, 4, 8, false}, Case{1, 2, 1, 5, false}, Case{2, 2, 4, 8, true},
                       Case{1, 4, 2, 8, false}, Case{1, 4, 1, 3, false}}) {
    DYNAMIC_SECTION((qwen ? "Qwen-like " : "") << "mesh data=" << c.D << ",model=" << c.TP << " B=" << c.B << " T=" << c.T << (c.recompute ? " recompute" : "")) {
      std::vector<int> inputs(c.B * c.T), targets(c.B * c.T);
      for (auto& t : inputs) t = token(rng);
      for (auto& t : targets) t = token(rng);
      dist::Mesh mesh({{"data", c.D}, {"model", c.TP}});
      std::mutex mu;
      std::vector<std::string> failures;
      dist::run_on_mesh(mesh, [&](dist::Device& dev) {
        dist::Group& data = dev.axis("data");
        train::ParallelAxes axes{&data, &dev.world(), c.D, c.TP, c.D, true};
        const auto rows = train::data_rows(c.B, c.D, data.rank());
        const auto first = static_cast<size_t>(rows.begin * c.T), n = static_cast<size_t>((rows.end - rows.begin) * c.T);
        std::vector<double> loss(2);
        std::vector<std::vector<std::vector<float>>> grads(2);  // [plain, split][parameter]
        std::vector<int64_t> activations(2);
        for (int split = 0; split < 2; ++split) {
          model::TrainableLlama llama(weights, dev.axis("model"));
          llama.set_recompute(c.recompute);
          llama.set_sequence_parallel(split == 1);
          loss[split] = train::data_parallel_gradients(llama, axes, std::span(inputs).subspan(first, n),
                                                       std::span(targets).subspan(first, n), rows.end - rows.begin, c.T);
          for (auto& p : llama.parameters()) grads[split].emplace_back(p.grad->data(), p.grad->data() + p.grad->numel());
          activations[split] = llama.peak_activation_bytes();
        }
        std::lock_guard lock(mu);
        const std::string where = "device " + std::to_string(dev.rank()) + " ";
        if (!(std::abs(loss[1] - loss[0]) <= 1e-5 * std::abs(loss[0])))
          failures.push_back(where + "loss " + std::to_string(loss[1]) + " vs " + std::to_string(loss[0]));
        for (size_t i = 0; i < grads[0].size(); ++i) {
          const double d = rel_diff(grads[1][i], grads[0][i]);
          if (!(d <= tolerance)) failures.push_back(where + "parameter " + std::to_string(i) + " rel " + std::to_string(d));
        }
        if (c.TP > 1 && !(activations[1] < activations[0]))
          failures.push_back(where + "activations " + std::to_string(activations[1]) + " not below " +
                             std::to_string(activations[0]));
      });
      for (const auto& f : failures) UNSCOPED_INFO(f);
      CHECK(failures.empty());
    }
  }
  }
}

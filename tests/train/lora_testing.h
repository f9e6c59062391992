// Test support for the LoRA and QLoRA training suites: random adapters, the suites' run, every adapter's
// gradient by name, and the adapters' gradients of a data x model mesh against one device's.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "distributed/runtime.h"
#include "model/random_init.h"
#include "model/random_model.h"
#include "model/trainable_llama.h"
#include "nn/fd_check.h"
#include "support/rel_diff.h"
#include "support/synthetic_text.h"
#include "train/loop.h"
#include "train/quiet_run.h"

namespace tpcli::testing {

// The LoRA suites' run: 8 steps of a short cosine schedule on a character corpus, `model` with the
// corpus's vocabulary, `lora` on the base that `write_base(model)` writes and returns.
inline train::TrainOptions lora_run_options(
    model::LlamaConfig model, const model::LoraOptions& lora,
    const std::function<std::shared_ptr<const model::WeightSource>(const model::LlamaConfig&)>& write_base) {
  const std::string text = synthetic_text(3000, 2);
  auto tokenizer = std::make_shared<const train::TextTokenizer>(train::TextTokenizer::chars(text));
  train::TrainOptions o;
  o.tokenizer = tokenizer;
  o.corpus = std::make_shared<const train::Corpus>(train::split_corpus(tokenizer->encode(text)));
  o.model = model;
  o.model.vocab_size = tokenizer->vocab_size();
  o.init = write_base(o.model);
  o.lora = lora;
  o.steps = 8;
  o.batch_size = 4;
  o.seq_len = 12;
  o.seed = 3;
  o.schedule = {2e-2, 2e-3, 2, 8, train::Decay::Cosine};
  quiet_run(o);  // no evaluation
  return o;
}

// Every adapter's full A and B, random (B too: a fresh B is zero, which hides A's gradient).
inline model::TensorWeights random_adapters(const model::LlamaConfig& c, const model::LoraOptions& o, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.2f);
  model::TensorWeights w(c);
  for (const auto& spec : model::lora_parameters(c, o)) {
    std::vector<float> v(static_cast<size_t>(tensor::numel(spec.shape)));
    for (auto& x : v) x = d(rng);
    w.set(spec.name, tensor::Tensor(spec.shape, std::move(v)));
  }
  return w;
}

// Every parameter's gradient (the adapters', with LoRA), by name.
inline std::map<std::string, std::vector<float>> grads_of(model::TrainableLlama& m) {
  std::map<std::string, std::vector<float>> g;
  for (const auto& p : m.parameters()) g[p.spec->name].assign(p.grad->span().begin(), p.grad->span().end());
  return g;
}

// `probes` random elements of every adapter in `adapters`: the analytic gradient in `grads` against
// central differences of `loss` (which must read `adapters`, moved one element at a time).
inline void check_by_differences(const std::map<std::string, std::vector<float>>& grads, model::TensorWeights& adapters,
                                 const std::function<double()>& loss, int probes, uint32_t seed) {
  std::mt19937 rng(seed);
  for (const auto& [name, g] : grads) {
    auto& t = adapters.at(name);
    for (int probe = 0; probe < probes; ++probe) {
      const int64_t i = std::uniform_int_distribution<int64_t>(0, t.numel() - 1)(rng);
      const double numeric = nn::testing::central_difference(t[i], loss, 1e-2f);
      INFO(name << "[" << i << "]: analytic " << g[static_cast<size_t>(i)] << ", numeric " << numeric);
      CHECK(std::abs(g[static_cast<size_t>(i)] - numeric) <= 2e-3 + 3e-2 * std::abs(numeric));
    }
  }
}

struct MeshGradients {
  std::vector<std::string> failures;  // "device 3 layers.1.wq.lora_b rel 0.5"
  std::vector<double> losses;         // every device's
};

// The data-parallel gradients (train::data_parallel_gradients) of `base` with `adapters` on a
// data=D x model=TP mesh, the batch's rows dealt over the data axis, each adapter's full gradient
// compared with `want` (one device's) within a relative `tolerance`.
inline MeshGradients adapter_gradients_on_mesh(const model::WeightSource& base, const model::LoraOptions& o,
                                               const model::TensorWeights& adapters, const std::vector<int>& inputs,
                                               const std::vector<int>& targets, int B, int T, int D, int TP,
                                               const std::map<std::string, std::vector<float>>& want, double tolerance) {
  std::mutex mu;
  MeshGradients out;
  dist::run_on_mesh(dist::Mesh({{"data", D}, {"model", TP}}), [&](dist::Device& dev) {
    dist::Group& data = dev.axis("data");
    train::ParallelAxes axes{&data, &dev.world(), D, TP, D, true};
    model::TrainableLlama llama(base, dev.axis("model"), {}, o);
    llama.load_parameters(adapters);
    const auto rows = train::data_rows(B, D, data.rank());
    const auto first = static_cast<size_t>(rows.begin * T), n = static_cast<size_t>((rows.end - rows.begin) * T);
    const double loss = train::data_parallel_gradients(llama, axes, std::span(inputs).subspan(first, n),
                                                       std::span(targets).subspan(first, n), rows.end - rows.begin, T);
    const model::TensorWeights grads = train::gather_gradients(llama);
    std::lock_guard lock(mu);
    out.losses.push_back(loss);
    for (const auto& [name, w] : want) {
      const double d = rel_diff(grads.get(name), w);
      if (!(d <= tolerance)) out.failures.push_back("device " + std::to_string(dev.rank()) + " " + name + " rel " + std::to_string(d));
    }
  });
  return out;
}

}  // namespace tpcli::testing

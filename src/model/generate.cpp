#include "model/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <stdexcept>

#include "distributed/trace.h"
#include "model/llama.h"

namespace tpcli::model {

GenerateOptions normalized(GenerateOptions o, int seq_len) {
  // llama2.c's overrides below would let a NaN through (every comparison with it is false).
  if (!std::isfinite(o.temperature))
    throw std::invalid_argument("temperature -t = " + std::to_string(o.temperature) + " is not a finite number");
  if (!std::isfinite(o.topp)) throw std::invalid_argument("top-p -p = " + std::to_string(o.topp) + " is not a finite number");
  if (o.seed == 0) o.seed = static_cast<unsigned int>(std::time(nullptr));
  if (o.temperature < 0.0f) o.temperature = 0.0f;
  if (o.topp < 0.0f || 1.0f < o.topp) o.topp = 0.9f;
  if (o.steps < 0) o.steps = 0;
  if (o.steps == 0 || o.steps > seq_len) o.steps = seq_len;
  return o;
}

GenerateResult generate(const ModelFns& model, const Tokenizer& tokenizer, const GenerateOptions& options,
                        std::FILE* out) {
  const std::vector<int> prompt = tokenizer.encode(options.prompt, /*bos=*/true, /*eos=*/false);
  std::string text;  // exactly what goes to `out`
  auto emit = [&](std::string_view piece) {
    text.append(piece);
    if (out) {
      std::fwrite(piece.data(), 1, piece.size(), out);
      std::fflush(out);
    }
  };
  GenerateResult result = generate_from_ids(model, prompt, tokenizer.vocab_size(), options, [&](int token, int next) {
    if (next == BOS_TOKEN) return false;  // BOS delimits sequences
    emit(Tokenizer::printable_piece(tokenizer.decode(token, next)));
    return true;
  });
  emit("\n");
  result.text = std::move(text);
  return result;
}

GenerateResult generate_from_ids(const ModelFns& model, std::span<const int> prompt, int vocab,
                                 const GenerateOptions& options, const NextTokenFn& on_next) {
  if (prompt.empty()) throw std::invalid_argument("generate: the prompt holds no token");
  for (int id : prompt)
    if (id < 0 || id >= vocab)
      throw std::invalid_argument("generate: prompt token " + std::to_string(id) + " is outside the vocabulary [0, " +
                                  std::to_string(vocab) + ")");
  Sampler sampler(vocab, options.temperature, options.topp, options.seed);
  std::vector<float> logits(static_cast<size_t>(vocab));  // [V] the sampler's working copy

  GenerateResult result;
  auto checked = [&](std::span<const float> full) {
    if (static_cast<int>(full.size()) != vocab)
      throw std::runtime_error("model returned " + std::to_string(full.size()) + " logits, the vocabulary has " +
                               std::to_string(vocab) + " tokens");
    return full;
  };

  using Clock = std::chrono::steady_clock;
  const bool greedy_shortcut = options.temperature == 0.0f && model.argmax;
  std::span<const float> full;  // [V] logits of the last position run (unless greedy_shortcut)
  int greedy = -1;              // its argmax (greedy_shortcut)

  // The prompt (up to `steps` positions) in one batch: positions 0..prefilled-1 have run after it.
  int prefilled = 0;
  const bool can_prefill = greedy_shortcut ? static_cast<bool>(model.prefill_argmax) : static_cast<bool>(model.prefill);
  if (can_prefill && prompt.size() > 1 && options.steps > 1) {
    prefilled = std::min(static_cast<int>(prompt.size()), options.steps);
    const std::span<const int> batch = prompt.first(static_cast<size_t>(prefilled));
    const auto t0 = Clock::now();
    if (greedy_shortcut) greedy = model.prefill_argmax(batch, 0);
    else full = checked(model.prefill(batch, 0));
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    result.prefill_tokens = prefilled;
    result.prefill_tokens_per_second = seconds > 0 ? prefilled / seconds : 0;
  }
  Clock::time_point start = Clock::now();  // end of the first forward call (reset below when it is a decode)
  const int first_call = std::max(prefilled, 1);  // positions the first forward call ran

  int token = prompt[0];
  int pos = 0;
  result.tokens.push_back(token);
  while (pos < options.steps) {
    if (pos >= prefilled) {  // inside a prefilled prompt every position has run already
      if (greedy_shortcut) greedy = model.argmax(token, pos);
      else full = checked(model.forward(token, pos));
      if (pos == 0) start = Clock::now();
    }
    int next;
    if (pos < static_cast<int>(prompt.size()) - 1) {
      next = prompt[static_cast<size_t>(pos) + 1];  // still inside the prompt: force it
    } else if (greedy_shortcut) {
      if (greedy < 0)  // Llama::forward_argmax: some device's logits are not finite
        throw std::runtime_error("the model's logits at position " + std::to_string(pos) +
                                 " are not finite: the checkpoint holds non-finite weights or settings");
      next = greedy;
    } else {
      require_finite_logits(full, pos);
      logits.assign(full.begin(), full.end());
      next = sampler.sample(logits);
    }
    ++pos;
    result.tokens.push_back(next);
    if (on_next && !on_next(token, next)) break;
    token = next;
  }
  result.positions = pos;
  if (pos > first_call) {
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    result.tokens_per_second = seconds > 0 ? (pos - first_call) / seconds : 0;
  }
  return result;
}

GenerateResult generate(const ForwardFn& forward, const Tokenizer& tokenizer, const GenerateOptions& options,
                        std::FILE* out, const ArgmaxFn& argmax) {
  return generate(ModelFns{forward, argmax, nullptr, nullptr}, tokenizer, options, out);
}

MeshGenerateResult run_model_on_mesh(const WeightSource& weights, const dist::Mesh& mesh, const DeviceLoop& loop,
                               std::FILE* out, const dist::RunOptions& run_options, nn::KvDtype kv_dtype) {
  return run_model_on_mesh(weights, Placement(weights, mesh), loop, out, run_options, kv_dtype);
}

MeshGenerateResult run_model_on_mesh(const WeightSource& weights, const Placement& placement, const DeviceLoop& loop,
                                     std::FILE* out, const dist::RunOptions& run_options, nn::KvDtype kv_dtype) {
  const dist::Mesh& mesh = placement.mesh();
  std::vector<GenerateResult> results(static_cast<size_t>(mesh.size()));  // [devices], one slot each
  std::vector<DeviceReport> reports(static_cast<size_t>(mesh.size()));
  run_placed(
      weights, placement, run_options,
      [&](Llama& model, dist::Device& dev) {
        const uint64_t moved_before = dev.stats().bytes_sent + dev.stats().bytes_received;
        ModelFns fns;
        fns.forward = [&](int token, int pos) {
          dist::TraceSpan span(dev.trace(), dev.rank(), "forward");
          return model.forward(token, pos);
        };
        fns.argmax = [&](int token, int pos) {
          dist::TraceSpan span(dev.trace(), dev.rank(), "forward");
          return model.forward_argmax(token, pos);
        };
        fns.prefill = [&](std::span<const int> tokens, int pos) {
          dist::TraceSpan span(dev.trace(), dev.rank(), "prefill");
          return model.prefill(tokens, pos);
        };
        fns.prefill_argmax = [&](std::span<const int> tokens, int pos) {
          dist::TraceSpan span(dev.trace(), dev.rank(), "prefill");
          return model.prefill_argmax(tokens, pos);
        };
        results[static_cast<size_t>(dev.rank())] = loop(fns, dev.rank() == 0 ? out : nullptr);
        DeviceReport& r = reports[static_cast<size_t>(dev.rank())];
        r.parameter_bytes = model.parameter_bytes();
        r.kv_cache_bytes = model.kv_cache_bytes();
        r.bytes_moved = dev.stats().bytes_sent + dev.stats().bytes_received - moved_before;
      },
      kv_dtype);
  // Devices that ran in this process (all of them with the thread backend) must agree.
  size_t first = 0;
  while (first < results.size() && results[first].tokens.empty()) ++first;
  if (first == results.size()) return {GenerateResult{}, std::move(reports)};
  for (size_t d = first + 1; d < results.size(); ++d)
    if (!results[d].tokens.empty() && results[d].tokens != results[first].tokens)
      throw std::logic_error("device " + std::to_string(d) + " picked different tokens than device " +
                             std::to_string(first));
  return {std::move(results[first]), std::move(reports)};
}

MeshGenerateResult generate_on_mesh(const WeightSource& weights, const Tokenizer& tokenizer, const dist::Mesh& mesh,
                                    const GenerateOptions& options, std::FILE* out,
                                    const dist::RunOptions& run_options, bool batched_prompt, nn::KvDtype kv_dtype) {
  return generate_on_mesh(weights, tokenizer, Placement(weights, mesh), options, out, run_options, batched_prompt, kv_dtype);
}

MeshGenerateResult generate_on_mesh(const WeightSource& weights, const Tokenizer& tokenizer, const Placement& placement,
                                    const GenerateOptions& options, std::FILE* out,
                                    const dist::RunOptions& run_options, bool batched_prompt, nn::KvDtype kv_dtype) {
  if (tokenizer.vocab_size() != weights.config().vocab_size)
    throw std::invalid_argument("tokenizer has " + std::to_string(tokenizer.vocab_size()) +
                                " tokens but the model's vocab_size is " + std::to_string(weights.config().vocab_size));
  return run_model_on_mesh(
      weights, placement,
      [&](const ModelFns& model, std::FILE* device_out) {
        ModelFns fns = model;
        if (!batched_prompt) {
          fns.prefill = nullptr;
          fns.prefill_argmax = nullptr;
        }
        return generate(fns, tokenizer, options, device_out);
      },
      out, run_options, kv_dtype);
}

}  // namespace tpcli::model

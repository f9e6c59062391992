#include "engine/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <stdexcept>

#include "distributed/trace.h"
#include "engine/batch_engine.h"
#include "model/llama.h"

namespace tpcli::engine {

using text::BOS_TOKEN;

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

GenerateResult llama2c_text(const IdsRun& run, const text::Tokenizer& tokenizer, const std::string& prompt, std::FILE* out) {
  std::string text;  // exactly what goes to `out`
  auto emit = [&](std::string_view piece) {
    text.append(piece);
    if (out) {
      std::fwrite(piece.data(), 1, piece.size(), out);
      std::fflush(out);
    }
  };
  GenerateResult result = run(tokenizer.encode(prompt, /*bos=*/true, /*eos=*/false), [&](int token, int next) {
    if (next == BOS_TOKEN) return false;  // BOS delimits sequences
    emit(text::Tokenizer::printable_piece(tokenizer.decode(token, next)));
    return true;
  });
  emit("\n");
  result.text = std::move(text);
  return result;
}

GenerateResult generate(const ModelFns& model, const text::Tokenizer& tokenizer, const GenerateOptions& options,
                        std::FILE* out) {
  const IdsRun run = [&](std::span<const int> prompt, const NextTokenFn& on_next) {
    return generate_from_ids(model, prompt, tokenizer.vocab_size(), options, on_next);
  };
  return llama2c_text(run, tokenizer, options.prompt, out);
}

namespace {

// One sequence alone: a pool of one block of seq_len positions (the memory of the model's own KV
// cache), the whole prompt in the first step.
EngineOptions one_sequence(const model::Llama& llama) {
  EngineOptions o;
  o.parallel = 1;
  o.block_size = llama.config().seq_len;
  o.kv_blocks = 1;
  o.kv_dtype = llama.kv_dtype();
  o.step_tokens = llama.config().seq_len;
  o.prefix_sharing = false;
  return o;
}

void check_prompt(std::span<const int> prompt, int vocab) {
  if (prompt.empty()) throw std::invalid_argument("generate: the prompt holds no token");
  for (int id : prompt)
    if (id < 0 || id >= vocab)
      throw std::invalid_argument("generate: prompt token " + std::to_string(id) + " is outside the vocabulary [0, " +
                                  std::to_string(vocab) + ")");
}

}  // namespace

GenerateResult generate_from_ids(const ModelFns& model, std::span<const int> prompt, int vocab,
                                 const GenerateOptions& options, const NextTokenFn& on_next) {
  check_prompt(prompt, vocab);
  if (!model.llama) throw std::invalid_argument("generate: no model to run the batch engine on (ModelFns::llama)");
  if (model.llama->config().vocab_size != vocab)
    throw std::runtime_error("model returned " + std::to_string(model.llama->config().vocab_size) +
                             " logits, the vocabulary has " + std::to_string(vocab) + " tokens");
  GenerateResult result;
  result.tokens.push_back(prompt[0]);
  if (options.steps < 1) return result;
  const int P = static_cast<int>(prompt.size());
  const int picks = options.steps - P + 1;  // tokens the sampler picks (<= 0: the run ends inside the prompt)
  BatchRequest request;
  request.prompt.assign(prompt.begin(), prompt.begin() + std::min(P, options.steps));
  request.max_tokens = std::max(picks, 1);  // a pick past `steps` is not taken
  request.temperature = options.temperature;
  request.topp = options.topp;
  request.sampling = options.sampling;
  request.seed = options.seed;
  request.guesses = options.guesses;

  int token = prompt[0];  // the last token taken
  bool ended = false;     // on_next said stop
  auto take = [&](int next) {
    result.tokens.push_back(next);
    ended = on_next && !on_next(token, next);
    token = next;
    return !ended;
  };
  size_t forced = 1;  // the next prompt token to take: prompt[1..forced_end) are forced picks
  const size_t forced_end = static_cast<size_t>(std::min(P, options.steps + 1));
  auto take_forced = [&] {
    while (!ended && forced < forced_end) take(prompt[forced++]);
  };
  BatchEngine engine(*model.llama, one_sequence(*model.llama));
  const int id = engine.add(std::move(request));
  engine.on_token = [&](int, int next) {  // the prompt's forced picks come first, once its step has run
    take_forced();
    return !ended && picks > 0 && take(next);
  };

  using Clock = std::chrono::steady_clock;
  Clock::time_point first_end;  // the end of the first step (the whole prompt)
  int64_t first_rows = 0;
  while (!engine.idle()) {
    const auto t0 = Clock::now();
    {
      dist::TraceSpan span(model.trace, model.track, first_rows == 0 && P > 1 ? "prefill" : "forward");
      engine.step();
    }
    if (first_rows == 0) {
      first_end = Clock::now();
      first_rows = engine.stats().rows;
      if (first_rows > 1) {
        const double seconds = std::chrono::duration<double>(first_end - t0).count();
        result.prefill_tokens = static_cast<int>(first_rows);
        result.prefill_tokens_per_second = seconds > 0 ? static_cast<double>(first_rows) / seconds : 0;
      }
    }
  }
  take_forced();
  const BatchResult& r = engine.result(id);
  if (r.finish_reason == FinishReason::error && !ended && picks > 0) throw std::runtime_error(r.error);
  result.positions = static_cast<int>(result.tokens.size()) - 1;
  result.steps = engine.stats().steps;
  result.guessed = engine.stats().guessed;
  result.guessed_right = engine.stats().guessed_right;
  if (result.positions > first_rows) {
    const double seconds = std::chrono::duration<double>(Clock::now() - first_end).count();
    result.tokens_per_second = seconds > 0 ? static_cast<double>(result.positions - first_rows) / seconds : 0;
  }
  return result;
}

MeshGenerateResult run_model_on_mesh(const model::WeightSource& weights, const dist::Mesh& mesh, const DeviceLoop& loop,
                               std::FILE* out, const dist::RunOptions& run_options, nn::KvDtype kv_dtype) {
  return run_model_on_mesh(weights, model::Placement(weights, mesh), loop, out, run_options, kv_dtype);
}

MeshGenerateResult run_model_on_mesh(const model::WeightSource& weights, const model::Placement& placement, const DeviceLoop& loop,
                                     std::FILE* out, const dist::RunOptions& run_options, nn::KvDtype kv_dtype) {
  const dist::Mesh& mesh = placement.mesh();
  std::vector<GenerateResult> results(static_cast<size_t>(mesh.size()));  // [devices], one slot each
  std::vector<DeviceReport> reports(static_cast<size_t>(mesh.size()));
  run_placed(
      weights, placement, run_options,
      [&](model::Llama& model, dist::Device& dev) {
        const uint64_t moved_before = dev.stats().bytes_sent + dev.stats().bytes_received;
        ModelFns fns;
        fns.llama = &model;
        fns.trace = dev.trace();
        fns.track = dev.rank();
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

MeshGenerateResult generate_on_mesh(const model::WeightSource& weights, const text::Tokenizer& tokenizer, const dist::Mesh& mesh,
                                    const GenerateOptions& options, std::FILE* out,
                                    const dist::RunOptions& run_options, nn::KvDtype kv_dtype) {
  return generate_on_mesh(weights, tokenizer, model::Placement(weights, mesh), options, out, run_options, kv_dtype);
}

MeshGenerateResult generate_on_mesh(const model::WeightSource& weights, const text::Tokenizer& tokenizer, const model::Placement& placement,
                                    const GenerateOptions& options, std::FILE* out,
                                    const dist::RunOptions& run_options, nn::KvDtype kv_dtype) {
  if (tokenizer.vocab_size() != weights.config().vocab_size)
    throw std::invalid_argument("tokenizer has " + std::to_string(tokenizer.vocab_size()) +
                                " tokens but the model's vocab_size is " + std::to_string(weights.config().vocab_size));
  return run_model_on_mesh(
      weights, placement,
      [&](const ModelFns& model, std::FILE* device_out) { return generate(model, tokenizer, options, device_out); },
      out, run_options, kv_dtype);
}

}  // namespace tpcli::engine

// generate_from_ids as one batch engine request (engine/generate.h) against llama2.c's own loop
// (tests/support/reference_generate.h, token by token or its prompt in one prefill, the greedy
// shortcut through forward_argmax): the same picks, positions and prompt batch, seeded and greedy,
// prompts ending before `steps`, at it and past it, up to the context's end, on 1 and 2 devices;
// a stop said by on_next; non-finite logits.
#include <catch2/catch.hpp>

#include <cmath>
#include <span>
#include <vector>

#include "distributed/mesh.h"
#include "engine/generate.h"
#include "model/llama.h"
#include "random_model.h"
#include "support/error_of.h"
#include "support/reference_generate.h"

using namespace tpcli;
using namespace tpcli::testing;

namespace {

struct Run {
  engine::GenerateResult result;
  std::vector<std::pair<int, int>> seen;  // (token, next) as on_next saw them
};

// Device 0's run of `generate` on `devices` devices (every device's tokens must agree: run_model_on_mesh checks).
template <class Generate>
Run on_devices(const TensorWeights& w, int devices, const Generate& generate) {
  Run run;
  run.result = engine::run_model_on_mesh(
                   w, dist::Mesh::line(devices),
                   [&](const engine::ModelFns& m, std::FILE* out) {
                     std::vector<std::pair<int, int>> seen;
                     engine::GenerateResult r = generate(m, seen);
                     if (out) run.seen = std::move(seen);
                     return r;
                   },
                   stdout)
                   .result;
  return run;
}

}  // namespace

TEST_CASE("generate_from_ids: one engine request picks what llama2.c's loop picks, on 1 and 2 devices", "[llama][batch]") {
  const LlamaConfig c = make_config(16, 4, 2, 40, 2, 23, false);  // seq_len 16
  const TensorWeights w = random_weights(c, 7);
  const std::vector<int> five = random_tokens(5, c.vocab_size, 3);
  struct Case {
    int prompt;  // tokens of `five`
    int steps;
    float temperature;
    bool reference_prefill;  // the reference feeds its prompt in one batch (else token by token)
  };
  const Case cases[] = {{5, 12, 0.0f, true},  {5, 12, 0.9f, true},  {5, 12, 0.9f, false}, {1, 9, 0.9f, true},
                        {1, 16, 0.9f, false}, {5, 16, 0.0f, false}, {5, 5, 0.9f, true},   {5, 3, 0.9f, true},
                        {5, 1, 0.0f, true},   {5, 4, 0.0f, false}};
  for (const Case& k : cases) {
    engine::GenerateOptions o;
    o.steps = k.steps;
    o.temperature = k.temperature;
    o.topp = 0.9f;
    o.seed = 42;
    const std::span<const int> prompt(five.data(), static_cast<size_t>(k.prompt));
    for (int devices : {1, 2}) {
      INFO(k.prompt << "-token prompt, steps " << k.steps << ", temperature " << k.temperature << ", " << devices << " devices");
      const Run engine = on_devices(w, devices, [&](const engine::ModelFns& m, auto& seen) {
        return engine::generate_from_ids(m, prompt, c.vocab_size, o, [&](int token, int next) {
          seen.emplace_back(token, next);
          return true;
        });
      });
      const Run reference = on_devices(w, devices, [&](const engine::ModelFns& m, auto& seen) {
        engine::ModelFns loop{m.forward, m.argmax};
        if (k.reference_prefill) loop = {m.forward, m.argmax, m.prefill, m.prefill_argmax};
        return reference_generate_from_ids(loop, prompt, c.vocab_size, o, [&](int token, int next) {
          seen.emplace_back(token, next);
          return true;
        });
      });
      CHECK(engine.result.tokens == reference.result.tokens);
      CHECK(engine.seen == reference.seen);
      CHECK(engine.result.positions == reference.result.positions);
      CHECK(engine.result.positions == k.steps);
      CHECK(static_cast<int>(engine.result.tokens.size()) == k.steps + 1);
      // The prompt (up to `steps` of it) runs in the engine's first step, as the reference's prefill.
      const int batch = std::min(k.prompt, k.steps);
      CHECK(engine.result.prefill_tokens == (batch > 1 ? batch : 0));
      if (k.reference_prefill) CHECK(engine.result.prefill_tokens == reference.result.prefill_tokens);
    }
  }
}

TEST_CASE("generate_from_ids: on_next ends the run at a forced or a picked token, as llama2.c's loop", "[llama][batch]") {
  const LlamaConfig c = make_config(16, 4, 2, 40, 2, 23, false);
  const TensorWeights w = random_weights(c, 11);
  const std::vector<int> prompt = random_tokens(6, c.vocab_size, 5);
  engine::GenerateOptions o;
  o.steps = 14;
  o.temperature = 1.0f;
  o.topp = 0.95f;
  o.seed = 9;
  for (const int stop_after : {2, 5, 6, 9}) {  // the on_next call that says stop: forced (2, 5) or picked
    INFO("stop at call " << stop_after);
    auto stopping = [&](auto& seen) {
      return [&seen, stop_after](int token, int next) {
        seen.emplace_back(token, next);
        return static_cast<int>(seen.size()) < stop_after;
      };
    };
    const Run engine = on_devices(w, 1, [&](const engine::ModelFns& m, auto& seen) {
      return engine::generate_from_ids(m, prompt, c.vocab_size, o, stopping(seen));
    });
    const Run reference = on_devices(w, 1, [&](const engine::ModelFns& m, auto& seen) {
      return reference_generate_from_ids({m.forward, m.argmax, m.prefill, m.prefill_argmax}, prompt, c.vocab_size, o, stopping(seen));
    });
    CHECK(engine.result.tokens == reference.result.tokens);
    CHECK(engine.seen == reference.seen);
    CHECK(static_cast<int>(engine.seen.size()) == stop_after);
    CHECK(engine.result.positions == reference.result.positions);
    CHECK(engine.result.positions == stop_after);
  }
}

TEST_CASE("generate_from_ids: non-finite logits end the run naming the position, but not a run that picks nothing", "[llama][batch]") {
  const LlamaConfig c = make_config(16, 4, 2, 40, 2, 23, false);
  TensorWeights w = random_weights(c, 1);
  std::vector<float> norm(w.get("norm").begin(), w.get("norm").end());
  norm[3] = NAN;  // every logit NaN
  w.set("norm", tensor::Tensor({c.dim}, norm));
  const std::vector<int> prompt = random_tokens(5, c.vocab_size, 2);
  for (float temperature : {0.0f, 1.0f}) {
    engine::GenerateOptions o;
    o.steps = 10;
    o.temperature = temperature;
    o.seed = 1;
    std::vector<int> seen;
    const std::string e = error_of([&] {
      on_devices(w, 2, [&](const engine::ModelFns& m, auto&) {
        return engine::generate_from_ids(m, prompt, c.vocab_size, o, [&](int, int next) {
          if (m.track == 0) seen.push_back(next);
          return true;
        });
      });
    });
    CHECK(e.find("logits at position 4 are not finite") != std::string::npos);
    CHECK(seen == std::vector<int>(prompt.begin() + 1, prompt.end()));  // the forced picks came first, as run.c prints them
    o.steps = 3;  // inside the prompt: nothing is sampled, so nothing is checked (as run.c)
    const Run r = on_devices(w, 1, [&](const engine::ModelFns& m, auto&) { return engine::generate_from_ids(m, prompt, c.vocab_size, o); });
    CHECK(r.result.tokens == std::vector<int>(prompt.begin(), prompt.begin() + 4));
  }
}

// train::generate_text (a chars or bytes model's sample, one batch engine request) against
// llama2.c's loop (tests/support/reference_generate.h) feeding the same tokens: the prompt
// printed as given, then each picked token's text; the same tokens, seeded and greedy.
#include <catch2/catch.hpp>

#include <span>
#include <string>
#include <vector>

#include "distributed/mesh.h"
#include "model/llama.h"
#include "model/random_init.h"
#include "support/reference_generate.h"
#include "train/data.h"
#include "train/sample.h"

using namespace tpcli;

TEST_CASE("train sample: generate_text on the engine prints and picks what llama2.c's loop picks", "[train]") {
  const train::TextTokenizer tokenizer = train::TextTokenizer::chars("to be or not to be, that is the question");
  model::LlamaConfig c{.dim = 16, .hidden_dim = 32, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                       .vocab_size = tokenizer.vocab_size(), .seq_len = 24};
  const model::TensorWeights weights = model::random_weights(c, 3);
  struct Case {
    std::string prompt;
    int steps;
    float temperature;
    uint64_t seed;
  };
  const Case cases[] = {{"", 21, 0.8f, 7}, {"to be", 0, 0.8f, 0}, {"that is", 12, 0.0f, 1}, {"or not", 6, 1.0f, 5}};
  for (const Case& k : cases) {
    INFO("prompt '" << k.prompt << "', steps " << k.steps << ", temperature " << k.temperature);
    std::FILE* none = nullptr;
    train::TextSample sample;
    engine::GenerateResult reference;
    engine::run_model_on_mesh(
        weights, dist::Mesh::line(2),
        [&](const engine::ModelFns& m, std::FILE* out) {
          const train::TextSample s = train::generate_text(m, tokenizer, k.prompt, k.steps, c.seq_len, k.temperature, 0.9f, k.seed, none);
          std::vector<int> prompt = tokenizer.encode(k.prompt);
          if (prompt.empty()) prompt.push_back(0);
          engine::GenerateOptions o;
          o.steps = k.steps > 0 ? k.steps : c.seq_len;
          o.temperature = k.temperature;
          o.topp = 0.9f;
          o.seed = k.seed ? k.seed : 1;
          const engine::GenerateResult r = testing::reference_generate_from_ids({m.forward}, prompt, tokenizer.vocab_size(), o);
          if (out) {
            sample = s;
            reference = r;
          }
          return r;
        },
        stdout);
    CHECK(sample.tokens == reference.tokens);
    const size_t P = std::max<size_t>(tokenizer.encode(k.prompt).size(), 1);
    std::string text = k.prompt;
    for (size_t i = P; i < reference.tokens.size(); ++i) text += tokenizer.decode(std::span<const int>(&reference.tokens[i], 1));
    CHECK(sample.text == text);
    CHECK(static_cast<int>(sample.tokens.size()) == (k.steps > 0 ? k.steps : c.seq_len) + 1);
  }
}

// The mask on Qwen3's real vocabulary (151,669 tokens, rows padded to 151,936 with ""), where tokens
// mix JSON punctuation, words, whitespace runs and pieces of UTF-8 characters: at sampled states of
// random walks, every token's bit equals a copy of the matcher fed the token's bytes (stack moves
// only, no cache).
#include <catch2/catch.hpp>

#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "grammar/compiled_grammar.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar_checks.h"
#include "support/shared_data.h"
#include "text/load_tokenizer.h"
#include "text/token_bytes.h"

using namespace tpcli::grammar;
using namespace tpcli::grammar::testing;

TEST_CASE("mask: Qwen3 vocabulary, every token's bit equals byte-by-byte acceptance at sampled states") {
  TPCLI_REQUIRE_SHARED("data/hf-tokenizers/qwen3");
  const auto loaded = tpcli::text::load_tokenizer(tpcli::testing::shared_path("data/hf-tokenizers/qwen3"));
  std::vector<std::string> bytes = tpcli::text::token_bytes(*loaded.tokenizer);
  bytes.resize(151936);
  const auto vocab = make_vocabulary(std::move(bytes));
  const std::string grammars[] = {
      json_schema_to_gbnf(nlohmann::ordered_json::parse(R"({"type": "object", "properties": {
          "name": {"type": "string", "maxLength": 6}, "n": {"type": "integer", "minimum": -20, "maximum": 300},
          "tags": {"type": "array", "items": {"enum": ["x", "y\u00e9"]}, "maxItems": 2}, "note": {"type": ["string", "null"]}},
          "required": ["name"]})")),
      json_object_gbnf(),
      // counted repetitions: copies near their bound classify the long tokens differently
      json_schema_to_gbnf(nlohmann::ordered_json::parse(R"({"type": "object", "properties": {
          "title": {"type": "string", "minLength": 3, "maxLength": 40},
          "ids": {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 2, "maxItems": 6}},
          "required": ["title", "ids"]})")),
      "root ::= [\\u4e00-\\u9fff]{1,4} (\" \" [a-z]+)* \"\\n\"",
  };
  std::mt19937 rng(99);
  int states = 0, allowed = 0;
  for (const std::string& gbnf : grammars) {
    INFO(gbnf);
    const auto g = compile_gbnf(gbnf, vocab);
    for (int walk = 0; walk < 2; ++walk) {
      int step = 0;
      random_walk(
          g, rng, 12, 0.2,
          [&](const Matcher& m, const std::string& so_far) {
            if (step++ % 3 != 0) return;  // every third state: each costs a pass over the vocabulary
            const auto bits = mask_of(m);
            for (int t = 0; t < vocab->size(); ++t) {
              Matcher copy = m;
              const bool expected = !vocab->bytes(t).empty() && copy.accept_bytes(vocab->bytes(t));
              INFO("after '" << so_far << "', token " << t << " '" << vocab->bytes(t) << "'");
              REQUIRE(bit(bits, t) == expected);
              allowed += expected;
            }
            ++states;
          },
          closing_weight);
    }
  }
  CHECK(states >= 12);
  CHECK(allowed > 10000);
}

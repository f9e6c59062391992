// The token mask (the compile-time cache plus the runtime suffix checks) against two slow references,
// for every token at every state of random walks: a copy of the matcher fed the token byte by byte
// (the stack moves alone), and an independent backtracking recognizer over the grammar's syntax tree.
#include <catch2/catch.hpp>

#include <random>
#include <string>

#include "grammar/compiled_grammar.h"
#include "grammar/gbnf_parser.h"
#include "grammar/matcher.h"
#include "grammar_checks.h"
#include "prefix_recognizer.h"

using namespace tpcli::grammar;
using namespace tpcli::grammar::testing;

namespace {

const char* JSON_GBNF = R"(
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9]{1,3})? ws
ws ::= | " " | "\n" [ \t]{0,20}
)";

const char* GRAMMARS[] = {
    JSON_GBNF,
    "root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\nterm ::= [0-9]+ | \"(\" expr \")\" | \"-\" term",
    "root ::= [\\u03b1-\\u03c9]{2,5} (\"-\" [0-9]{1,3})* \"!\"?",
    "root ::= (\"a\" | \"ab\")* \"b\"? \"c\"",
    "root ::= x y z\nx ::= \"a\"*\ny ::= ( \"b\" | x )?\nz ::= \"c\" | x",
    "root ::= \"<\" tag \">\" body \"</\" tag \">\"\ntag ::= [a-z]{1,4}\nbody ::= ([^<&] | \"&amp;\")* | \"<\" tag \">\" body \"</\" tag \">\"",
    "root ::= [^\\x00-\\x7f]+ \" \"? [\\U0001F600-\\U0001F64F]?",
};

}  // namespace

TEST_CASE("mask: every token's bit equals byte-by-byte acceptance and an independent recognizer (synthetic vocabulary)") {
  const auto vocab = make_vocabulary(synthetic_vocabulary());
  std::mt19937 rng(1234);
  int checked_states = 0, allowed_total = 0, refused_total = 0;
  for (const char* text : GRAMMARS) {
    INFO(text);
    const GbnfGrammar parsed = parse_gbnf(text);
    const auto g = compile_gbnf(text, vocab);
    for (int walk = 0; walk < 12; ++walk) {
      random_walk(g, rng, 40, 0.1, [&](const Matcher& m, const std::string& so_far) {
        const auto bits = mask_of(m);
        for (int t = 0; t < vocab->size(); ++t) {
          const std::string& bytes = vocab->bytes(t);
          const bool byte_wise = accepts_bytewise(m, bytes);
          PrefixRecognizer independent(parsed, so_far + bytes);
          const bool recognized = !bytes.empty() && independent.is_prefix();
          INFO("state after '" << so_far << "', token " << t << " '" << bytes << "'");
          REQUIRE(bit(bits, t) == byte_wise);
          REQUIRE(byte_wise == recognized);
          (bit(bits, t) ? allowed_total : refused_total) += 1;
        }
        PrefixRecognizer whole(parsed, so_far);
        REQUIRE(m.can_end() == whole.is_complete());
        ++checked_states;
      });
    }
  }
  CHECK(checked_states > 200);
  CHECK(allowed_total > 1000);  // the walks reach states with many choices
  CHECK(refused_total > 1000);
}

TEST_CASE("mask: caches built on first use (no compile budget) give the same masks as caches built at compile time") {
  const auto vocab = make_vocabulary(synthetic_vocabulary());
  std::mt19937 rng(5);
  for (const char* text : GRAMMARS) {
    const auto eager = compile_gbnf(text, vocab);
    const auto lazy = std::make_shared<const CompiledGrammar>(build_automaton(parse_gbnf(text)), vocab, /*precompute_budget_ms=*/0.0);
    CHECK(lazy->built_caches() == 0);
    for (int walk = 0; walk < 5; ++walk) {
      random_walk(eager, rng, 30, 0.1, [&](const Matcher& m, const std::string& so_far) {
        Matcher replay(lazy);
        REQUIRE(replay.accept_bytes(so_far));
        REQUIRE(mask_of(replay) == mask_of(m));
      });
    }
    CHECK(lazy->built_caches() > 0);
  }
}

namespace {

// Counted repetitions, unrolled into one copy per count: the copies far from their bound share their
// short-token caches, the copies near it do not (grammar/compiled_grammar.h).
const char* COUNTED_GRAMMARS[] = {
    "root ::= \"\\\"\" [a-z\\u00e0-\\u00ff]{2,30} \"\\\"\" \"!\"?",
    "root ::= (\"ab\" | \"c\" | \"\\\": \"){3,25} \".\"",
    "root ::= item{0,12} \"!\"\nitem ::= [a-c]+ \",\" \" \"?",  // item is unbounded, so not inlined: a call in each copy
    "root ::= \"[\" ( [0-9]{1,3} (\", \" [0-9]{1,3}){1,9} )? \"]\" [\\n]{0,20}",
};

}  // namespace

TEST_CASE("mask: counted repetitions, bands of token lengths shared between copies, every token's bit against byte-by-byte acceptance") {
  const auto vocab = make_vocabulary(synthetic_vocabulary());
  std::mt19937 rng(77);
  // The default bands (every synthetic token is short: all shared), and narrow ones, so that tokens of
  // 4 bytes and more fall in each state's own band.
  const std::vector<std::vector<int>> band_limits = {{SHARED_BAND_LIMITS.begin(), SHARED_BAND_LIMITS.end()}, {1, 2, 3}};
  int checked_states = 0, allowed_total = 0;
  for (const auto& limits : band_limits)
    for (const char* text : COUNTED_GRAMMARS) {
      INFO(text << " (bands up to " << limits.back() << " bytes)");
      const GbnfGrammar parsed = parse_gbnf(text);
      const auto g = std::make_shared<const CompiledGrammar>(build_automaton(parsed), vocab, /*precompute_budget_ms=*/0.0, limits);
      for (int walk = 0; walk < 8; ++walk) {
        random_walk(g, rng, 60, 0.02, [&](const Matcher& m, const std::string& so_far) {
          const auto bits = mask_of(m);
          for (int t = 0; t < vocab->size(); ++t) {
            const std::string& bytes = vocab->bytes(t);
            const bool byte_wise = accepts_bytewise(m, bytes);
            INFO("state after '" << so_far << "', token " << t << " '" << bytes << "'");
            REQUIRE(bit(bits, t) == byte_wise);
            REQUIRE(byte_wise == (!bytes.empty() && PrefixRecognizer(parsed, so_far + bytes).is_prefix()));
            allowed_total += byte_wise;
          }
          ++checked_states;
        });
      }
    }
  CHECK(checked_states > 300);
  CHECK(allowed_total > 2000);
}

TEST_CASE("mask: the copies of a long counted repetition share their short-token caches") {
  const auto vocab = make_vocabulary(synthetic_vocabulary());
  const auto g = std::make_shared<const CompiledGrammar>(build_automaton(parse_gbnf("root ::= \"\\\"\" [a-z]{0,200} \"\\\"\"")), vocab,
                                                         /*precompute_budget_ms=*/1e12);
  const size_t bands = SHARED_BAND_LIMITS.size() + 1;
  CHECK(g->cacheable_states() > 200);
  // Each shared band: the copies within its longest tokens of the bound apart, one for the rest; the
  // own band: one per state.
  CHECK(g->mask_caches() < g->cacheable_states() + (bands - 1) * (SHARED_BAND_LIMITS.back() + 3));
  CHECK(g->built_caches() == g->mask_caches());
}

// libFuzzer target: the constrained-decoding engine (grammar/). The first byte picks the input's
// kind: even, GBNF text; odd, a JSON schema (converted to GBNF, then compiled). Either is compiled
// against a small vocabulary (every byte, JSON pieces, split UTF-8) and walked for a few steps
// (fill_mask, accept the first allowed token). Every failure must be a one-line GrammarError; the
// compiler's limits (repetition counts, automaton sizes, nesting, schema depth) keep hostile inputs
// within the fuzzer's time and memory.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/compiled_grammar.h"
#include "grammar/grammar_error.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"

namespace {

std::shared_ptr<const tpcli::grammar::TokenVocabulary> vocabulary() {
  static const auto v = [] {
    std::vector<std::string> tokens{""};
    for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
    for (const char* piece : {"\":", "\", \"", "{\"", "\"}", "true", "null", "12", "\\n", "  ", "\n  ", "\xc3\xa9", "\xe2\x82", "\xac\""})
      tokens.push_back(piece);
    return std::make_shared<const tpcli::grammar::TokenVocabulary>(std::move(tokens));
  }();
  return v;
}

void walk(const std::shared_ptr<const tpcli::grammar::CompiledGrammar>& g) {
  tpcli::grammar::Matcher m(g);
  std::vector<uint32_t> bits((static_cast<size_t>(g->vocabulary().size()) + 31) / 32);
  for (int step = 0; step < 8 && !m.must_end(); ++step) {
    m.fill_mask(bits);
    int token = -1;
    for (int t = 0; t < g->vocabulary().size() && token < 0; ++t)
      if ((bits[static_cast<size_t>(t) / 32] >> (t % 32)) & 1u) token = t;
    if (token < 0) break;
    if (!m.accept(token)) std::abort();  // the mask allowed it
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool schema = data[0] & 1;
  const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    std::string gbnf;
    if (schema) {
      const auto parsed = nlohmann::ordered_json::parse(input, nullptr, false);
      if (parsed.is_discarded()) return 0;
      gbnf = tpcli::grammar::json_schema_to_gbnf(parsed, (data[0] & 2) ? "p-" : "");
      if (data[0] & 2) gbnf += "root ::= p-root\n";
    } else {
      gbnf = std::string(input);
    }
    walk(tpcli::grammar::compile_gbnf(gbnf, vocabulary()));
  } catch (const tpcli::grammar::GrammarError& e) {
    if (std::string_view(e.what()).find('\n') != std::string_view::npos) {
      std::fprintf(stderr, "a GrammarError of more than one line: %s\n", e.what());
      std::abort();
    }
  }
  return 0;
}

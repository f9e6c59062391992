// tpcli bench grammar [--tokenizer DIR|FILE] [--schema FILE.json] [--steps N] [--seed S]
//
// The constrained-decoding engine (grammar/) on a real vocabulary: the time to compile a JSON schema
// against it (the token-mask cache of every grammar state), then a sampled walk of N steps (random
// logits over the allowed tokens, closing punctuation favoured so answers finish; a new answer
// starts when one ends) timing each step's fill_mask and accept. Default: Qwen3's tokenizer
// (151,669 tokens here, the model's 151,936 rows padded with "") and a typical schema (a dozen
// properties, a nested object, an array, an enum, bounded numbers, a date).
//
// The budget is a small share of a decode step: `tpcli bench decode --model M` on a Qwen3-0.6B-shaped
// checkpoint (`tpcli init --model-config models/qwen3-0.6B.toml --out M`) gives the step time (its
// ms/token); --step-ms that figure prints the mask's share of it.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "grammar/automaton.h"
#include "grammar/compiled_grammar.h"
#include "grammar/gbnf_parser.h"
#include "grammar/grammar_error.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "formats/gguf_vocabulary.h"
#include "text/token_bytes.h"

namespace tpcli::cli {

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* DEFAULT_SCHEMA = R"({
  "type": "object",
  "properties": {
    "id": {"type": "integer", "minimum": 1},
    "name": {"type": "string", "minLength": 1, "maxLength": 40},
    "email": {"type": "string", "format": "email"},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "score": {"type": "number", "minimum": 0, "maximum": 100},
    "active": {"type": "boolean"},
    "role": {"enum": ["admin", "editor", "viewer"]},
    "joined": {"type": "string", "format": "date"},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
    "address": {"type": "object",
                "properties": {"street": {"type": "string"}, "city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city"]},
    "manager": {"type": ["string", "null"]},
    "notes": {"type": "string"}
  },
  "required": ["id", "name", "role", "tags", "address"]
})";

struct BenchGrammarFlags {
  std::string tokenizer = "../shared/data/hf-tokenizers/qwen3";
  std::string schema;  // "" = the built-in one
  int steps = 300;
  int vocab_rows = 0;  // 0: the tokenizer's size (151,936 for Qwen3's model rows when it is Qwen3's)
  unsigned seed = 1;
  double step_ms = 0;  // a decode step's time, from `tpcli bench decode`; 0: not given
};

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

nlohmann::ordered_json read_schema(const std::string& path) {
  if (path.empty()) return nlohmann::ordered_json::parse(DEFAULT_SCHEMA);
  std::ifstream in(path);
  if (!in) throw UsageError("--schema " + path + ": cannot open");
  std::stringstream text;
  text << in.rdbuf();
  try {
    return nlohmann::ordered_json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    throw UsageError("--schema " + path + ": not JSON: " + e.what());
  }
}

struct WalkTimes {
  std::vector<double> mask_us, accept_us;
  int finished = 0;
};

// N sampled steps over `compiled`: random logits over the allowed tokens (closing punctuation
// favoured), an answer ends half the time it may; a new one starts after.
WalkTimes sampled_walk(const std::shared_ptr<const grammar::CompiledGrammar>& compiled, int steps, unsigned seed, bool print_first) {
  const grammar::TokenVocabulary& vocab = compiled->vocabulary();
  std::mt19937 rng(seed);
  std::vector<uint32_t> bits((static_cast<size_t>(vocab.size()) + 31) / 32);
  WalkTimes times;
  std::vector<int> allowed;
  std::vector<double> weights;
  int answers = 0;
  auto m = std::make_unique<grammar::Matcher>(compiled);
  std::string answer;
  for (int step = 0; step < steps; ++step) {
    auto t0 = Clock::now();
    m->fill_mask(bits);
    times.mask_us.push_back(ms_since(t0) * 1000);
    allowed.clear();
    weights.clear();
    for (int t = 0; t < vocab.size(); ++t)
      if ((bits[static_cast<size_t>(t) / 32] >> (t % 32)) & 1u) {
        allowed.push_back(t);
        double w = std::exponential_distribution<double>(1.0)(rng);  // random logits, softmaxed
        for (const char c : vocab.bytes(t)) w *= (c == '"' || c == '}' || c == ']' || c == ',') ? 50 : 1;
        weights.push_back(w);
      }
    const bool end = m->can_end() && (allowed.empty() || std::uniform_real_distribution<double>(0, 1)(rng) < 0.5);
    if (end || allowed.empty()) {
      ++answers;
      times.finished += m->can_end();
      if (answers == 1 && print_first) std::printf("first answer: %s\n", answer.c_str());
      m = std::make_unique<grammar::Matcher>(compiled);
      answer.clear();
      continue;
    }
    const int token = allowed[std::discrete_distribution<size_t>(weights.begin(), weights.end())(rng)];
    t0 = Clock::now();
    if (!m->accept(token)) throw std::logic_error("bench grammar: the matcher refused a token its mask allowed");
    times.accept_us.push_back(ms_since(t0) * 1000);
    answer += vocab.bytes(token);
  }
  return times;
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}
double max_of(const std::vector<double>& v) { return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()); }

void run_bench(const BenchGrammarFlags& f) {
  const nlohmann::ordered_json schema = read_schema(f.schema);
  text::LoadedTokenizer loaded;
  try {
    loaded = formats::load_tokenizer(f.tokenizer);
  } catch (const std::runtime_error& e) {
    throw UsageError(std::string("--tokenizer ") + e.what());
  }
  std::vector<std::string> bytes = text::token_bytes(*loaded.tokenizer);
  const size_t tokenizer_size = bytes.size();
  const bool qwen3 = loaded.tokenizer->token_id("<|im_end|>") && tokenizer_size <= 151936 && tokenizer_size > 151000;
  const size_t rows = f.vocab_rows > 0 ? static_cast<size_t>(f.vocab_rows) : qwen3 ? 151936 : tokenizer_size;
  if (rows < tokenizer_size) throw UsageError("--vocab-rows is below the tokenizer's size");
  bytes.resize(rows);
  auto t0 = Clock::now();
  const auto vocab = std::make_shared<const grammar::TokenVocabulary>(std::move(bytes));
  const double index_ms = ms_since(t0);
  std::string gbnf;
  try {
    gbnf = grammar::json_schema_to_gbnf(schema);
  } catch (const grammar::GrammarError& e) {
    throw UsageError(std::string("--schema: ") + e.what());
  }
  std::shared_ptr<const grammar::CompiledGrammar> compiled;
  double compile_ms = 1e30;
  for (int r = 0; r < 3; ++r) {  // the best of three: a shared machine disturbs single runs
    t0 = Clock::now();
    compiled = grammar::compile_gbnf(gbnf, vocab);
    compile_ms = std::min(compile_ms, ms_since(t0));
  }
  t0 = Clock::now();
  const auto eager = std::make_shared<const grammar::CompiledGrammar>(
      grammar::build_automaton(grammar::parse_gbnf(gbnf)), vocab, /*precompute_budget_ms=*/1e12);
  const double eager_ms = ms_since(t0);
  std::printf("vocabulary: %s, %zu tokens (%d rows), prefix tree %zu nodes, built in %.1f ms\n", loaded.path.c_str(), tokenizer_size,
              vocab->size(), vocab->trie().size(), index_ms);
  std::printf("compile: %.1f ms (schema -> GBNF -> %zu automaton states, %zu of %zu token-mask caches built; best of 3)\n",
              compile_ms, compiled->automaton().states.size(), compiled->built_caches(), compiled->mask_caches());

  std::printf("compile, every cache built: %.1f ms (%zu caches)\n", eager_ms, eager->built_caches());

  const WalkTimes times = sampled_walk(compiled, f.steps, f.seed, /*print_first=*/false);
  std::printf("mask: %.1f us per step mean, %.1f us max (%zu steps, %d answers finished; max: a cache built on first use)\n",
              mean(times.mask_us), max_of(times.mask_us), times.mask_us.size(), times.finished);
  std::printf("accept: %.1f us per token mean, %.1f us max\n", mean(times.accept_us), max_of(times.accept_us));
  const WalkTimes warm = sampled_walk(eager, f.steps, f.seed, /*print_first=*/false);
  std::printf("mask, every cache built: %.1f us per step mean, %.1f us max\n", mean(warm.mask_us), max_of(warm.mask_us));
  if (f.step_ms > 0)
    std::printf("mask / decode step (%.1f ms): %.2f%% mean, %.1f%% max (every cache built: %.2f%% mean, %.2f%% max)\n", f.step_ms,
                mean(times.mask_us) / (f.step_ms * 10), max_of(times.mask_us) / (f.step_ms * 10),
                mean(warm.mask_us) / (f.step_ms * 10), max_of(warm.mask_us) / (f.step_ms * 10));
}

void setup_bench_grammar(CLI::App& sub) {
  auto flags = std::make_shared<BenchGrammarFlags>();
  sub.add_option("--tokenizer", flags->tokenizer, "tokenizer.json, model directory or llama2.c tokenizer.bin")->capture_default_str();
  sub.add_option("--schema", flags->schema, "a JSON schema file (default: a typical built-in one)");
  sub.add_option("--steps", flags->steps, "sampled decode steps")->capture_default_str()->check(CLI::Range(1, 1000000));
  sub.add_option("--vocab-rows", flags->vocab_rows, "mask size (the model's vocabulary; default the tokenizer's, 151936 for Qwen3)");
  sub.add_option("--seed", flags->seed, "sampling seed")->capture_default_str();
  sub.add_option("--step-ms", flags->step_ms, "a decode step's ms (tpcli bench decode's ms/token) to print the mask's share of it")
      ->check(CLI::PositiveNumber);
  sub.callback([flags] { run_bench(*flags); });
}

const bool registered = register_bench(
    {"grammar", "Constrained decoding: JSON-schema compile ms and token-mask us per step on a real vocabulary", setup_bench_grammar});

}  // namespace

}  // namespace tpcli::cli

// tpcli bench spec --model PATH [--devices N | --mesh model=N] [--speculate ngram[:K]] [--tokens N] [--repeats R]
// Speculation against plain greedy decoding of the same prompts, alternated in one run on the same
// devices. Three tasks:
//   edit    a text the model wrote, then its start again: the answer repeats the prompt (an edit,
//           a quotation), what prompt lookup guesses right;
//   random  random token ids: what the model makes of them (a small or random model often loops);
//   wrong   the edit prompt with every guess made wrong: what speculation costs where nothing is
//           accepted, after its pauses.
// Prints, per task, both decode rates (median), their ratio pair by pair, the guesses checked and
// right, the forwards run, and whether the tokens were the same (they must be).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <span>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/model_file.h"
#include "engine/batch_engine.h"
#include "engine/prompt_lookup.h"
#include "model/llama.h"
#include "model/placement.h"
#include "perf/stats.h"

namespace tpcli::cli {

namespace {

struct SpecFlags {
  std::string model;
  std::string speculate = "ngram";
  int tokens = 128;  // generated per run
  int repeats = 5;
  int first_token = 1;  // the edit task's text starts from it (llama2.c's BOS)
};

struct Run {
  std::vector<int> tokens;  // generated
  double tokens_per_second = 0;  // after the prompt's step
  engine::EngineStats stats;
};

struct TaskTimes {
  std::vector<double> plain, speculative;  // [repeats] decode tok/s
  Run plain_run, speculative_run;          // the last of each
  bool same_tokens = true;
};

// Every guess prompt lookup makes, made wrong.
void wrong_guesses(std::span<engine::BatchEngine::GuessRequest> sequences, int vocab) {
  for (engine::BatchEngine::GuessRequest& g : sequences) {
    g.guesses = engine::lookup_guesses(g.tokens, g.count);
    for (int& t : g.guesses) t = (t + 1) % vocab;
  }
}

// One sequence alone, greedy, as infer runs it (the whole prompt in the first step).
Run greedy(model::Llama& llama, const std::vector<int>& prompt, int tokens, int guesses, bool wrong = false) {
  const model::LlamaConfig& c = llama.config();
  engine::EngineOptions o;
  o.parallel = 1;
  o.block_size = c.seq_len;
  o.kv_blocks = 1;
  o.kv_dtype = llama.kv_dtype();
  o.step_tokens = c.seq_len;
  o.prefix_sharing = false;
  o.speculation.guesses = guesses;
  engine::BatchEngine engine(llama, o);
  if (wrong) engine.guess = [&](std::span<engine::BatchEngine::GuessRequest> s) { wrong_guesses(s, c.vocab_size); };
  engine::BatchRequest r;
  r.prompt = prompt;
  r.max_tokens = tokens;
  r.temperature = 0.0f;
  engine.add(r);
  engine.step();
  const auto t0 = std::chrono::steady_clock::now();
  const size_t first = engine.result(0).tokens.size();
  while (engine.step()) {
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Run run{engine.result(0).tokens, 0, engine.stats()};
  run.tokens_per_second = static_cast<double>(run.tokens.size() - first) / seconds;
  return run;
}

TaskTimes time_task(model::Llama& llama, const std::vector<int>& prompt, const SpecFlags& f, int guesses, bool wrong) {
  TaskTimes t;
  greedy(llama, prompt, f.tokens, 0);  // warms up
  for (int rep = 0; rep < f.repeats; ++rep)
    for (const bool speculating : rep % 2 ? std::vector{true, false} : std::vector{false, true}) {
      Run r = greedy(llama, prompt, f.tokens, speculating ? guesses : 0, wrong);
      (speculating ? t.speculative : t.plain).push_back(r.tokens_per_second);
      (speculating ? t.speculative_run : t.plain_run) = std::move(r);
    }
  t.same_tokens = t.plain_run.tokens == t.speculative_run.tokens;
  return t;
}

void print_task(const char* name, const TaskTimes& t, size_t prompt) {
  std::vector<double> ratios;
  for (size_t i = 0; i < t.plain.size(); ++i) ratios.push_back(t.speculative[i] / t.plain[i]);
  const engine::EngineStats& s = t.speculative_run.stats;
  const double right = s.guessed ? 100.0 * static_cast<double>(s.guessed_right) / static_cast<double>(s.guessed) : 0;
  std::printf("%-7s plain %8.1f tok/s  speculative %8.1f tok/s  %.2fx (pairs %.2f-%.2fx)\n", name, perf::median(t.plain),
              perf::median(t.speculative), perf::median(ratios), *std::ranges::min_element(ratios), *std::ranges::max_element(ratios));
  std::printf("        prompt %zu tokens; %lld of %lld guesses right (%.1f%%); %lld forwards for %zu tokens (plain %lld); tokens %s\n",
              prompt, static_cast<long long>(s.guessed_right), static_cast<long long>(s.guessed), right,
              static_cast<long long>(s.steps), t.speculative_run.tokens.size(), static_cast<long long>(t.plain_run.stats.steps),
              t.same_tokens ? "identical" : "DIFFERENT");
}

void run_bench(const SpecFlags& f, const RunFlags& run_flags) {
  const dist::Mesh mesh = mesh_from_flags(run_flags);
  OpenedModel opened = open_model(f.model);
  const model::Placement placement = place_model(opened, f.model, mesh);
  const model::LlamaConfig& c = opened.weights->config();
  const int guesses = parse_speculate(f.speculate);
  if (guesses == 0) throw UsageError("--speculate off: nothing to compare");
  if (f.repeats < 1) throw UsageError("--repeats " + std::to_string(f.repeats) + " must be >= 1");
  if (f.first_token < 0 || f.first_token >= c.vocab_size)
    throw UsageError("--first-token " + std::to_string(f.first_token) + " is outside the vocabulary");
  // The edit prompt holds the text twice plus the answer: three texts and a little within seq_len.
  if (f.tokens < 8 || 3 * f.tokens + 8 > c.seq_len)
    throw UsageError("--tokens " + std::to_string(f.tokens) + " must be in [8, " + std::to_string((c.seq_len - 8) / 3) +
                     "] (an edit prompt and its answer hold three times as many in seq_len " + std::to_string(c.seq_len) + ")");
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> pick(0, c.vocab_size - 1);
  std::vector<int> random_prompt(32);
  for (int& t : random_prompt) t = pick(rng);

  TaskTimes edit, random, wrong;
  std::vector<int> edit_prompt;
  model::run_placed(*opened.weights, placement, {}, [&](model::Llama& llama, dist::Device& dev) {
    std::vector<int> prompt = {f.first_token};
    const std::vector<int> text = greedy(llama, prompt, f.tokens, 0).tokens;  // what the model writes after it
    prompt.insert(prompt.end(), text.begin(), text.end());
    prompt.push_back(f.first_token);  // ... and its start again
    prompt.insert(prompt.end(), text.begin(), text.begin() + 4);
    TaskTimes e = time_task(llama, prompt, f, guesses, false), r = time_task(llama, random_prompt, f, guesses, false);
    TaskTimes w = time_task(llama, prompt, f, guesses, true);
    if (dev.rank() != 0) return;
    edit = std::move(e);
    random = std::move(r);
    wrong = std::move(w);
    edit_prompt = std::move(prompt);
  });
  std::printf("model   %s: dim %d, %d layers, vocab %d, %.1f M parameters\n", f.model.c_str(), c.dim, c.n_layers, c.vocab_size,
              c.parameter_count() / 1e6);
  std::printf("mesh    %s; --speculate %s; greedy, %d tokens a run, %d alternated pairs (median)\n", mesh.to_string().c_str(),
              f.speculate.c_str(), f.tokens, f.repeats);
  print_task("edit", edit, edit_prompt.size());
  print_task("random", random, random_prompt.size());
  print_task("wrong", wrong, edit_prompt.size());
  if (!edit.same_tokens || !random.same_tokens || !wrong.same_tokens) throw std::runtime_error("bench spec: speculation changed the tokens");
}

void setup_bench_spec(CLI::App& sub) {
  auto flags = std::make_shared<SpecFlags>();
  auto run_flags = add_run_flags(sub, FLAG_DEVICES | FLAG_MESH);
  sub.add_option("--model", flags->model, "checkpoint: any model tpcli runs")->required();
  add_speculate_flag(sub, flags->speculate);
  sub.add_option("--tokens", flags->tokens, "tokens generated per run (the edit task's text is as long)")->capture_default_str();
  sub.add_option("--repeats", flags->repeats, "alternated pairs of runs per task")->capture_default_str();
  sub.add_option("--first-token", flags->first_token, "the token the edit task's text starts from (default: llama2.c's BOS)")
      ->capture_default_str();
  sub.callback([flags, run_flags] { run_bench(*flags, *run_flags); });
}

const bool registered = register_bench(
    {"spec", "Speculation (prompt lookup) against plain greedy decoding on an edit and a random prompt", setup_bench_spec});

}  // namespace

}  // namespace tpcli::cli

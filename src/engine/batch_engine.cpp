// tpcli::engine — the batched engine (see batch_engine.h).
#include "engine/batch_engine.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>

#include "engine/sampler.h"
#include "model/shard_plan.h"
#include "tensor/blas.h"
#include "text/text_stream.h"

namespace tpcli::engine {

struct BatchEngine::Sequence {
  int id = 0;
  BatchRequest request;
  std::unique_ptr<Sampler> sampler;
  std::optional<text::TextStream> text;  // with the engine's tokenizer
  std::unique_ptr<TokenConstraint> constraint;  // the request's grammar, if any
  std::vector<uint32_t> mask;                   // [V/32] the constraint's allowed tokens, reused
  std::vector<int> tokens;       // the prompt, then what was generated: every known token
  int64_t computed = 0;          // tokens whose keys and values are in `blocks`
  std::vector<int32_t> blocks;   // the pool blocks of positions 0.. in order
  BatchResult result;
  bool finished = false;
  // Speculation: this step's guesses (fed after its last token), how many the next step may
  // guess (grows while they are right, shrinks to what was right), and steps to wait before
  // guessing again after guesses that were all wrong (doubling with each such miss).
  std::vector<int> guesses;
  int guess_limit = 0, guess_pause = 0, misses = 0;
  int64_t pending() const { return static_cast<int64_t>(tokens.size()) - computed; }  // rows still to run (>= 1 while running)
};

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void check_request(const BatchRequest& r, int id, int context, int vocab, const text::TokenizerInterface* tokenizer) {
  const std::string which = "request " + std::to_string(id) + ": ";
  if (r.prompt.empty() || static_cast<int64_t>(r.prompt.size()) > context)
    throw std::invalid_argument(which + "a prompt of " + std::to_string(r.prompt.size()) + " tokens must hold 1 to " +
                                std::to_string(context) + " (the context: seq_len, or the KV pool's positions if fewer)");
  for (int t : r.prompt)
    if (t < 0 || t >= vocab) throw std::invalid_argument(which + "token " + std::to_string(t) + " outside the vocabulary");
  if (r.max_tokens < 1) throw std::invalid_argument(which + "max_tokens must be >= 1");
  if (r.guesses < -1) throw std::invalid_argument(which + "guesses must be >= 0 (or -1: the engine's)");
  if (!r.stop.empty() && !tokenizer) throw std::invalid_argument(which + "stop strings need the engine's tokenizer");
  if (std::ranges::any_of(r.stop, [](const std::string& s) { return s.empty(); }))
    throw std::invalid_argument(which + "an empty stop string");
  try {
    check_sampling_params(r.sampling, vocab);
  } catch (const SamplingParamError& e) {
    throw std::invalid_argument(which + e.what());
  }
}

}  // namespace

std::string_view finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "cancelled";
    case FinishReason::error: return "error";
  }
  return "?";
}

namespace {

std::string gigabytes(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GB", bytes / 1e9);
  return text;
}

// Refuses a pool the machine cannot hold, before any device allocates it (a std::bad_alloc after
// the model has loaded says nothing of the flag).
void check_pool_fits(int64_t blocks, int64_t block_bytes, int devices, const std::string& flag) {
  const double bytes = static_cast<double>(blocks) * static_cast<double>(block_bytes);
  const double memory = tensor::physical_memory_bytes();
  if (memory <= 0 || bytes * devices <= memory) return;
  throw std::invalid_argument(flag + ": a KV pool of " + std::to_string(blocks) + " blocks takes " + gigabytes(bytes) +
                              " on each of " + std::to_string(devices) + " device(s), more than this machine's " +
                              gigabytes(memory) + " of memory");
}

}  // namespace

int kv_pool_blocks(const model::LlamaConfig& config, const std::vector<model::ShardPlan>& plans, int devices, const EngineOptions& o) {
  if (o.block_size < 1) throw std::invalid_argument("batch engine: a KV block of " + std::to_string(o.block_size) + " positions");
  int64_t rows = 0;
  for (const model::ShardPlan& p : plans) rows = std::max(rows, p.kv_rows().count);
  const int64_t per_block = 2 * int64_t{config.n_layers} * o.block_size * rows * nn::kv_dtype_bytes(o.kv_dtype);
  if (o.kv_blocks > 0) {
    check_pool_fits(o.kv_blocks, per_block, devices, "--kv-blocks " + std::to_string(o.kv_blocks));
    return o.kv_blocks;
  }
  if (o.kv_memory > 0) {
    const int64_t n = o.kv_memory / per_block;
    if (n < 1)
      throw std::invalid_argument("--kv-memory " + std::to_string(o.kv_memory) + " holds no KV block (" + std::to_string(per_block) +
                                  " bytes for " + std::to_string(o.block_size) + " positions)");
    const int blocks = static_cast<int>(std::min<int64_t>(n, std::numeric_limits<int>::max()));
    check_pool_fits(blocks, per_block, devices, "--kv-memory " + std::to_string(o.kv_memory));
    return blocks;
  }
  const int64_t whole = int64_t{o.parallel} * ceil_div(config.seq_len, o.block_size);
  const auto fits = static_cast<int64_t>(tensor::physical_memory_bytes() / 8 / devices / static_cast<double>(per_block));
  return static_cast<int>(std::clamp<int64_t>(std::min(whole, fits), 1, std::numeric_limits<int>::max()));
}

BatchEngine::BatchEngine(model::Llama& llama, const EngineOptions& options, const text::TokenizerInterface* tokenizer)
    : llama_(llama),
      options_(options),
      tokenizer_(tokenizer),
      pool_(llama.new_kv_pool(kv_pool_blocks(llama.config(), llama.plans(), llama.devices(), options), options.block_size,
                              options.kv_dtype)),
      allocator_(pool_.blocks(), options.block_size),
      context_(static_cast<int>(std::min<int64_t>(llama.config().seq_len, int64_t{pool_.blocks()} * options.block_size))) {
  if (options.parallel < 1) throw std::invalid_argument("batch engine: parallel must be >= 1");
  if (options.step_tokens < 1) throw std::invalid_argument("batch engine: step_tokens must be >= 1");
  if (options.busy_prefill_tokens < 0) throw std::invalid_argument("batch engine: busy_prefill_tokens must be >= 0");
  if (options.speculation.guesses < 0) throw std::invalid_argument("batch engine: speculation.guesses must be >= 0");
}

BatchEngine::~BatchEngine() = default;

int BatchEngine::add(BatchRequest request) {
  const int id = static_cast<int>(sequences_.size());
  check_request(request, id, context_, llama_.config().vocab_size, tokenizer_);
  auto s = std::make_unique<Sequence>();
  s->id = id;
  s->sampler = std::make_unique<Sampler>(llama_.config().vocab_size, request.temperature, request.topp, request.seed,
                                         request.sampling);
  s->tokens = request.prompt;
  s->guess_limit = request.guesses >= 0 ? request.guesses : options_.speculation.guesses;
  if (tokenizer_) s->text.emplace(*tokenizer_, request.prompt, request.stop);
  if (request.constraint) s->constraint = request.constraint();
  s->request = std::move(request);
  sequences_.push_back(std::move(s));
  waiting_.push_back(id);
  return id;
}

const BatchResult& BatchEngine::result(int id) const { return sequence(id).result; }

bool BatchEngine::known(int id) const {
  return id >= 0 && static_cast<size_t>(id) < sequences_.size() && sequences_[static_cast<size_t>(id)];
}

BatchEngine::Sequence& BatchEngine::sequence(int id) const {
  if (!known(id)) throw std::out_of_range("batch engine: no sequence " + std::to_string(id));
  return *sequences_[static_cast<size_t>(id)];
}

void BatchEngine::cancel(int id) {
  if (!known(id)) return;
  Sequence& s = sequence(id);
  if (s.finished) return;
  std::erase(waiting_, id);
  std::erase(running_, id);
  finish(s, FinishReason::cancelled);
}

void BatchEngine::forget(int id) {
  if (!sequence(id).finished) throw std::logic_error("batch engine: forget(" + std::to_string(id) + ") of a sequence still running");
  sequences_[static_cast<size_t>(id)].reset();
}

bool BatchEngine::step() {
  if (idle()) return false;
  std::vector<Planned> plan;
  int64_t budget = std::max(options_.step_tokens, options_.parallel);
  plan_running(plan, budget);
  admit_waiting(plan, budget);
  if (plan.empty()) throw std::logic_error("batch engine: a step with no rows");  // the pool holds a whole context
  run(plan);
  return true;
}

// Decode rows first (one each, oldest sequence first), then their guesses, then the prompt chunks
// of sequences still prefilling. A sequence short of blocks preempts the newest.
void BatchEngine::plan_running(std::vector<Planned>& plan, int64_t& budget) {
  for (const bool decoding : {true, false}) {
    if (!decoding) add_guesses(plan, budget);
    if (!decoding && !plan.empty() && options_.busy_prefill_tokens > 0) budget = std::min<int64_t>(budget, options_.busy_prefill_tokens);
    for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
      Sequence& s = *sequences_[static_cast<size_t>(running_[i])];
      if ((s.pending() == 1) != decoding) continue;
      const int64_t rows = reserve(s, std::min(s.pending(), budget), &plan);
      if (rows == 0) break;  // it preempted itself: it was the newest
      plan.push_back({s.id, rows});
      budget -= rows;
    }
  }
}

// Waiting sequences join while there is room, each starting from the longest cached prefix of its
// tokens (at least its last token is run: its logits give the next one). They never preempt.
void BatchEngine::admit_waiting(std::vector<Planned>& plan, int64_t& budget) {
  const int bs = options_.block_size;
  while (budget > 0 && !waiting_.empty() && static_cast<int>(running_.size()) < options_.parallel) {
    Sequence& s = *sequences_[static_cast<size_t>(waiting_.front())];
    if (options_.prefix_sharing) {
      s.blocks = allocator_.match_prefix(s.tokens, static_cast<int>((s.tokens.size() - 1) / bs));
      s.computed = static_cast<int64_t>(s.blocks.size()) * bs;
      if (awaits_shared_prefill(s)) {
        allocator_.release(s.blocks);
        s.blocks.clear();
        s.computed = 0;
        return;
      }
    }
    const int64_t rows = reserve(s, std::min(s.pending(), budget), nullptr);
    if (rows == 0) {
      allocator_.release(s.blocks);
      s.blocks.clear();
      s.computed = 0;
      return;
    }
    if (s.result.tokens.empty()) s.result.cached_tokens = static_cast<int>(s.computed);
    stats_.cached_tokens += s.computed;
    waiting_.pop_front();
    running_.push_back(s.id);
    plan.push_back({s.id, rows});
    budget -= rows;
  }
}

// Whether a running sequence is still computing blocks of s's prompt that s has not matched: s
// then waits for them to be published and reuses them, rather than computing them a second time
// (the n choices of one prompt, one system prompt arriving twice). Only blocks s would not run
// anyway count: at least its last token is its own.
bool BatchEngine::awaits_shared_prefill(const Sequence& s) const {
  const int64_t bs = options_.block_size, own = static_cast<int64_t>(s.tokens.size()) - 1;
  for (const int id : running_) {
    const Sequence& r = *sequences_[static_cast<size_t>(id)];
    const int64_t prompt = static_cast<int64_t>(r.request.prompt.size());
    if (r.computed >= prompt) continue;  // decoding: its prompt's blocks are published
    const auto [a, b] = std::ranges::mismatch(s.tokens.begin(), s.tokens.begin() + std::min(own, prompt), r.tokens.begin(), r.tokens.end());
    const int64_t shared_blocks = (a - s.tokens.begin()) / bs;
    if (shared_blocks * bs > s.computed && shared_blocks * bs > r.computed) return true;
  }
  return false;
}

// Blocks for the next `rows` rows of s; returns how many rows they cover (0..rows). With
// preempt_for (the step planned so far), a pool without free blocks preempts the newest running
// sequence, which may be s itself.
int64_t BatchEngine::reserve(Sequence& s, int64_t rows, std::vector<Planned>* preempt_for) {
  const int64_t bs = options_.block_size, want = ceil_div(s.computed + rows, bs);
  while (static_cast<int64_t>(s.blocks.size()) < want) {
    const int32_t b = allocator_.allocate();
    if (b >= 0) {
      s.blocks.push_back(b);
      continue;
    }
    if (!preempt_for) break;
    const bool self = running_.back() == s.id;
    preempt_newest(*preempt_for);
    if (self) return 0;
  }
  return std::min(rows, static_cast<int64_t>(s.blocks.size()) * bs - s.computed);
}

// Guesses of the decoding sequences' next tokens (`plan` holds their rows), as many as the budget
// left and their blocks allow, asked for all of them at once (a draft model runs them as one
// batch). A guess takes a free block only while one stays for every running sequence's next
// token, so speculation never preempts.
void BatchEngine::add_guesses(std::vector<Planned>& plan, int64_t& budget) {
  std::vector<GuessRequest> wanted;
  std::vector<size_t> rows_of;  // wanted[i]'s entry in plan
  for (size_t i = 0; i < plan.size(); ++i) {
    Sequence& s = *sequences_[static_cast<size_t>(plan[i].id)];
    s.guesses.clear();
    if (s.guess_pause > 0) {
      --s.guess_pause;
      continue;
    }
    const int count = guess_count(s, budget);
    if (count == 0) continue;
    wanted.push_back({s.id, s.tokens, count, {}});
    rows_of.push_back(i);
    budget -= count;
  }
  if (wanted.empty()) return;
  if (guess) guess(wanted);
  else
    for (GuessRequest& g : wanted) g.guesses = lookup_guesses(g.tokens, g.count, options_.speculation.lookup);
  const int64_t bs = options_.block_size;
  for (size_t i = 0; i < wanted.size(); ++i) {
    Sequence& s = *sequences_[static_cast<size_t>(wanted[i].id)];
    s.guesses = std::move(wanted[i].guesses);
    const int64_t want = ceil_div(s.computed + 1 + std::min<int64_t>(std::ssize(s.guesses), wanted[i].count), bs);
    while (std::ssize(s.blocks) < want && allocator_.free() > std::ssize(running_)) s.blocks.push_back(allocator_.allocate());
    const int64_t held = std::min<int64_t>(std::ssize(s.blocks) * bs - s.computed - 1, wanted[i].count);
    if (std::ssize(s.guesses) > held) s.guesses.resize(static_cast<size_t>(held));
    plan[rows_of[i]].rows += std::ssize(s.guesses);
    budget += wanted[i].count - std::ssize(s.guesses);
  }
}

// How many tokens s guesses this step: never past its max_tokens (the last row's pick is a token
// of its own) or the context's last position.
int BatchEngine::guess_count(const Sequence& s, int64_t budget) const {
  if (s.guess_limit <= 0) return 0;
  const int64_t left = s.request.max_tokens - std::ssize(s.result.tokens) - 1, room = context_ - 1 - s.computed;
  return static_cast<int>(std::clamp<int64_t>(std::min({int64_t{s.guess_limit}, budget, left, room}), 0, s.guess_limit));
}

void BatchEngine::after_guesses(Sequence& s, int guessed, int right) {
  stats_.guessed += guessed;
  stats_.guessed_right += right;
  const int limit = s.request.guesses >= 0 ? s.request.guesses : options_.speculation.guesses;
  if (right == 0) {
    s.misses = std::min(s.misses + 1, 4);
    s.guess_pause = (1 << s.misses) - 1;
    s.guess_limit = 1;
    return;
  }
  s.misses = 0;
  s.guess_limit = right == guessed ? std::min(limit, 2 * s.guess_limit) : right + 1;
}

void BatchEngine::preempt_newest(std::vector<Planned>& plan) {
  Sequence& s = *sequences_[static_cast<size_t>(running_.back())];
  running_.pop_back();
  s.guesses.clear();
  std::erase_if(plan, [&](const Planned& p) { return p.id == s.id; });
  allocator_.release(s.blocks);
  s.blocks.clear();
  s.computed = 0;
  waiting_.push_front(s.id);
  ++stats_.preemptions;
}

void BatchEngine::run(const std::vector<Planned>& plan) {
  std::vector<int> tokens;
  std::vector<model::Llama::SequenceRows> rows;
  // Every sequence asking picks greedily from its raw logits and none wants them: the model moves
  // tokens, not logits (a logit_bias or a penalty changes the logits: the argmax needs them all).
  bool greedy = true;
  for (const Planned& p : plan) {
    const Sequence& s = *sequences_[static_cast<size_t>(p.id)];
    const int64_t known = p.rows - std::ssize(s.guesses);
    tokens.insert(tokens.end(), s.tokens.begin() + s.computed, s.tokens.begin() + s.computed + known);
    tokens.insert(tokens.end(), s.guesses.begin(), s.guesses.end());
    const bool last = s.computed + known == std::ssize(s.tokens);
    rows.push_back({p.rows, static_cast<int>(s.computed), s.blocks, last ? 1 + std::ssize(s.guesses) : 0});
    if (last && (s.request.temperature != 0.0f || s.request.logits || s.request.sampling.changes_logits() || s.constraint))
      greedy = false;
  }
  std::span<float> logits;              // [sequences asking, V]
  std::span<const int> greedy_tokens;  // [sequences asking]: argmax, -1 where not finite
  if (greedy) greedy_tokens = llama_.step_greedy(tokens, rows, pool_);
  else logits = llama_.step(tokens, rows, pool_);
  ++stats_.steps;
  stats_.rows += static_cast<int64_t>(tokens.size());
  size_t next = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    Sequence& s = *sequences_[static_cast<size_t>(plan[i].id)];
    advance(s, plan[i].rows - std::ssize(s.guesses));
    if (rows[i].logits == 0) continue;
    take_rows(s, next, greedy, greedy_tokens, logits);
    next += static_cast<size_t>(rows[i].logits);
  }
  std::erase_if(running_, [&](int id) { return sequences_[static_cast<size_t>(id)]->finished; });
}

// s's next token from its first row of logits; then, while the token picked is the guess fed
// after it, the guess's row is s's own (its keys and values stay) and the next row gives the next
// token. The rows after a wrong guess are dropped, and with them the blocks only they filled.
void BatchEngine::take_rows(Sequence& s, size_t first, bool greedy, std::span<const int> greedy_tokens, std::span<float>& logits) {
  const std::vector<int> guesses = std::move(s.guesses);
  s.guesses.clear();
  size_t right = 0;
  for (;; ++right) {
    pick(s, first + right, greedy, greedy_tokens, logits);
    if (s.finished || right == guesses.size() || s.tokens.back() != guesses[right]) break;
    advance(s, 1);
  }
  if (guesses.empty()) return;
  after_guesses(s, static_cast<int>(guesses.size()), static_cast<int>(right));
  if (s.finished) return;
  const size_t keep = static_cast<size_t>(s.computed / options_.block_size + 1);  // the next token's block
  if (s.blocks.size() <= keep) return;
  allocator_.release(std::span<const int32_t>(s.blocks).subspan(keep));
  s.blocks.resize(keep);
}

void BatchEngine::pick(Sequence& s, size_t row, bool greedy, std::span<const int> greedy_tokens, std::span<float>& logits) {
  const size_t V = static_cast<size_t>(llama_.config().vocab_size);
  if (greedy && greedy_tokens[row] >= 0) {
    accept_token(s, greedy_tokens[row]);
    return;
  }
  if (logits.empty()) logits = llama_.step_logits();  // greedy: every device has the same -1, the error names the logit
  take_token(s, logits.data() + V * row);
}

// `rows` more of s's tokens are in its blocks; the blocks they filled are keyed for later prompts.
void BatchEngine::advance(Sequence& s, int64_t rows) {
  const int64_t bs = options_.block_size, before = s.computed / bs;
  s.computed += rows;
  if (!options_.prefix_sharing) return;
  for (int64_t b = before; b < s.computed / bs; ++b)
    allocator_.publish(s.blocks[static_cast<size_t>(b)], b ? s.blocks[static_cast<size_t>(b - 1)] : -1,
                       std::span<const int>(s.tokens).subspan(static_cast<size_t>(b * bs), static_cast<size_t>(bs)));
}

void BatchEngine::take_token(Sequence& s, float* logits) {
  const std::span<float> row(logits, static_cast<size_t>(llama_.config().vocab_size));
  if (auto failure = non_finite_logits(row, static_cast<int>(s.computed - 1))) {  // every device sees the same row
    s.result.error = std::move(*failure);
    finish(s, FinishReason::error);
    return;
  }
  if (on_logits && s.request.logits) on_logits(s.id, row);
  if (s.constraint && !mask_disallowed(s, row)) {
    s.result.error = "the output's grammar allows no token after " + std::to_string(s.result.tokens.size()) + " generated";
    finish(s, FinishReason::error);
    return;
  }
  accept_token(s, s.sampler->sample(row, s.request.prompt, s.result.tokens));
}

// Tokens the constraint does not allow get -inf; the stop ids only where the output is whole.
bool BatchEngine::mask_disallowed(Sequence& s, std::span<float> logits) {
  const size_t V = logits.size();
  s.mask.assign((V + 31) / 32, 0);
  s.constraint->allowed_tokens(s.mask);
  const bool can_end = s.constraint->can_end();
  for (int id : s.request.stop_ids) {
    const auto t = static_cast<size_t>(id);
    if (t < V) s.mask[t / 32] = can_end ? s.mask[t / 32] | (1u << (t % 32)) : s.mask[t / 32] & ~(1u << (t % 32));
  }
  bool any = false;
  for (size_t w = 0; w < s.mask.size(); ++w) {
    const uint32_t word = s.mask[w];
    any = any || word != 0;
    if (word == ~0u) continue;
    for (size_t t = w * 32; t < std::min(V, w * 32 + 32); ++t)
      if (!((word >> (t % 32)) & 1u)) logits[t] = -std::numeric_limits<float>::infinity();
  }
  return any;
}

void BatchEngine::accept_token(Sequence& s, int token) {
  s.tokens.push_back(token);
  s.result.tokens.push_back(token);
  const bool stop_id = std::ranges::find(s.request.stop_ids, token) != s.request.stop_ids.end();
  if (s.constraint && !stop_id) s.constraint->accept(token);
  const bool whole = s.constraint && !stop_id && s.constraint->must_end();
  if (s.text && !stop_id) s.result.text += s.text->add(token);
  const bool go_on = !on_token || on_token(s.id, token);
  if (!go_on || stop_id || whole || (s.text && s.text->stopped())) finish(s, FinishReason::stop);
  else if (static_cast<int>(s.result.tokens.size()) >= s.request.max_tokens || static_cast<int64_t>(s.tokens.size()) > context_)
    finish(s, FinishReason::length);
}

void BatchEngine::finish(Sequence& s, FinishReason reason) {
  s.result.finish_reason = reason;
  if (s.text) s.result.text += s.text->flush();
  s.text.reset();
  s.finished = true;
  allocator_.release(s.blocks);
  s.blocks.clear();
  s.result.sampler_state = s.sampler->state();
  s.sampler.reset();  // its vocabulary-sized scratch
  s.constraint.reset();
  s.mask = {};
  s.guesses = {};
  if (on_finished) on_finished(s.id);
}

std::vector<BatchResult> generate_batch(model::Llama& llama, const std::vector<BatchRequest>& requests, const EngineOptions& options,
                                        const std::function<void(size_t)>& on_finished) {
  BatchEngine engine(llama, options);
  for (const BatchRequest& r : requests) engine.add(r);
  if (on_finished) engine.on_finished = [&](int id) { on_finished(static_cast<size_t>(id)); };
  while (engine.step()) {
  }
  std::vector<BatchResult> results;
  for (size_t i = 0; i < requests.size(); ++i) results.push_back(engine.result(static_cast<int>(i)));
  return results;
}

}  // namespace tpcli::engine

// tpcli::engine — the batched engine: many sequences through one inference model, each step one
// forward over the mesh for all of them.
//
// KV pool: fixed blocks of `block_size` positions (PagedAttention's idea); a sequence holds a list
// of blocks, so sequences of any lengths share one pool (Llama::new_kv_pool) without a per-sequence
// seq_len allocation. Full blocks are kept for their tokens: a prompt that starts like an earlier
// one (a shared system prompt, a chat's earlier turns) reuses them and prefills only the rest
// (engine/kv_block_allocator.h). A prompt whose blocks another sequence is computing now waits for
// them instead of computing them again (the n choices of one prompt).
//
// A step: every running sequence's next row (a decode token), then chunks of prompts, up to
// `step_tokens` rows; sequences that finish (a stop id, a stop string, max_tokens, the context's
// end, or on_token saying so) leave and waiting ones join (continuous batching). When the pool has no
// block for a running sequence, the newest running sequence is preempted: its blocks go back to
// the pool and it is prefilled again (its prompt and what it generated) when it is readmitted.
//
// Batch invariance: a request's logits and tokens do not depend on what else runs, on where its
// blocks lie, on how its prompt was chunked, on preemption or on prefix sharing: every row is
// computed as forward() computes it alone (Llama::step), and its sampler is its own (seeded by the
// request).
//
// A collective over the model's groups: every device makes the same calls with the same requests
// (scheduling is deterministic) and gets the same results.
//
// Speculation: a decoding sequence may add guesses of its next tokens (prompt lookup, or the
// engine's `guess` function) as more rows of its step. Row j's logits are those plain decoding
// computes after the sequence's tokens and the first j guesses (the rows keep decode's bits), so
// the sequence picks its next token from row 0 as always, and as long as each pick equals the
// guess fed after it, goes on to pick from the next row: each right guess is a token for the price
// of a row. Picks are made one at a time by the request's own sampler, greedy or sampled, with
// its penalties and grammar, so the tokens are those of plain decoding, bit for bit, seed for
// seed. Rows after the first wrong guess are dropped (their positions are written again later).
//
// Text: an engine given a tokenizer detokenizes each sequence as it goes (text/text_stream.h) and
// matches its stop strings there, on every device alike: a sequence ends at the step whose token
// completes a stop string, and its text ends before it.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/kv_block_allocator.h"
#include "engine/prompt_lookup.h"
#include "engine/sampling_params.h"
#include "engine/token_constraint.h"
#include "model/llama.h"

namespace tpcli::text {
class TokenizerInterface;
}

namespace tpcli::engine {

class Sampler;

// Why a sequence ended. Named as OpenAI's finish_reason only where text or JSON is written
// (finish_reason_name).
enum class FinishReason {
  stop,       // a stop id, or on_token said so
  length,     // max_tokens, or the context's end
  cancelled,  // cancel(), or a server shutting down
  error,      // its logits were not finite (BatchResult::error says where); the others go on
};
std::string_view finish_reason_name(FinishReason reason);  // "stop", "length", "cancelled", "error"

struct BatchRequest {
  std::vector<int> prompt;     // token ids, fed as they are (at least one)
  int max_tokens = 256;        // generated tokens at most
  float temperature = 1.0f;    // 0: greedy
  float topp = 0.9f;
  SamplingParams sampling;     // top_k, min_p, penalties, logit_bias (engine/sampling_params.h: their order)
  uint64_t seed = 1;           // the request's sampler (>= 1)
  std::vector<int> stop_ids;   // generation ends after one of these (it is kept in the tokens, not in the text)
  std::vector<std::string> stop;  // stop strings: generation ends at the token whose text completes one
                                  // (the text is cut before it); needs the engine's tokenizer
  TokenConstraintFactory constraint;  // a grammar the output must follow (engine/token_constraint.h); empty: none
  int guesses = -1;            // guessed tokens checked per step at most (-1: the engine's Speculation::guesses; 0: none)
  bool logits = false;         // on_logits sees this sequence's logits (log-probabilities); without, a
                               // greedy sequence's logits stay split (only each device's best moves)
                               // unless its logit_bias or penalties change them
};

struct BatchResult {
  std::vector<int> tokens;     // generated
  FinishReason finish_reason = FinishReason::length;  // once finished
  std::string error;           // with FinishReason::error
  // With the engine's tokenizer: the generated text that is final so far (stop ids left out, cut
  // before a stop string); an end that may still change (an unfinished UTF-8 character, the start
  // of a stop string) is held back until the sequence finishes.
  std::string text;
  int cached_tokens = 0;       // prompt tokens whose keys and values came from the pool (prefix sharing)
  uint64_t sampler_state = 0;  // the sampler's state as the sequence finished: seeding a request with
                               // it continues the same random stream (a chat's next turn)
};

struct Speculation {
  int guesses = 0;      // tokens a decoding sequence guesses and checks per step at most (0: none)
  PromptLookup lookup;  // where the guesses come from when the engine has no `guess` function
};

struct EngineOptions {
  int parallel = 16;        // running sequences at most
  int block_size = 16;      // positions per KV block
  int kv_blocks = 0;        // blocks in the pool; 0: from kv_memory
  int64_t kv_memory = 0;    // bytes of pool per device; 0: `parallel` whole contexts, within an eighth of memory
  nn::KvDtype kv_dtype = nn::KvDtype::F32;  // the pool's elements: bf16 or f16 hold twice the positions in kv_memory
  int step_tokens = 512;    // rows per step at most (at least `parallel`): decode rows first, then prompt chunks
  // Prompt rows per step at most while some sequence decodes (0: step_tokens). A server keeps it
  // small so a prompt arriving does not stall the streams decoding (their inter-token latency);
  // with nothing decoding a prompt still takes the whole step.
  int busy_prefill_tokens = 0;
  bool prefix_sharing = true;
  Speculation speculation;
};

struct EngineStats {
  int64_t steps = 0, rows = 0;
  int64_t cached_tokens = 0;  // prompt tokens reused from the pool
  int64_t preemptions = 0;
  int64_t guessed = 0, guessed_right = 0;  // speculation: guesses checked, and those that were the token picked
};

class BatchEngine {
 public:
  // `tokenizer` (may be null: no text, no stop strings) must outlive the engine.
  BatchEngine(model::Llama& llama, const EngineOptions& options, const text::TokenizerInterface* tokenizer = nullptr);
  ~BatchEngine();

  // Queues a request (checked here: a bad one throws before anything runs); returns its id, 0, 1, ...
  int add(BatchRequest request);
  // One forward over the mesh for the next rows; false when nothing was left to run.
  bool step();
  bool idle() const { return running_.empty() && waiting_.empty(); }
  const BatchResult& result(int id) const;
  // Ends a waiting or running sequence now (cancelled): its blocks go back to the pool (a client
  // that left). Nothing for one already finished or forgotten, or an id never given: a cancel may
  // cross the sequence's end on its way from another thread. Every device must cancel at the same point.
  void cancel(int id);
  // Frees a finished sequence's tokens and result (a server runs for ever); result(id) throws after.
  void forget(int id);

  // Called on every device after each sampled token (its text is in result(id).text); false ends
  // the sequence (stop). Must answer the same on every device.
  std::function<bool(int id, int token)> on_token;
  std::function<void(int id)> on_finished;
  // The logits [V] a sequence's next token is sampled from, before sampling and before its
  // logit_bias and penalties (log-probabilities, as vLLM's raw ones; tests), for the sequences whose request asks (BatchRequest::logits: the same on every device).
  std::function<void(int id, std::span<const float> logits)> on_logits;
  // Guesses of the next tokens of the sequences decoding this step: for each, up to `count`
  // tokens to follow `tokens` (its prompt and output so far) into `guesses`. Null: prompt lookup
  // (Speculation::lookup). Must answer the same on every device; what it answers changes no token,
  // only how many rows a step runs.
  struct GuessRequest {
    int id = 0;
    std::span<const int> tokens;
    int count = 0;
    std::vector<int> guesses;
  };
  std::function<void(std::span<GuessRequest> sequences)> guess;

  const EngineStats& stats() const { return stats_; }
  int kv_blocks() const { return allocator_.total(); }
  int kv_blocks_free() const { return allocator_.free(); }
  int64_t kv_pool_bytes() const { return pool_.bytes(); }  // this device's
  int context() const { return context_; }                // positions a sequence may reach
  int running() const { return static_cast<int>(running_.size()); }
  int waiting() const { return static_cast<int>(waiting_.size()); }

 private:
  struct Sequence;
  struct Planned {
    int id = 0;
    int64_t rows = 0;
  };
  void plan_running(std::vector<Planned>& plan, int64_t& budget);
  void admit_waiting(std::vector<Planned>& plan, int64_t& budget);
  int64_t reserve(Sequence& s, int64_t rows, std::vector<Planned>* preempt_for);
  void add_guesses(std::vector<Planned>& plan, int64_t& budget);
  int guess_count(const Sequence& s, int64_t budget) const;
  void take_rows(Sequence& s, size_t first, bool greedy, std::span<const int> greedy_tokens, std::span<float>& logits);
  void pick(Sequence& s, size_t row, bool greedy, std::span<const int> greedy_tokens, std::span<float>& logits);
  void after_guesses(Sequence& s, int guessed, int right);
  bool awaits_shared_prefill(const Sequence& s) const;
  void preempt_newest(std::vector<Planned>& plan);
  void run(const std::vector<Planned>& plan);
  void advance(Sequence& s, int64_t rows);
  void take_token(Sequence& s, float* logits);  // checks and samples the sequence's next token
  bool mask_disallowed(Sequence& s, std::span<float> logits);  // false: the constraint allows nothing
  void accept_token(Sequence& s, int token);    // the sequence's next token: its text, its end
  void finish(Sequence& s, FinishReason reason);
  Sequence& sequence(int id) const;
  bool known(int id) const;

  model::Llama& llama_;
  EngineOptions options_;
  const text::TokenizerInterface* tokenizer_;
  model::Llama::KvCache pool_;
  KvBlockAllocator allocator_;
  int context_ = 0;
  std::vector<std::unique_ptr<Sequence>> sequences_;  // by id
  std::vector<int> running_;                          // ids, in admission order
  std::deque<int> waiting_;                           // ids, the next to admit first
  EngineStats stats_;
};

// The KV pool's blocks for these options, the weights split by `plans` (every tensor device's) over
// `devices` devices in all: kv_blocks, else kv_memory over the largest device's block of kv_dtype (uneven kv heads:
// every device gets the same blocks), else `parallel` whole contexts within an eighth of the
// machine's memory. std::invalid_argument when kv_memory holds no block, or when kv_blocks or
// kv_memory ask for a pool that `devices` devices cannot hold in this machine's physical memory
// (naming the flag: --kv-blocks, --kv-memory).
int kv_pool_blocks(const model::LlamaConfig& config, const std::vector<model::ShardPlan>& plans, int devices, const EngineOptions& options);

// Every request through a BatchEngine to the end; results in request order. on_finished(i) is
// called as request i finishes.
std::vector<BatchResult> generate_batch(model::Llama& llama, const std::vector<BatchRequest>& requests, const EngineOptions& options,
                                        const std::function<void(size_t)>& on_finished = {});

}  // namespace tpcli::engine

// tpcli::serve — the batched engine running for ever on every device, fed by HTTP requests.
//
// Device 0 leads: before each step it takes the requests that arrived and the cancellations, and
// broadcasts them over the mesh's world group, so every device adds and cancels the same sequences
// at the same step and makes the same schedule (the engine is deterministic). A zmq or MPI process
// without device 0 serves no HTTP; its devices only follow. While nothing runs, the leader waits
// for a request up to IDLE_WAIT and broadcasts an empty list, so followers never wait long.
//
// Every device's engine detokenizes and matches stop strings (engine/batch_engine.h), so a stop
// string ends its sequence at the step that produced it, on every device. Only the leader reports:
// each request's tokens and text (with their log-probabilities when asked) go to its
// RequestStream, which an HTTP handler reads. A request is given back (engine.forget) as soon
// as it finishes, so a server that runs for days holds only what runs.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/batch_engine.h"

namespace tpcli::dist {
class Device;
}

namespace tpcli::serve {

struct TokenLogprob {
  int token = 0;
  float logprob = 0;
};

struct TokenEvent {
  int token = 0;
  std::string text;                        // the answer's text this token made final (often "" while held back)
  float logprob = 0;                       // when asked
  std::vector<TokenLogprob> alternatives;  // the top_logprobs most likely, when asked
};

struct Finish {
  engine::FinishReason reason = engine::FinishReason::stop;
  std::string error;  // with FinishReason::error
  std::string text;   // the answer's text held back until its end
  int prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
};

// One request's channel from the leader to its HTTP handler.
class RequestStream {
 public:
  // Waits up to `timeout` for tokens or the end; moves the tokens into `out`. The Finish, once
  // it came (after the last token).
  std::optional<Finish> wait(std::vector<TokenEvent>& out, std::chrono::milliseconds timeout);

 private:
  friend class EngineService;
  engine::BatchRequest request_;
  std::string grammar_;    // GBNF the answer follows ("": none), compiled on every device
  int top_logprobs_ = -1;  // -1: no log-probabilities
  std::chrono::steady_clock::time_point arrived_, last_token_;
  int engine_id_ = -1;     // -1: not yet in the engine
  size_t text_sent_ = 0;   // bytes of the engine's text already in events
  bool cancel_asked_ = false;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::vector<TokenEvent> events_;
  std::optional<Finish> finish_;
};

// Latency histograms and counters, for /metrics.
struct Histogram {
  std::vector<double> bounds;    // upper bounds, seconds
  std::vector<uint64_t> counts;  // per bound, then +Inf (not cumulative)
  double sum = 0;
  uint64_t total = 0;
  explicit Histogram(std::vector<double> b) : bounds(std::move(b)), counts(bounds.size() + 1) {}
  void add(double seconds);
};

struct ServiceSnapshot {
  int running = 0, waiting = 0, queued = 0;  // queued: arrived, not yet broadcast
  int kv_blocks = 0, kv_blocks_free = 0, context = 0;
  int64_t prompt_tokens = 0, generation_tokens = 0, cached_tokens = 0, preemptions = 0, steps = 0;
  int64_t failed_requests = 0;  // ended by the engine with an error (non-finite logits), the server going on
  double tokens_per_second = 0;  // generated, over the last few seconds
  Histogram time_to_first_token{{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};
  Histogram inter_token_latency{{0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1, 2.5}};
};

// A GBNF grammar's constraint for one tokenizer (engine/grammar_constraint.h); it throws for a
// grammar that does not compile. Every device compiles a request's grammar itself.
using GrammarCompiler = std::function<engine::TokenConstraintFactory(const std::string& gbnf)>;

struct ServiceOptions {
  engine::EngineOptions engine;
  int max_queue = 256;  // requests waiting beyond `engine.parallel` running; more get 429
  GrammarCompiler compile_grammar;  // unset: requests with a grammar are refused by the engine
};

class EngineService {
 public:
  static constexpr std::chrono::milliseconds IDLE_WAIT{50};

  explicit EngineService(ServiceOptions options);

  // ---- HTTP side ----
  // Blocks until the leader's engine exists (or the devices failed: false).
  bool wait_ready();
  int context() const { return context_; }
  // Queues a request (its answer following `grammar`, GBNF, when not empty); ApiError 429 when the
  // queue is full, 503 while shutting down.
  std::shared_ptr<RequestStream> submit(const engine::BatchRequest& request, int top_logprobs, const std::string& grammar = {});
  // Ends a request (a client that left): its blocks are freed at the next step.
  void cancel(const std::shared_ptr<RequestStream>& stream);
  ServiceSnapshot snapshot() const;
  int in_flight() const;
  // Refuses new requests from now on (503).
  void close();
  // Ends every request still running (cancelled), then the device loops.
  void shutdown();
  // The devices failed: HTTP handlers get 503 and the loops are gone.
  void fail(const std::string& why);

  // ---- device side: every device of the mesh runs this until shutdown ----
  // `tokenizer`: the engine's, for the answers' text and stop strings (the same on every device).
  void run_device(model::Llama& llama, dist::Device& device, const text::TokenizerInterface& tokenizer);

 private:
  struct Commands;
  Commands take_commands(bool idle);
  void lead(model::Llama& llama, dist::Device& device, const text::TokenizerInterface& tokenizer);
  void follow(model::Llama& llama, dist::Device& device, const text::TokenizerInterface& tokenizer);
  void report_token(int id, int token, const std::string& text);
  void report_logits(int id, std::span<const float> logits);
  void report_finished(engine::BatchEngine& engine, int id);
  void record_step(const engine::BatchEngine& engine);
  static void end(RequestStream& s, Finish f);  // the stream's last event (the first end wins)

  ServiceOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable arrived_, ready_;
  std::deque<std::shared_ptr<RequestStream>> queue_;       // submitted, not yet broadcast
  std::vector<int> cancels_;                               // engine ids to cancel at the next step
  std::map<int, std::shared_ptr<RequestStream>> running_;  // engine id -> stream (leader's view)
  bool ready_flag_ = false, closed_ = false, shutdown_ = false;
  std::optional<std::string> failed_;
  int context_ = 0;
  ServiceSnapshot stats_;
  std::deque<std::pair<std::chrono::steady_clock::time_point, int64_t>> rate_;  // (time, generation_tokens)
  std::vector<float> logits_scratch_;                                          // the leader's, for log-probabilities
};

}  // namespace tpcli::serve

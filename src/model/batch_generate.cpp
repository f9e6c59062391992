// tpcli::model — continuous batching (see batch_generate.h).
#include "model/batch_generate.h"

#include <algorithm>
#include <memory>
#include <stdexcept>

#include "model/sampler.h"

namespace tpcli::model {

namespace {

// One request while it runs: its cache, its sampler, where it is.
struct Running {
  size_t request = 0;
  Llama::KvCache cache;
  std::unique_ptr<Sampler> sampler;
  int next = 0;  // the token to feed next
  int pos = 0;   // its position
};

void check_request(const BatchRequest& r, size_t i, int seq_len) {
  if (r.prompt.empty() || static_cast<int64_t>(r.prompt.size()) > seq_len)
    throw std::invalid_argument("request " + std::to_string(i) + ": a prompt of " + std::to_string(r.prompt.size()) +
                                " tokens must hold 1 to seq_len = " + std::to_string(seq_len));
  if (r.max_tokens < 1) throw std::invalid_argument("request " + std::to_string(i) + ": max_tokens must be >= 1");
}

}  // namespace

std::vector<BatchResult> generate_batch(Llama& llama, const std::vector<BatchRequest>& requests, int parallel,
                                        const std::function<void(size_t)>& on_finished) {
  if (parallel < 1) throw std::invalid_argument("generate_batch: parallel must be >= 1");
  const int S = llama.config().seq_len, V = llama.config().vocab_size;
  for (size_t i = 0; i < requests.size(); ++i) check_request(requests[i], i, S);
  std::vector<BatchResult> results(requests.size());
  std::vector<Running> running;
  size_t admitted = 0;
  // Takes the sampled token of request `r` (logits [V], overwritten); false when it finished.
  auto take = [&](Running& run, float* logits) {
    const BatchRequest& q = requests[run.request];
    BatchResult& out = results[run.request];
    require_finite_logits({logits, static_cast<size_t>(V)}, run.pos);
    const int token = run.sampler->sample({logits, static_cast<size_t>(V)});
    out.tokens.push_back(token);
    const bool stop = std::ranges::find(q.stop_ids, token) != q.stop_ids.end();
    const bool length = static_cast<int>(out.tokens.size()) >= q.max_tokens || run.pos + 1 >= S;
    if (!stop && !length) {
      run.next = token;
      ++run.pos;
      return true;
    }
    out.finish_reason = stop ? "stop" : "length";
    if (on_finished) on_finished(run.request);
    return false;
  };
  while (admitted < requests.size() || !running.empty()) {
    while (static_cast<int>(running.size()) < parallel && admitted < requests.size()) {  // join: prefill alone
      const BatchRequest& q = requests[admitted];
      Running run{admitted++, llama.new_kv_cache(), std::make_unique<Sampler>(V, q.temperature, q.topp, q.seed), 0,
                  static_cast<int>(q.prompt.size()) - 1};
      Llama::KvCache* cache = &run.cache;
      std::vector<float> logits = llama.prefill_batch({&q.prompt, 1}, {&cache, 1});
      if (take(run, logits.data())) running.push_back(std::move(run));
    }
    if (running.empty()) continue;
    std::vector<int> tokens, positions;
    std::vector<Llama::KvCache*> caches;
    for (Running& run : running) {
      tokens.push_back(run.next);
      positions.push_back(run.pos);
      caches.push_back(&run.cache);
    }
    std::vector<float> logits = llama.decode_batch(tokens, positions, caches);  // [B, V]
    std::vector<Running> still;
    for (size_t b = 0; b < running.size(); ++b)
      if (take(running[b], logits.data() + b * static_cast<size_t>(V))) still.push_back(std::move(running[b]));
    running = std::move(still);
  }
  return results;
}

}  // namespace tpcli::model

// tpcli::serve — the engine behind the server (see engine_service.h).
#include "serve/engine_service.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <span>

#include "distributed/runtime.h"
#include "serve/api_request.h"

namespace tpcli::serve {

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::chrono::seconds RATE_WINDOW{5};

// The commands of one step, as int32 words: ADD max_tokens temperature top_p seed_lo seed_hi
// n_prompt prompt... n_stop_ids stop_ids... n_stop (bytes words...)..., CANCEL id, SHUTDOWN. A
// stop string is its byte count, then its bytes four to a word.
enum Word : int32_t { ADD = 1, CANCEL = 2, SHUTDOWN = 3 };

int32_t bits_of(float x) {
  int32_t w;
  std::memcpy(&w, &x, sizeof w);
  return w;
}
float float_of(int32_t w) {
  float x;
  std::memcpy(&x, &w, sizeof x);
  return x;
}

void encode_add(const model::BatchRequest& r, std::vector<int32_t>& words) {
  words.insert(words.end(), {ADD, r.max_tokens, bits_of(r.temperature), bits_of(r.topp), static_cast<int32_t>(r.seed & 0xffffffffu),
                             static_cast<int32_t>(r.seed >> 32), static_cast<int32_t>(r.prompt.size())});
  words.insert(words.end(), r.prompt.begin(), r.prompt.end());
  words.push_back(static_cast<int32_t>(r.stop_ids.size()));
  words.insert(words.end(), r.stop_ids.begin(), r.stop_ids.end());
  words.push_back(static_cast<int32_t>(r.stop.size()));
  for (const std::string& s : r.stop) {
    words.push_back(static_cast<int32_t>(s.size()));
    const size_t at = words.size();
    words.resize(at + (s.size() + 3) / 4, 0);
    std::memcpy(words.data() + at, s.data(), s.size());
  }
}

model::BatchRequest decode_add(std::span<const int32_t> words, size_t& at) {
  model::BatchRequest r;
  r.max_tokens = words[at++];
  r.temperature = float_of(words[at++]);
  r.topp = float_of(words[at++]);
  r.seed = static_cast<uint32_t>(words[at]) | static_cast<uint64_t>(static_cast<uint32_t>(words[at + 1])) << 32;
  at += 2;
  const auto take = [&](std::vector<int>& out) {
    const auto n = static_cast<size_t>(words[at++]);
    out.assign(words.begin() + static_cast<std::ptrdiff_t>(at), words.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
  };
  take(r.prompt);
  take(r.stop_ids);
  r.stop.resize(static_cast<size_t>(words[at++]));
  for (std::string& s : r.stop) {
    s.resize(static_cast<size_t>(words[at++]));
    std::memcpy(s.data(), words.data() + at, s.size());
    at += (s.size() + 3) / 4;
  }
  return r;
}

// Device 0's words to every device, carried as float bit patterns: one broadcast of their count
// and the first INLINE_WORDS (a step without arrivals sends nothing more: one collective per
// step), a second for the rest.
constexpr size_t INLINE_WORDS = 31;

std::vector<int32_t> broadcast_words(dist::Device& device, std::vector<int32_t> words) {
  dist::Group& world = device.world();
  std::array<float, INLINE_WORDS + 1> head{};
  head[0] = float_of(static_cast<int32_t>(words.size()));
  std::memcpy(head.data() + 1, words.data(), std::min(words.size(), INLINE_WORDS) * sizeof(int32_t));
  world.broadcast(head, 0);
  const auto count = static_cast<size_t>(bits_of(head[0]));
  words.resize(count);
  std::memcpy(words.data(), head.data() + 1, std::min(count, INLINE_WORDS) * sizeof(int32_t));
  if (count > INLINE_WORDS) {
    std::vector<float> rest(count - INLINE_WORDS);
    std::memcpy(rest.data(), words.data() + INLINE_WORDS, rest.size() * sizeof(float));
    world.broadcast(rest, 0);
    std::memcpy(words.data() + INLINE_WORDS, rest.data(), rest.size() * sizeof(float));
  }
  return words;
}

// Applies one step's commands on a device's engine; `added(k, id)` for the k-th ADD (id -1: the
// engine refused it, as every device does). False at SHUTDOWN.
template <class Added>
bool apply(model::BatchEngine& engine, std::span<const int32_t> words, Added&& added) {
  size_t k = 0;
  for (size_t at = 0; at < words.size();) {
    switch (words[at++]) {
      case ADD: {
        model::BatchRequest r = decode_add(words, at);
        int id = -1;
        try {
          id = engine.add(std::move(r));
        } catch (const std::invalid_argument&) {
        }
        added(k++, id);
        break;
      }
      case CANCEL: engine.cancel(words[at++]); break;
      default: return false;
    }
  }
  return true;
}

}  // namespace

void Histogram::add(double seconds) {
  const size_t at = static_cast<size_t>(std::lower_bound(bounds.begin(), bounds.end(), seconds) - bounds.begin());
  ++counts[at];
  sum += seconds;
  ++total;
}

void EngineService::end(RequestStream& s, Finish f) {
  std::lock_guard lock(s.mutex_);
  if (!s.finish_) s.finish_ = std::move(f);
  s.ready_.notify_all();
}

struct EngineService::Commands {
  std::vector<int32_t> words;
  std::vector<std::shared_ptr<RequestStream>> added;  // the ADDs' streams, in order
};

std::optional<Finish> RequestStream::wait(std::vector<TokenEvent>& out, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  ready_.wait_for(lock, timeout, [&] { return !events_.empty() || finish_; });
  for (TokenEvent& e : events_) out.push_back(std::move(e));
  events_.clear();
  return finish_;
}

EngineService::EngineService(ServiceOptions options) : options_(std::move(options)) {}

bool EngineService::wait_ready() {
  std::unique_lock lock(mutex_);
  ready_.wait(lock, [&] { return ready_flag_ || failed_; });
  return ready_flag_ && !failed_;
}

std::shared_ptr<RequestStream> EngineService::submit(const model::BatchRequest& request, int top_logprobs) {
  auto s = std::make_shared<RequestStream>();
  s->request_ = request;
  s->top_logprobs_ = top_logprobs;
  s->arrived_ = Clock::now();
  std::lock_guard lock(mutex_);
  if (failed_ || closed_) throw ApiError(503, "The server is shutting down.", "", "unavailable", "server_error");
  if (static_cast<int64_t>(queue_.size() + running_.size()) >= int64_t{options_.engine.parallel} + options_.max_queue)
    throw ApiError(429, "The server is busy: " + std::to_string(queue_.size() + running_.size()) + " requests are waiting or running.",
                   "", "rate_limit_exceeded", "rate_limit_error");
  queue_.push_back(s);
  arrived_.notify_all();
  return s;
}

void EngineService::cancel(const std::shared_ptr<RequestStream>& stream) {
  std::lock_guard lock(mutex_);
  {
    std::lock_guard own(stream->mutex_);
    if (stream->finish_ || stream->cancel_asked_) return;
    stream->cancel_asked_ = true;
  }
  if (stream->engine_id_ >= 0) {
    cancels_.push_back(stream->engine_id_);
    arrived_.notify_all();
  } else if (std::erase(queue_, stream)) {  // never reached the engine
    end(*stream, {model::FinishReason::cancelled, {}, {}, static_cast<int>(stream->request_.prompt.size())});
  }  // else on its way to the engine: cancelled once it has an id (lead)
}

int EngineService::in_flight() const {
  std::lock_guard lock(mutex_);
  return static_cast<int>(queue_.size() + running_.size());
}

ServiceSnapshot EngineService::snapshot() const {
  std::lock_guard lock(mutex_);
  ServiceSnapshot s = stats_;
  s.queued = static_cast<int>(queue_.size());
  s.context = context_;
  return s;
}

void EngineService::close() {
  std::lock_guard lock(mutex_);
  closed_ = true;
}

void EngineService::shutdown() {
  std::lock_guard lock(mutex_);
  closed_ = shutdown_ = true;
  arrived_.notify_all();
}

void EngineService::fail(const std::string& why) {
  std::lock_guard lock(mutex_);
  failed_ = why;
  closed_ = true;
  for (auto& [id, s] : running_) end(*s, {model::FinishReason::error, why});
  for (auto& s : queue_) end(*s, {model::FinishReason::error, why});
  running_.clear();
  queue_.clear();
  ready_.notify_all();
}

EngineService::Commands EngineService::take_commands(bool idle) {
  std::unique_lock lock(mutex_);
  if (idle) arrived_.wait_for(lock, IDLE_WAIT, [&] { return !queue_.empty() || !cancels_.empty() || shutdown_; });
  Commands c;
  if (shutdown_) {
    c.words.push_back(SHUTDOWN);
    return c;
  }
  for (const int id : cancels_)  // one that finished since it was asked is gone from running_ (and from the engine)
    if (running_.contains(id)) c.words.insert(c.words.end(), {CANCEL, id});
  cancels_.clear();
  for (; !queue_.empty(); queue_.pop_front()) {
    encode_add(queue_.front()->request_, c.words);
    c.added.push_back(queue_.front());
  }
  return c;
}

void EngineService::run_device(model::Llama& llama, dist::Device& device, const model::TokenizerInterface& tokenizer) {
  if (device.rank() == 0) lead(llama, device, tokenizer);
  else follow(llama, device, tokenizer);
}

void EngineService::follow(model::Llama& llama, dist::Device& device, const model::TokenizerInterface& tokenizer) {
  model::BatchEngine engine(llama, options_.engine, &tokenizer);
  std::vector<int> finished;
  engine.on_finished = [&](int id) { finished.push_back(id); };
  while (apply(engine, broadcast_words(device, {}), [](size_t, int) {})) {
    if (!engine.idle()) engine.step();
    for (const int id : finished) engine.forget(id);
    finished.clear();
  }
}

void EngineService::lead(model::Llama& llama, dist::Device& device, const model::TokenizerInterface& tokenizer) {
  model::BatchEngine engine(llama, options_.engine, &tokenizer);
  std::vector<int> finished;
  engine.on_logits = [&](int id, std::span<const float> logits) { report_logits(id, logits); };
  engine.on_token = [&](int id, int token) {
    report_token(id, token, engine.result(id).text);
    return true;
  };
  engine.on_finished = [&](int id) {
    report_finished(engine, id);
    finished.push_back(id);
  };
  {
    std::lock_guard lock(mutex_);
    context_ = engine.context();
    ready_flag_ = true;
    ready_.notify_all();
  }
  for (;;) {
    Commands c = take_commands(engine.idle());
    broadcast_words(device, c.words);
    const bool go_on = apply(engine, c.words, [&](size_t k, int id) {
      const std::shared_ptr<RequestStream>& s = c.added[k];
      std::lock_guard lock(mutex_);
      if (id < 0) {
        end(*s, {model::FinishReason::error, "the engine refused the request"});
        return;
      }
      s->engine_id_ = id;
      running_[id] = s;
      stats_.prompt_tokens += static_cast<int64_t>(s->request_.prompt.size());
      if (s->cancel_asked_) cancels_.push_back(id);
    });
    if (!go_on) break;
    if (!engine.idle()) engine.step();
    for (const int id : finished) engine.forget(id);
    finished.clear();
    record_step(engine);
  }
  std::lock_guard lock(mutex_);  // what still runs ends here
  for (auto& [id, s] : running_) end(*s, {model::FinishReason::cancelled});
  running_.clear();
}

void EngineService::report_logits(int id, std::span<const float> logits) {
  std::lock_guard lock(mutex_);
  const auto it = running_.find(id);
  if (it != running_.end() && it->second->top_logprobs_ >= 0) logits_scratch_.assign(logits.begin(), logits.end());
}

void EngineService::report_token(int id, int token, const std::string& text) {
  std::lock_guard lock(mutex_);
  const auto it = running_.find(id);
  if (it == running_.end()) return;
  RequestStream& s = *it->second;
  TokenEvent e{token, text.substr(s.text_sent_)};
  s.text_sent_ = text.size();
  if (s.top_logprobs_ >= 0 && !logits_scratch_.empty()) {  // log-softmax of the raw logits, as OpenAI reports them
    const std::vector<float>& l = logits_scratch_;
    const float top = *std::max_element(l.begin(), l.end());
    double sum = 0;
    for (const float x : l) sum += std::exp(static_cast<double>(x - top));
    const float lse = top + static_cast<float>(std::log(sum));
    e.logprob = l[static_cast<size_t>(token)] - lse;
    std::vector<int> order(l.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
    const size_t k = std::min(order.size(), static_cast<size_t>(s.top_logprobs_));
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                      [&](int a, int b) { return l[static_cast<size_t>(a)] > l[static_cast<size_t>(b)]; });
    for (size_t i = 0; i < k; ++i) e.alternatives.push_back({order[i], l[static_cast<size_t>(order[i])] - lse});
  }
  const Clock::time_point now = Clock::now();
  const bool first = s.last_token_ == Clock::time_point{};
  (first ? stats_.time_to_first_token : stats_.inter_token_latency)
      .add(std::chrono::duration<double>(now - (first ? s.arrived_ : s.last_token_)).count());
  s.last_token_ = now;
  ++stats_.generation_tokens;
  std::lock_guard own(s.mutex_);
  s.events_.push_back(std::move(e));
  s.ready_.notify_all();
}

void EngineService::report_finished(model::BatchEngine& engine, int id) {
  std::lock_guard lock(mutex_);
  const auto it = running_.find(id);
  if (it == running_.end()) return;
  const model::BatchResult& r = engine.result(id);
  RequestStream& s = *it->second;
  if (r.finish_reason == model::FinishReason::error) ++stats_.failed_requests;
  end(s, {r.finish_reason, r.error, r.text.substr(s.text_sent_), static_cast<int>(s.request_.prompt.size()), r.cached_tokens,
          static_cast<int>(r.tokens.size())});
  running_.erase(it);
}

void EngineService::record_step(const model::BatchEngine& engine) {
  const Clock::time_point now = Clock::now();
  std::lock_guard lock(mutex_);
  const model::EngineStats& e = engine.stats();
  stats_.running = engine.running();
  stats_.waiting = engine.waiting();
  stats_.kv_blocks = engine.kv_blocks();
  stats_.kv_blocks_free = engine.kv_blocks_free();
  stats_.cached_tokens = e.cached_tokens;
  stats_.preemptions = e.preemptions;
  stats_.steps = e.steps;
  rate_.emplace_back(now, stats_.generation_tokens);
  while (rate_.size() > 2 && now - rate_.front().first > RATE_WINDOW) rate_.pop_front();
  const double seconds = std::chrono::duration<double>(now - rate_.front().first).count();
  stats_.tokens_per_second = seconds > 0 ? static_cast<double>(stats_.generation_tokens - rate_.front().second) / seconds : 0;
}

}  // namespace tpcli::serve

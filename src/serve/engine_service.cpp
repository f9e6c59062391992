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

// The commands of one step, as bytes: a tag, then the command's fields in their own types (host
// byte order: every device runs the same binary):
//   ADD max_tokens:i32 temperature:f32 top_p:f32 seed:u64 n_prompt:i32 prompt:i32... n_stop_ids:i32 stop_ids:i32...
//       n_stop:i32 (length:i32 bytes...)...   (the stop strings)   logits:u8 (log-probabilities wanted)
//       top_k:i32 min_p:f32 presence_penalty:f32 frequency_penalty:f32 repetition_penalty:f32
//       n_bias:i32 (id:i32 bias:f32)...   (logit_bias)
//   CANCEL id:i32
//   SHUTDOWN
enum class Command : uint8_t { ADD = 1, CANCEL = 2, SHUTDOWN = 3 };
static_assert(sizeof(int) == sizeof(int32_t), "token ids travel as int32");

void put_raw(std::vector<std::byte>& bytes, const void* data, size_t n) {
  const size_t at = bytes.size();
  bytes.resize(at + n);
  if (n > 0) std::memcpy(bytes.data() + at, data, n);
}

template <class T>
void put(std::vector<std::byte>& bytes, const T& value) {
  put_raw(bytes, &value, sizeof value);
}

void put_ids(std::vector<std::byte>& bytes, const std::vector<int>& ids) {
  put(bytes, static_cast<int32_t>(ids.size()));
  put_raw(bytes, ids.data(), ids.size() * sizeof(int));
}

void put_strings(std::vector<std::byte>& bytes, const std::vector<std::string>& strings) {
  put(bytes, static_cast<int32_t>(strings.size()));
  for (const std::string& s : strings) {
    put(bytes, static_cast<int32_t>(s.size()));
    put_raw(bytes, s.data(), s.size());
  }
}

// Reads the fields put() wrote, in order.
class CommandReader {
 public:
  explicit CommandReader(std::span<const std::byte> bytes) : bytes_(bytes) {}
  bool done() const { return at_ >= bytes_.size(); }
  template <class T>
  T take() {
    T value;
    std::memcpy(&value, bytes_.data() + at_, sizeof value);
    at_ += sizeof value;
    return value;
  }
  std::vector<int> take_ids() {
    std::vector<int> ids(static_cast<size_t>(take<int32_t>()));
    if (!ids.empty()) std::memcpy(ids.data(), bytes_.data() + at_, ids.size() * sizeof(int));
    at_ += ids.size() * sizeof(int);
    return ids;
  }
  std::vector<std::string> take_strings() {
    std::vector<std::string> strings(static_cast<size_t>(take<int32_t>()));
    for (std::string& s : strings) {
      s.resize(static_cast<size_t>(take<int32_t>()));
      if (!s.empty()) std::memcpy(s.data(), bytes_.data() + at_, s.size());
      at_ += s.size();
    }
    return strings;
  }

 private:
  std::span<const std::byte> bytes_;
  size_t at_ = 0;
};

void put_sampling(std::vector<std::byte>& bytes, const engine::SamplingParams& p) {
  put(bytes, static_cast<int32_t>(p.top_k));
  put(bytes, p.min_p);
  put(bytes, p.presence_penalty);
  put(bytes, p.frequency_penalty);
  put(bytes, p.repetition_penalty);
  put(bytes, static_cast<int32_t>(p.logit_bias.size()));
  for (const auto& [id, bias] : p.logit_bias) {
    put(bytes, static_cast<int32_t>(id));
    put(bytes, bias);
  }
}

engine::SamplingParams take_sampling(CommandReader& in) {
  engine::SamplingParams p;
  p.top_k = in.take<int32_t>();
  p.min_p = in.take<float>();
  p.presence_penalty = in.take<float>();
  p.frequency_penalty = in.take<float>();
  p.repetition_penalty = in.take<float>();
  p.logit_bias.resize(static_cast<size_t>(in.take<int32_t>()));
  for (auto& [id, bias] : p.logit_bias) {
    id = in.take<int32_t>();
    bias = in.take<float>();
  }
  return p;
}

void encode_add(const engine::BatchRequest& r, const std::string& grammar, std::vector<std::byte>& bytes) {
  put(bytes, Command::ADD);
  put(bytes, static_cast<int32_t>(r.max_tokens));
  put(bytes, r.temperature);
  put(bytes, r.topp);
  put(bytes, r.seed);
  put_ids(bytes, r.prompt);
  put_ids(bytes, r.stop_ids);
  put_strings(bytes, r.stop);
  put(bytes, static_cast<uint8_t>(r.logits));
  put_sampling(bytes, r.sampling);
  put_strings(bytes, {grammar});
}

// The request, its constraint compiled from the grammar that came with it.
engine::BatchRequest decode_add(CommandReader& in, const GrammarCompiler& compile_grammar) {
  engine::BatchRequest r;
  r.max_tokens = in.take<int32_t>();
  r.temperature = in.take<float>();
  r.topp = in.take<float>();
  r.seed = in.take<decltype(r.seed)>();
  r.prompt = in.take_ids();
  r.stop_ids = in.take_ids();
  r.stop = in.take_strings();
  r.logits = in.take<uint8_t>() != 0;
  r.sampling = take_sampling(in);
  const std::vector<std::string> grammar = in.take_strings();
  if (grammar.size() != 1) throw std::runtime_error("serve: a malformed ADD command");
  if (!grammar[0].empty()) {
    if (!compile_grammar) throw std::invalid_argument("this server compiles no grammars");
    r.constraint = compile_grammar(grammar[0]);
  }
  return r;
}

// Device 0's command bytes to every device: one broadcast of their count and the first
// INLINE_BYTES (a step without arrivals sends nothing more: one collective per step), a second
// for the rest.
constexpr size_t INLINE_BYTES = 124;

std::vector<std::byte> broadcast_commands(dist::Device& device, std::vector<std::byte> bytes) {
  dist::Group& world = device.world();
  std::array<std::byte, sizeof(uint32_t) + INLINE_BYTES> head{};
  uint32_t count = static_cast<uint32_t>(bytes.size());
  std::memcpy(head.data(), &count, sizeof count);
  if (!bytes.empty()) std::memcpy(head.data() + sizeof count, bytes.data(), std::min(bytes.size(), INLINE_BYTES));
  world.broadcast(std::span<std::byte>(head), 0);
  std::memcpy(&count, head.data(), sizeof count);
  bytes.resize(count);
  if (count > 0) std::memcpy(bytes.data(), head.data() + sizeof count, std::min<size_t>(count, INLINE_BYTES));
  if (count > INLINE_BYTES) world.broadcast(std::span<std::byte>(bytes).subspan(INLINE_BYTES), 0);
  return bytes;
}

// Applies one step's commands on a device's engine; `added(k, id)` for the k-th ADD (id -1: the
// engine refused it, as every device does). False at SHUTDOWN.
template <class Added>
bool apply(engine::BatchEngine& engine, std::span<const std::byte> bytes, const GrammarCompiler& compile_grammar, Added&& added) {
  size_t k = 0;
  for (CommandReader in(bytes); !in.done();) {
    switch (in.take<Command>()) {
      case Command::ADD: {
        int id = -1;
        try {  // a grammar that does not compile is refused on every device alike
          id = engine.add(decode_add(in, compile_grammar));
        } catch (const std::invalid_argument&) {
        }
        added(k++, id);
        break;
      }
      case Command::CANCEL: engine.cancel(in.take<int32_t>()); break;
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
  std::vector<std::byte> bytes;  // the step's commands (see Command)
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

std::shared_ptr<RequestStream> EngineService::submit(const engine::BatchRequest& request, int top_logprobs, const std::string& grammar) {
  auto s = std::make_shared<RequestStream>();
  s->request_ = request;
  s->grammar_ = grammar;
  s->request_.logits = top_logprobs >= 0;  // the engine hands over its logits only then (report_logits)
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
    end(*stream, {engine::FinishReason::cancelled, {}, {}, static_cast<int>(stream->request_.prompt.size())});
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
  for (auto& [id, s] : running_) end(*s, {engine::FinishReason::error, why});
  for (auto& s : queue_) end(*s, {engine::FinishReason::error, why});
  running_.clear();
  queue_.clear();
  ready_.notify_all();
}

EngineService::Commands EngineService::take_commands(bool idle) {
  std::unique_lock lock(mutex_);
  if (idle) arrived_.wait_for(lock, IDLE_WAIT, [&] { return !queue_.empty() || !cancels_.empty() || shutdown_; });
  Commands c;
  if (shutdown_) {
    put(c.bytes, Command::SHUTDOWN);
    return c;
  }
  for (const int id : cancels_)  // one that finished since it was asked is gone from running_ (and from the engine)
    if (running_.contains(id)) {
      put(c.bytes, Command::CANCEL);
      put(c.bytes, static_cast<int32_t>(id));
    }
  cancels_.clear();
  for (; !queue_.empty(); queue_.pop_front()) {
    encode_add(queue_.front()->request_, queue_.front()->grammar_, c.bytes);
    c.added.push_back(queue_.front());
  }
  return c;
}

void EngineService::run_device(model::Llama& llama, dist::Device& device, const text::TokenizerInterface& tokenizer) {
  if (device.rank() == 0) lead(llama, device, tokenizer);
  else follow(llama, device, tokenizer);
}

void EngineService::follow(model::Llama& llama, dist::Device& device, const text::TokenizerInterface& tokenizer) {
  engine::BatchEngine engine(llama, options_.engine, &tokenizer);
  std::vector<int> finished;
  engine.on_finished = [&](int id) { finished.push_back(id); };
  while (apply(engine, broadcast_commands(device, {}), options_.compile_grammar, [](size_t, int) {})) {
    if (!engine.idle()) engine.step();
    for (const int id : finished) engine.forget(id);
    finished.clear();
  }
}

void EngineService::lead(model::Llama& llama, dist::Device& device, const text::TokenizerInterface& tokenizer) {
  engine::BatchEngine engine(llama, options_.engine, &tokenizer);
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
    broadcast_commands(device, c.bytes);
    const bool go_on = apply(engine, c.bytes, options_.compile_grammar, [&](size_t k, int id) {
      const std::shared_ptr<RequestStream>& s = c.added[k];
      std::lock_guard lock(mutex_);
      if (id < 0) {
        end(*s, {engine::FinishReason::error, "the engine refused the request"});
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
  for (auto& [id, s] : running_) end(*s, {engine::FinishReason::cancelled});
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

void EngineService::report_finished(engine::BatchEngine& engine, int id) {
  std::lock_guard lock(mutex_);
  const auto it = running_.find(id);
  if (it == running_.end()) return;
  const engine::BatchResult& r = engine.result(id);
  RequestStream& s = *it->second;
  if (r.finish_reason == engine::FinishReason::error) ++stats_.failed_requests;
  end(s, {r.finish_reason, r.error, r.text.substr(s.text_sent_), static_cast<int>(s.request_.prompt.size()), r.cached_tokens,
          static_cast<int>(r.tokens.size())});
  running_.erase(it);
}

void EngineService::record_step(const engine::BatchEngine& engine) {
  const Clock::time_point now = Clock::now();
  std::lock_guard lock(mutex_);
  const engine::EngineStats& e = engine.stats();
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

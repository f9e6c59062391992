// tpcli::serve — the HTTP front (see http_server.h).
#include "serve/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <random>
#include <thread>

#include "serve/api_request.h"
#include "serve/chat_page.h"
#include "serve/openai_shapes.h"
#include "serve/text_stream.h"

namespace tpcli::serve {

using nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;

// A thread for each connection, up to `max` (the rest wait for one to finish): a connection
// that idles or trickles its headers holds only its own thread. The count is shared with the
// threads and the server, so a straggler that outlives shutdown's wait touches nothing freed.
class ConnectionThreads : public httplib::TaskQueue {
 public:
  struct State {
    std::mutex mutex;
    std::condition_variable idle;
    std::deque<std::function<void()>> pending;
    int active = 0, max = 1;
  };
  explicit ConnectionThreads(std::shared_ptr<State> state) : state_(std::move(state)) {}
  void enqueue(std::function<void()> fn) override {
    std::lock_guard lock(state_->mutex);
    if (state_->active >= state_->max) {
      state_->pending.push_back(std::move(fn));
      return;
    }
    ++state_->active;
    std::thread(run, state_, std::move(fn)).detach();
  }
  // Waits a little for the connections still open (slow ones may outlive it).
  void shutdown() override {
    std::unique_lock lock(state_->mutex);
    state_->idle.wait_for(lock, std::chrono::seconds(3), [&] { return state_->active == 0; });
  }

 private:
  static void run(std::shared_ptr<State> state, std::function<void()> fn) {
    for (;;) {
      fn();
      std::lock_guard lock(state->mutex);
      if (state->pending.empty()) {
        --state->active;
        state->idle.notify_all();
        return;
      }
      fn = std::move(state->pending.front());
      state->pending.pop_front();
    }
  }
  std::shared_ptr<State> state_;
};

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  send_json(res, e.status(), e.body());
  if (e.status() == 429) res.set_header("Retry-After", "1");
}

constexpr size_t MAX_HEADER_BYTES = 8u << 10;  // the request line and every header, as sent

// How the request frames its body, checked before httplib reads it (the pre-routing handler runs
// first): httplib 0.11.4 reads and discards a body past the payload limit before its 413 (100 MB
// announced is 100 MB read, or a read timeout), reads a body without Content-Length until the
// client closes, takes chunked bodies of any size, and bounds each header line but not their sum.
std::optional<ApiError> framing_refusal(const httplib::Request& req, size_t max_body_bytes) {
  size_t header_bytes = req.method.size() + req.target.size() + req.version.size() + 4;
  for (const auto& [key, value] : req.headers) header_bytes += key.size() + value.size() + 4;
  if (header_bytes > MAX_HEADER_BYTES)
    return ApiError(431, "The request's headers are too large (over " + std::to_string(MAX_HEADER_BYTES >> 10) + " KB).");
  if (req.has_header("Transfer-Encoding"))
    return ApiError(411, "Chunked request bodies are not accepted: send the body with a Content-Length.");
  if (!req.has_header("Content-Length"))
    return req.method == "POST" ? std::optional(ApiError(411, "A POST needs a Content-Length (0 for no body).")) : std::nullopt;
  const std::string length = req.get_header_value("Content-Length");
  uint64_t bytes = 0;
  const auto [end, error] = std::from_chars(length.data(), length.data() + length.size(), bytes);
  if (error == std::errc::result_out_of_range || (error == std::errc() && end == length.data() + length.size() && bytes > max_body_bytes))
    return ApiError(413, "The request body is too large (over " + std::to_string(max_body_bytes) + " bytes).");
  if (error != std::errc() || end != length.data() + length.size() || length.empty())
    return ApiError(400, "The Content-Length is not a number of bytes.");
  return std::nullopt;
}

// An error after which the connection closes, its body unread. httplib 0.11.4 keeps a connection
// open whatever the answer's Connection header says, and would read the unread body as the next
// request; an answer written by a content provider that then reports failure makes it close.
void send_error_and_close(const httplib::Request& req, httplib::Response& res, const ApiError& e) {
  auto body = std::make_shared<std::string>(dump(e.body()));
  res.status = e.status();
  if (req.get_header_value("Connection") != "close") res.set_header("Connection", "close");
  res.set_content_provider(body->size(), "application/json", [body](size_t offset, size_t length, httplib::DataSink& sink) {
    sink.write(body->data() + offset, length);
    return false;  // all written: the failure only closes the connection
  });
}

bool same_key(const std::string& given, const std::string& want) {  // in time independent of where they differ
  unsigned char diff = given.size() != want.size();
  for (size_t i = 0; i < given.size(); ++i) diff |= static_cast<unsigned char>(given[i] ^ want[i % std::max<size_t>(want.size(), 1)]);
  return diff == 0;
}

}  // namespace

// One request's answer: tokens from the engine as text (stop strings met here end it), with
// log-probabilities when asked, whole or as a stream of chunks.
class Reply {
 public:
  Reply(EngineService& service, const ServedModel& model, const GenerationRequest& request, std::shared_ptr<RequestStream> stream,
        CompletionIdentity who)
      : service_(service), model_(model), request_(request), stream_(std::move(stream)), who_(std::move(who)),
        text_(*model.tokenizer, request.prompt, request.stop) {}

  void whole(httplib::Response& res) {
    std::string text;
    std::optional<Finish> finish;
    while (!finish) text += next(std::chrono::seconds(1), finish);
    if (const auto error = failure(*finish)) return send_error(res, *error);
    send_json(res, 200, completion_json(who_, text, finish->reason, *finish, logprobs(logprobs_, 0)));
  }

  // The stream's events, written to `sink` as they come; false ends the connection (the client left).
  bool stream(httplib::DataSink& sink) {
    const auto write = [&](const std::string& s) {
      last_write_ = Clock::now();
      return sink.write(s.data(), s.size());
    };
    if (who_.endpoint == Endpoint::chat && !write(sse_event(chunk_json(who_, "", true, "", nullptr, request_.include_usage)))) return false;
    for (;;) {
      std::optional<Finish> finish;
      const std::string delta = next(std::chrono::milliseconds(250), finish);
      if (!delta.empty() && !write(sse_event(chunk_json(who_, delta, false, "", take_logprobs(), request_.include_usage)))) return false;
      if (!finish && delta.empty() && Clock::now() - last_write_ > std::chrono::seconds(1) && !write(": waiting\n\n"))
        return false;  // a comment: finds a client that left while nothing was sent
      if (!finish) continue;
      if (const auto error = failure(*finish)) {
        write(sse_event(error->body()));
      } else {
        write(sse_event(chunk_json(who_, "", false, finish->reason, take_logprobs(), request_.include_usage)));
        if (request_.include_usage) write(sse_event(usage_chunk_json(who_, *finish)));
      }
      write("data: [DONE]\n\n");
      sink.done();
      return true;
    }
  }

  const std::shared_ptr<RequestStream>& request_stream() const { return stream_; }

 private:
  // The text of the tokens that came within `wait`; `finish` once the answer is complete.
  std::string next(std::chrono::milliseconds wait, std::optional<Finish>& finish) {
    std::vector<TokenEvent> events;
    finish = stream_->wait(events, wait);
    std::string out;
    for (const TokenEvent& e : events) {
      if (text_.stopped()) break;
      ++completion_tokens_;
      const bool stop_id = !request_.ignore_eos && std::ranges::count(model_.stop_ids, e.token);
      if (!stop_id) out += text_.add(e.token);
      if (request_.logprobs) logprobs_.push_back(entry(e));
    }
    if (text_.stopped() && !stopped_) {  // a stop string: the answer ends here, the engine frees the sequence
      stopped_ = true;
      service_.cancel(stream_);
    }
    if (stopped_) finish = Finish{"stop", {}, static_cast<int>(request_.prompt.size()), 0, completion_tokens_};
    if (finish) out += text_.flush();
    return out;
  }

  LogprobEntry entry(const TokenEvent& e) const {
    LogprobEntry out{piece(e.token), e.logprob, {}};
    for (const TokenLogprob& a : e.alternatives) out.alternatives.emplace_back(piece(a.token), a.logprob);
    return out;
  }
  std::string piece(int token) const { return model_.tokenizer->decode_ids(std::span<const int>(&token, 1), false); }

  json logprobs(const std::vector<LogprobEntry>& entries, size_t offset) const {
    return request_.logprobs ? logprobs_json(who_.endpoint, entries, offset) : json(nullptr);
  }
  json take_logprobs() {
    json out = logprobs(logprobs_, sent_text_);
    for (const LogprobEntry& e : logprobs_) sent_text_ += e.text.size();
    logprobs_.clear();
    return out;
  }

  static std::optional<ApiError> failure(const Finish& f) {
    if (f.reason == "error") return ApiError(500, "The engine failed: " + f.error.substr(0, 200), "", "engine_error", "server_error");
    if (f.reason == "cancelled") return ApiError(503, "The server is shutting down.", "", "unavailable", "server_error");
    return std::nullopt;
  }

  EngineService& service_;
  const ServedModel& model_;
  GenerationRequest request_;
  std::shared_ptr<RequestStream> stream_;
  CompletionIdentity who_;
  TextStream text_;
  std::vector<LogprobEntry> logprobs_;  // not yet sent
  size_t sent_text_ = 0;
  int completion_tokens_ = 0;
  bool stopped_ = false;
  Clock::time_point last_write_ = Clock::now();
};

struct HttpServer::Impl {
  EngineService& service;
  ServedModel model;
  ServerOptions options;
  httplib::Server server;
  PromptModel prompts;
  std::mutex mutex;  // guards by_status and seeds
  std::map<int, uint64_t> by_status;
  std::mt19937_64 seeds{std::random_device{}()};
  std::atomic<uint64_t> next_id{1};
  socket_t listening = INVALID_SOCKET;
  std::shared_ptr<ConnectionThreads::State> connections = std::make_shared<ConnectionThreads::State>();

  Impl(EngineService& s, ServedModel m, ServerOptions o) : service(s), model(std::move(m)), options(std::move(o)) {}

  void routes();
  void limits();
  PromptModel prompt_model() const;
  void generate(const httplib::Request& req, httplib::Response& res, Endpoint endpoint);
  model::BatchRequest batch_request(const GenerationRequest& g);
  void tokenize(const httplib::Request& req, httplib::Response& res) const;
  void detokenize(const httplib::Request& req, httplib::Response& res) const;
  json status() const;
  json model_card() const { return {{"id", model.name}, {"object", "model"}, {"created", 0}, {"owned_by", "tpcli"}}; }
};

PromptModel HttpServer::Impl::prompt_model() const {
  PromptModel p;
  p.name = model.name;
  p.context = service.context();
  p.vocab = model.tokenizer->vocab_size();
  const model::TokenizerInterface& tokenizer = *model.tokenizer;
  p.encode = [&tokenizer](std::string_view text) { return tokenizer.encode_text(text, true); };
  p.chat = [this, &tokenizer](std::span<const model::ChatMessage> messages) {
    if (!model.chat_template)
      throw ApiError(400, "This model has no chat template: start the server with --template NAME, or use /v1/completions.", "messages");
    try {  // the template writes its own beginning of sequence
      return tokenizer.encode_text(model::render_chat(*model.chat_template, messages, model.chat_tokens, true), false);
    } catch (const std::invalid_argument& e) {
      throw ApiError(400, std::string("The messages do not fit the chat template: ") + e.what(), "messages");
    }
  };
  return p;
}

model::BatchRequest HttpServer::Impl::batch_request(const GenerationRequest& g) {
  model::BatchRequest r;
  r.prompt = g.prompt;
  r.max_tokens = g.max_tokens;
  r.temperature = g.top_p <= 0 ? 0.0f : g.temperature;  // top_p 0 keeps only the likeliest token
  r.topp = g.top_p;
  {
    std::lock_guard lock(mutex);
    r.seed = g.seed.value_or(seeds());
  }
  if (r.seed == 0) r.seed = 1;  // the sampler's state must not be 0 (as infer --batch)
  if (!g.ignore_eos) r.stop_ids = model.stop_ids;
  return r;
}

void HttpServer::Impl::generate(const httplib::Request& req, httplib::Response& res, Endpoint endpoint) {
  const GenerationRequest g = parse_generation_request(parse_body(req.body), endpoint, prompts);
  std::shared_ptr<RequestStream> stream = service.submit(batch_request(g), g.logprobs ? g.top_logprobs : -1);
  const uint64_t n = next_id++;
  char id[32];
  std::snprintf(id, sizeof id, "%s-%llx", endpoint == Endpoint::chat ? "chatcmpl" : "cmpl", static_cast<unsigned long long>(n));
  auto reply = std::make_shared<Reply>(service, model, g, stream, CompletionIdentity{id, std::time(nullptr), model.name, endpoint});
  if (!g.stream) return reply->whole(res);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream", [reply](size_t, httplib::DataSink& sink) { return reply->stream(sink); },
      [this, reply](bool) { service.cancel(reply->request_stream()); });  // a client gone mid-stream frees its blocks
}

void HttpServer::Impl::tokenize(const httplib::Request& req, httplib::Response& res) const {
  const json body = parse_body(req.body);
  const auto content = body.find("content");
  if (content == body.end() || !content->is_string()) throw ApiError(400, "'content' must be a string.", "content");
  const auto special = body.find("add_special");
  if (special != body.end() && !special->is_boolean()) throw ApiError(400, "'add_special' must be a boolean.", "add_special");
  const bool bos = special == body.end() || special->get<bool>();
  send_json(res, 200, {{"tokens", model.tokenizer->encode_text(content->get_ref<const std::string&>(), bos)}});
}

void HttpServer::Impl::detokenize(const httplib::Request& req, httplib::Response& res) const {
  const json body = parse_body(req.body);
  const auto tokens = body.find("tokens");
  const int vocab = model.tokenizer->vocab_size();
  const auto in_vocab = [&](const json& t) { return t.is_number_integer() && t.get<int64_t>() >= 0 && t.get<int64_t>() < vocab; };
  if (tokens == body.end() || !tokens->is_array() || !std::ranges::all_of(*tokens, in_vocab))
    throw ApiError(400, "'tokens' must be a list of token ids (0 to " + std::to_string(vocab - 1) + ").", "tokens");
  const std::vector<int> ids = tokens->get<std::vector<int>>();
  send_json(res, 200, {{"content", model.tokenizer->decode_ids(ids, false)}});
}

json HttpServer::Impl::status() const {
  const ServiceSnapshot s = service.snapshot();
  return {{"model", model.name},        {"devices", model.devices},          {"mesh", model.mesh},
          {"backend", model.backend},   {"holds", model.holds},              {"running", s.running},
          {"waiting", s.waiting + s.queued}, {"tokens_per_second", s.tokens_per_second}, {"context", s.context},
          {"kv_blocks", s.kv_blocks},   {"kv_blocks_free", s.kv_blocks_free}};
}

void HttpServer::Impl::routes() {
  const auto guarded = [this](auto handler) {
    return [this, handler](const httplib::Request& req, httplib::Response& res) {
      try {
        handler(req, res);
      } catch (const ApiError& e) {
        send_error(res, e);
      }
    };
  };
  server.Post("/v1/chat/completions", guarded([this](const auto& q, auto& r) { generate(q, r, Endpoint::chat); }));
  server.Post("/v1/completions", guarded([this](const auto& q, auto& r) { generate(q, r, Endpoint::completion); }));
  server.Get("/v1/models", [this](const auto&, auto& r) { send_json(r, 200, {{"object", "list"}, {"data", json::array({model_card()})}}); });
  server.Get("/v1/models/(.+)", guarded([this](const auto& q, auto& r) {
    if (q.matches[1] != model.name) throw ApiError(404, "The model does not exist.", "model", "model_not_found");
    send_json(r, 200, model_card());
  }));
  server.Get("/health", [this](const auto&, auto& r) {
    const std::optional<std::string> stuck = options.devices_stuck ? options.devices_stuck() : std::nullopt;
    if (stuck) send_json(r, 503, {{"status", "stuck"}, {"error", *stuck}});
    else send_json(r, 200, {{"status", "ok"}});
  });
  server.Get("/status", [this](const auto&, auto& r) { send_json(r, 200, status()); });
  server.Get("/metrics", [this](const auto&, auto& r) {
    std::map<int, uint64_t> counts;
    {
      std::lock_guard lock(mutex);
      counts = by_status;
    }
    r.set_content(prometheus_text(service.snapshot(), counts), "text/plain; version=0.0.4");
  });
  server.Post("/tokenize", guarded([this](const auto& q, auto& r) { tokenize(q, r); }));
  server.Post("/detokenize", guarded([this](const auto& q, auto& r) { detokenize(q, r); }));
  server.Get("/", [](const auto&, auto& r) { r.set_content(std::string(chat_page()), "text/html; charset=utf-8"); });
}

void HttpServer::Impl::limits() {
  connections->max = options.max_connections;
  server.new_task_queue = [this] { return new ConnectionThreads(connections); };
  server.set_payload_max_length(options.max_body_bytes);
  server.set_read_timeout(options.read_timeout);
  server.set_write_timeout(options.read_timeout);
  server.set_keep_alive_timeout(options.keep_alive.count());
  server.set_keep_alive_max_count(1000);
  server.set_socket_options([this](socket_t sock) {  // not httplib's default SO_REUSEPORT: two servers must not share a port
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    listening = sock;
  });
  server.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (const auto refusal = framing_refusal(req, options.max_body_bytes)) {
      send_error_and_close(req, res, *refusal);
      return httplib::Server::HandlerResponse::Handled;
    }
    if (options.api_key.empty() || req.path == "/" || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    const std::string given = req.get_header_value("Authorization");
    if (given.starts_with("Bearer ") && same_key(given.substr(7), options.api_key)) return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, ApiError(401, "Incorrect or missing API key: send 'Authorization: Bearer KEY'.", "", "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });
  server.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty() || res.content_length_ > 0) return httplib::Server::HandlerResponse::Unhandled;  // ours; else httplib's refusals and unknown paths
    const char* why = res.status == 404 ? "No such endpoint."
                      : res.status == 405 ? "Method not allowed."
                      : res.status == 413 ? "The request body is too large."
                      : res.status == 414 ? "The request line is too long."
                                          : "The request is malformed.";
    send_json(res, res.status, ApiError(res.status, why, "", res.status == 404 ? "not_found" : "").body());
    return httplib::Server::HandlerResponse::Handled;
  }));
  server.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    send_json(res, 500, ApiError(500, "Internal server error.", "", "internal_error").body());
  });
  server.set_logger([this](const httplib::Request&, const httplib::Response& res) {
    std::lock_guard lock(mutex);
    ++by_status[res.status];
  });
}

HttpServer::HttpServer(EngineService& service, ServedModel model, ServerOptions options)
    : impl_(std::make_unique<Impl>(service, std::move(model), std::move(options))) {
  impl_->limits();
  impl_->routes();
}

// A connection thread still running (a client trickling bytes past shutdown's wait) runs httplib
// code on this server: then it is left allocated for the process's last moments, not freed under it.
HttpServer::~HttpServer() {
  std::lock_guard lock(impl_->connections->mutex);
  if (impl_->connections->active > 0) static_cast<void>(impl_.release());
}

int HttpServer::bind() {
  const ServerOptions& o = impl_->options;
  errno = 0;
  const int port = o.port == 0 ? impl_->server.bind_to_any_port(o.host) : impl_->server.bind_to_port(o.host, o.port) ? o.port : -1;
  if (port < 0)
    throw std::runtime_error("cannot listen on " + o.host + ":" + std::to_string(o.port) + " (" +
                             (errno ? std::strerror(errno) : "address not available") + ")");
  // httplib listens with a backlog of 5: 64 clients connecting at once would see SYNs dropped
  // and retried a second later. Listening again on the socket raises it (Linux).
  if (impl_->listening != INVALID_SOCKET) ::listen(impl_->listening, SOMAXCONN);
  return port;
}

void HttpServer::listen() {
  if (!impl_->service.wait_ready()) return;
  impl_->prompts = impl_->prompt_model();
  impl_->server.listen_after_bind();
}

void HttpServer::stop() { impl_->server.stop(); }

}  // namespace tpcli::serve

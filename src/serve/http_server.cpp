// tpcli::serve — the HTTP front (see http_server.h).
#include "serve/http_server.h"

#include <algorithm>
#include <atomic>
#include <ctime>
#include <functional>
#include <map>
#include <mutex>
#include <random>

#include "serve/api_request.h"
#include "serve/chat_page.h"
#include "serve/http_connections.h"
#include "serve/openai_shapes.h"

namespace tpcli::serve {

using nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;

void send_json(HttpResponse& res, int status, const json& body) {
  res.status = status;
  res.content_type = "application/json";
  res.body = dump(body);
}

void send_error(HttpResponse& res, const ApiError& e) {
  send_json(res, e.status(), e.body());
  if (e.status() == 429) res.set_header("Retry-After", "1");
}

bool same_key(const std::string& given, const std::string& want) {  // in time independent of where they differ
  unsigned char diff = given.size() != want.size();
  for (size_t i = 0; i < given.size(); ++i) diff |= static_cast<unsigned char>(given[i] ^ want[i % std::max<size_t>(want.size(), 1)]);
  return diff == 0;
}

}  // namespace

// One request's answer: the engine's tokens and text (it ends the answer at a stop string), with
// log-probabilities when asked, whole or as a stream of chunks.
class Reply {
 public:
  Reply(const ServedModel& model, const GenerationRequest& request, std::shared_ptr<RequestStream> stream, CompletionIdentity who)
      : model_(model), request_(request), stream_(std::move(stream)), who_(std::move(who)) {}

  void whole(HttpResponse& res) {
    std::string text;
    std::optional<Finish> finish;
    while (!finish) text += next(std::chrono::seconds(1), finish);
    if (const auto error = failure(*finish)) return send_error(res, *error);
    send_json(res, 200, completion_json(who_, text, finish->reason, *finish, logprobs(logprobs_, 0)));
  }

  // The stream's events, written as they come; false ends the connection (the client left).
  bool stream(const ChunkWriter& sink) {
    const auto write = [&](const std::string& s) {
      last_write_ = Clock::now();
      return sink(s);
    };
    if (who_.endpoint == Endpoint::chat && !write(sse_event(chunk_json(who_, "", true, std::nullopt, nullptr, request_.include_usage)))) return false;
    for (;;) {
      std::optional<Finish> finish;
      const std::string delta = next(std::chrono::milliseconds(250), finish);
      if (!delta.empty() && !write(sse_event(chunk_json(who_, delta, false, std::nullopt, take_logprobs(), request_.include_usage)))) return false;
      if (!finish && delta.empty() && Clock::now() - last_write_ > std::chrono::seconds(1) && !write(": waiting\n\n"))
        return false;  // a comment: finds a client that left while nothing was sent
      if (!finish) continue;
      if (const auto error = failure(*finish)) {
        write(sse_event(error->body()));
      } else {
        write(sse_event(chunk_json(who_, "", false, finish->reason, take_logprobs(), request_.include_usage)));
        if (request_.include_usage) write(sse_event(usage_chunk_json(who_, *finish)));
      }
      return write("data: [DONE]\n\n");
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
      out += e.text;
      if (request_.logprobs) logprobs_.push_back(entry(e));
    }
    if (finish) out += finish->text;
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
    if (f.reason == engine::FinishReason::error) return ApiError(500, "The engine failed: " + f.error.substr(0, 200), "", "engine_error", "server_error");
    if (f.reason == engine::FinishReason::cancelled) return ApiError(503, "The server is shutting down.", "", "unavailable", "server_error");
    return std::nullopt;
  }

  const ServedModel& model_;
  GenerationRequest request_;
  std::shared_ptr<RequestStream> stream_;
  CompletionIdentity who_;
  std::vector<LogprobEntry> logprobs_;  // not yet sent
  size_t sent_text_ = 0;
  Clock::time_point last_write_ = Clock::now();
};

// A route: a method on a path, or on every path longer than a prefix ("/v1/models/" + a name).
struct Route {
  std::string method, path;
  std::function<void(const HttpRequest&, HttpResponse&)> run;
  bool prefix = false;
  bool matches(const std::string& p) const { return prefix ? p.starts_with(path) && p.size() > path.size() : p == path; }
};

struct HttpServer::Impl {
  EngineService& service;
  ServedModel model;
  ServerOptions options;
  std::vector<Route> table;
  HttpConnections connections;
  PromptModel prompts;
  std::mutex mutex;  // guards by_status and seeds
  std::map<int, uint64_t> by_status;
  std::mt19937_64 seeds{std::random_device{}()};
  std::atomic<uint64_t> next_id{1};

  Impl(EngineService& s, ServedModel m, ServerOptions o)
      : service(s),
        model(std::move(m)),
        options(std::move(o)),
        connections(HttpRoutes{[this](const HttpRequest& q, HttpResponse& r) { handle(q, r); },
                               [](const HttpRequest& q) { return q.path == "/health" && (q.method == "GET" || q.method == "HEAD"); },
                               [this](int status) {
                                 std::lock_guard lock(mutex);
                                 ++by_status[status];
                               }},
                    ConnectionLimits{options.max_body_bytes, options.max_connections, options.header_timeout, options.keep_alive,
                                     options.read_timeout}) {
    routes();
  }

  void routes();
  void handle(const HttpRequest& req, HttpResponse& res);
  bool authorized(const HttpRequest& req) const;
  PromptModel prompt_model() const;
  void generate(const HttpRequest& req, HttpResponse& res, Endpoint endpoint);
  engine::BatchRequest batch_request(const GenerationRequest& g);
  void tokenize(const HttpRequest& req, HttpResponse& res) const;
  void detokenize(const HttpRequest& req, HttpResponse& res) const;
  json status() const;
  json model_card() const { return {{"id", model.name}, {"object", "model"}, {"created", 0}, {"owned_by", "tpcli"}}; }
};

PromptModel HttpServer::Impl::prompt_model() const {
  PromptModel p;
  p.name = model.name;
  p.context = service.context();
  p.vocab = model.tokenizer->vocab_size();
  const text::TokenizerInterface& tokenizer = *model.tokenizer;
  p.encode = [&tokenizer](std::string_view text) { return tokenizer.encode_text(text, true); };
  p.chat = [this, &tokenizer](const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                               const nlohmann::ordered_json& kwargs) {
    if (!model.chat_template)
      throw ApiError(400, "This model has no chat template: start the server with --template NAME, or use /v1/completions.", "messages");
    text::ChatTemplate chat_template = *model.chat_template;
    for (const auto& [key, value] : kwargs.items()) chat_template.extra[key] = value;
    try {  // the template writes its own beginning of sequence
      return tokenizer.encode_text(text::render_chat_json(chat_template, messages, tools, model.chat_tokens, true), false);
    } catch (const std::invalid_argument& e) {
      throw ApiError(400, std::string("The messages do not fit the chat template: ") + e.what(), "messages");
    }
  };
  return p;
}

engine::BatchRequest HttpServer::Impl::batch_request(const GenerationRequest& g) {
  engine::BatchRequest r;
  r.prompt = g.prompt;
  r.max_tokens = g.max_tokens;
  r.temperature = g.top_p <= 0 ? 0.0f : g.temperature;  // top_p 0 keeps only the likeliest token
  r.topp = g.top_p;
  r.sampling = g.sampling;
  {
    std::lock_guard lock(mutex);
    r.seed = g.seed.value_or(seeds());
  }
  if (r.seed == 0) r.seed = 1;  // the sampler's state must not be 0 (as infer --batch)
  if (!g.ignore_eos) r.stop_ids = model.stop_ids;
  r.stop = g.stop;
  return r;
}

void HttpServer::Impl::generate(const HttpRequest& req, HttpResponse& res, Endpoint endpoint) {
  const GenerationRequest g = parse_generation_request(parse_body(req.body), endpoint, prompts);
  std::shared_ptr<RequestStream> stream = service.submit(batch_request(g), g.logprobs ? g.top_logprobs : -1);
  const uint64_t n = next_id++;
  char id[32];
  std::snprintf(id, sizeof id, "%s-%llx", endpoint == Endpoint::chat ? "chatcmpl" : "cmpl", static_cast<unsigned long long>(n));
  auto reply = std::make_shared<Reply>(model, g, stream, CompletionIdentity{id, std::time(nullptr), model.name, endpoint});
  if (!g.stream) return reply->whole(res);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.content_type = "text/event-stream";
  res.chunks = [this, reply](const ChunkWriter& write) {
    struct CancelAtEnd {  // a client gone mid-stream, or a stream that threw, frees its blocks
      EngineService& service;
      const std::shared_ptr<RequestStream>& stream;
      ~CancelAtEnd() { service.cancel(stream); }
    } cancel_at_end{service, reply->request_stream()};
    return reply->stream(write);
  };
}

void HttpServer::Impl::tokenize(const HttpRequest& req, HttpResponse& res) const {
  const json body = parse_body(req.body);
  const auto content = body.find("content");
  if (content == body.end() || !content->is_string()) throw ApiError(400, "'content' must be a string.", "content");
  const auto special = body.find("add_special");
  if (special != body.end() && !special->is_boolean()) throw ApiError(400, "'add_special' must be a boolean.", "add_special");
  const bool bos = special == body.end() || special->get<bool>();
  send_json(res, 200, {{"tokens", model.tokenizer->encode_text(content->get_ref<const std::string&>(), bos)}});
}

void HttpServer::Impl::detokenize(const HttpRequest& req, HttpResponse& res) const {
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
  const auto route = [this](std::string method, std::string path, std::function<void(const HttpRequest&, HttpResponse&)> run) {
    const bool prefix = path.size() > 1 && path.ends_with('/');
    table.push_back({std::move(method), std::move(path), std::move(run), prefix});
  };
  route("POST", "/v1/chat/completions", [this](const auto& q, auto& r) { generate(q, r, Endpoint::chat); });
  route("POST", "/v1/completions", [this](const auto& q, auto& r) { generate(q, r, Endpoint::completion); });
  route("GET", "/v1/models", [this](const auto&, auto& r) { send_json(r, 200, {{"object", "list"}, {"data", json::array({model_card()})}}); });
  route("GET", "/v1/models/", [this](const auto& q, auto& r) {
    if (q.path.substr(std::string_view("/v1/models/").size()) != model.name)
      throw ApiError(404, "The model does not exist.", "model", "model_not_found");
    send_json(r, 200, model_card());
  });
  route("GET", "/health", [this](const auto&, auto& r) {
    const std::optional<std::string> stuck = options.devices_stuck ? options.devices_stuck() : std::nullopt;
    if (stuck) send_json(r, 503, {{"status", "stuck"}, {"error", *stuck}});
    else send_json(r, 200, {{"status", "ok"}});
  });
  route("GET", "/status", [this](const auto&, auto& r) { send_json(r, 200, status()); });
  route("GET", "/metrics", [this](const auto&, auto& r) {
    std::map<int, uint64_t> counts;
    {
      std::lock_guard lock(mutex);
      counts = by_status;
    }
    r.content_type = "text/plain; version=0.0.4";
    r.body = prometheus_text(service.snapshot(), counts);
  });
  route("POST", "/tokenize", [this](const auto& q, auto& r) { tokenize(q, r); });
  route("POST", "/detokenize", [this](const auto& q, auto& r) { detokenize(q, r); });
  route("GET", "/", [](const auto&, auto& r) {
    r.content_type = "text/html; charset=utf-8";
    r.body = std::string(chat_page());
  });
}

bool HttpServer::Impl::authorized(const HttpRequest& req) const {
  if (options.api_key.empty() || req.path == "/" || req.path == "/health") return true;
  const std::string_view given = req.header("authorization");
  return given.starts_with("Bearer ") && same_key(std::string(given.substr(7)), options.api_key);
}

// The route of the path and method: 404 for a path no route has, 405 (with Allow) for a method
// the path does not take. HEAD is GET without its body.
void HttpServer::Impl::handle(const HttpRequest& req, HttpResponse& res) {
  try {
    if (!authorized(req)) throw ApiError(401, "Incorrect or missing API key: send 'Authorization: Bearer KEY'.", "", "invalid_api_key");
    std::string allowed;
    for (const Route& r : table) {
      if (!r.matches(req.path)) continue;
      if (r.method == req.method || (req.method == "HEAD" && r.method == "GET")) return r.run(req, res);
      allowed += (allowed.empty() ? "" : ", ") + r.method;
    }
    if (allowed.empty()) throw ApiError(404, "No such endpoint.", "", "not_found");
    res.set_header("Allow", allowed);
    throw ApiError(405, "Method not allowed: this endpoint takes " + allowed + ".", "", "method_not_allowed");
  } catch (const ApiError& e) {
    send_error(res, e);
  }
}

HttpServer::HttpServer(EngineService& service, ServedModel model, ServerOptions options)
    : impl_(std::make_unique<Impl>(service, std::move(model), std::move(options))) {}

// A connection thread still running (a client trickling a body past shutdown's wait) runs this
// server's routes: then it is left allocated for the process's last moments, not freed under it.
HttpServer::~HttpServer() {
  if (impl_->connections.busy_threads() > 0) static_cast<void>(impl_.release());
}

int HttpServer::bind() { return impl_->connections.bind(impl_->options.host, impl_->options.port); }

void HttpServer::listen() {
  if (!impl_->service.wait_ready()) return;
  impl_->prompts = impl_->prompt_model();
  impl_->connections.run();
}

void HttpServer::stop() { impl_->connections.stop(); }

}  // namespace tpcli::serve

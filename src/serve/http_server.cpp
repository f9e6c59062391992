// tpcli::serve — the HTTP front (see http_server.h).
#include "serve/http_server.h"

#include <algorithm>
#include <atomic>
#include <ctime>
#include <functional>
#include <map>
#include <mutex>
#include <random>

#include "grammar/json_schema.h"
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

// How a chat answer's reasoning is told from its reply (text/reasoning.h).
struct ReasoningSplit {
  text::ReasoningMarkers markers;
  bool starts_inside = false;  // the prompt opened the reasoning
};

// One choice of an answer: its stream from the engine, and what of it went to the client.
struct Choice {
  std::shared_ptr<RequestStream> stream;
  uint64_t seed = 0;                        // its tool calls' ids come from it
  std::optional<text::ReasoningStream> reasoning;  // with reasoning markers: the text as reasoning and reply
  std::optional<text::ToolCallStream> calls;  // with tools: the text as content and tool calls
  int call_count = 0;
  std::vector<LogprobEntry> logprobs;  // not yet sent
  size_t sent_text = 0;                // bytes of text whose log-probabilities were sent
  std::optional<Finish> finish;
  bool ended = false;                  // its last chunk was written
};

// One request's answer: its choices' tokens and text (the engine ends each at a stop string), with
// log-probabilities when asked, whole or as a stream of chunks.
class Reply {
 public:
  // `reasoning`: the reasoning is split off the answers' text first; `tool_format`: the rest is read
  // as content and tool calls in that format (a call inside the reasoning does not count).
  Reply(const ServedModel& model, const GenerationRequest& request, const std::vector<std::shared_ptr<RequestStream>>& streams,
        const std::vector<uint64_t>& seeds, std::optional<ReasoningSplit> reasoning, std::optional<text::ToolCallFormat> tool_format,
        CompletionIdentity who)
      : model_(model), request_(request), reasoning_(std::move(reasoning)), tool_format_(tool_format), who_(std::move(who)) {
    for (size_t i = 0; i < streams.size(); ++i) {
      choices_.push_back({streams[i], seeds[i]});
      if (reasoning_) choices_.back().reasoning.emplace(reasoning_->markers, reasoning_->starts_inside);
      if (tool_format) choices_.back().calls.emplace(*tool_format, nlohmann::json(request.tools));
    }
  }

  void whole(HttpResponse& res) {
    std::vector<ChoiceReply> replies;
    std::vector<Finish> finishes;
    for (Choice& c : choices_) {
      std::string text;
      while (!c.finish) text += next(c, std::chrono::seconds(1));
      if (const auto error = failure(*c.finish)) return send_error(res, *error);
      ChoiceReply reply{text, "", json::array(), "", logprobs(c.logprobs, 0)};
      if (reasoning_) {
        text::ReasoningDelta split = text::split_reasoning(reasoning_->markers, text, reasoning_->starts_inside);
        reply.reasoning = std::move(split.reasoning);
        reply.text = std::move(split.reply);
      }
      if (tool_format_) {
        const text::AssistantReply parsed = text::parse_tool_calls(*tool_format_, reply.text, nlohmann::json(request_.tools));
        reply.text = parsed.content;
        for (const text::ToolCall& call : parsed.tool_calls)
          reply.tool_calls.push_back({{"id", text::tool_call_id(c.seed, static_cast<int>(reply.tool_calls.size()))},
                                      {"type", "function"},
                                      {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
        c.call_count = static_cast<int>(reply.tool_calls.size());
      }
      reply.finish_reason = finish_reason(c);
      replies.push_back(std::move(reply));
      finishes.push_back(*c.finish);
    }
    send_json(res, 200, completion_json(who_, replies, usage_json(finishes)));
  }

  // The choices' events, written as they come; false ends the connection (the client left).
  bool stream(const ChunkWriter& sink) {
    const auto write = [&](const std::string& s) {
      last_write_ = Clock::now();
      return sink(s);
    };
    const bool usage = request_.include_usage;
    if (who_.endpoint == Endpoint::chat)
      for (size_t i = 0; i < choices_.size(); ++i)
        if (!write(sse_event(chunk_json(who_, {.index = static_cast<int>(i), .first = true}, usage)))) return false;
    // One choice waits as long as a quarter second for its tokens; several take turns.
    const auto wait = std::chrono::milliseconds(choices_.size() == 1 ? 250 : 20);
    for (;;) {
      bool all_ended = true;
      for (size_t i = 0; i < choices_.size(); ++i) {
        Choice& c = choices_[i];
        if (c.ended) continue;
        ChunkDelta delta = shaped(c, next(c, wait));
        delta.index = static_cast<int>(i);
        if (!delta.content.empty() || !delta.reasoning.empty() || !delta.tool_calls.empty()) {
          delta.logprobs = take_logprobs(c);
          if (!write(sse_event(chunk_json(who_, delta, usage)))) return false;
        }
        if (c.finish) {
          if (const auto error = failure(*c.finish)) {
            write(sse_event(error->body()));
            return write("data: [DONE]\n\n");
          }
          const ChunkDelta last{.index = static_cast<int>(i), .finish_reason = finish_reason(c), .logprobs = take_logprobs(c)};
          if (!write(sse_event(chunk_json(who_, last, usage)))) return false;
          c.ended = true;
        }
        all_ended = all_ended && c.ended;
      }
      if (all_ended) break;
      if (Clock::now() - last_write_ > std::chrono::seconds(1) && !write(": waiting\n\n"))
        return false;  // a comment: finds a client that left while nothing was sent
    }
    if (usage) {
      std::vector<Finish> finishes;
      for (const Choice& c : choices_) finishes.push_back(*c.finish);
      write(sse_event(usage_chunk_json(who_, usage_json(finishes))));
    }
    return write("data: [DONE]\n\n");
  }

  std::vector<std::shared_ptr<RequestStream>> request_streams() const {
    std::vector<std::shared_ptr<RequestStream>> out;
    for (const Choice& c : choices_) out.push_back(c.stream);
    return out;
  }

 private:
  // The text of the choice's tokens that came within `wait`; c.finish once the choice is complete.
  std::string next(Choice& c, std::chrono::milliseconds wait) {
    std::vector<TokenEvent> events;
    c.finish = c.stream->wait(events, wait);
    std::string out;
    for (const TokenEvent& e : events) {
      out += e.text;
      if (request_.logprobs) c.logprobs.push_back(entry(e));
    }
    if (c.finish) out += c.finish->text;
    return out;
  }

  // A stretch of a choice's text as a chunk's delta: reasoning when its markers are on, content,
  // and tool calls when tools are on (the call's id, type and name in its first delta, its
  // arguments in pieces after).
  ChunkDelta shaped(Choice& c, const std::string& text) const {
    std::string reasoning, reply = text;
    if (c.reasoning) {
      text::ReasoningDelta r = c.reasoning->feed(text);
      if (c.finish) {
        const text::ReasoningDelta rest = c.reasoning->finish();
        r.reasoning += rest.reasoning;
        r.reply += rest.reply;
      }
      reasoning = std::move(r.reasoning);
      reply = std::move(r.reply);
    }
    if (!c.calls) return {.content = std::move(reply), .reasoning = std::move(reasoning)};
    text::ReplyDelta d = c.calls->feed(reply);
    if (c.finish) {
      text::ReplyDelta rest = c.calls->finish();
      d.content += rest.content;
      d.tool_calls.insert(d.tool_calls.end(), rest.tool_calls.begin(), rest.tool_calls.end());
    }
    ChunkDelta out{.content = std::move(d.content), .reasoning = std::move(reasoning), .tool_calls = json::array()};
    for (const text::ToolCallDelta& call : d.tool_calls) {
      json piece = {{"index", call.index}};
      if (!call.name.empty()) {
        piece["id"] = text::tool_call_id(c.seed, call.index);
        piece["type"] = "function";
        piece["function"] = {{"name", call.name}, {"arguments", call.arguments_fragment}};
        c.call_count = std::max(c.call_count, call.index + 1);
      } else {
        piece["function"] = {{"arguments", call.arguments_fragment}};
      }
      out.tool_calls.push_back(std::move(piece));
    }
    return out;
  }

  // OpenAI's finish_reason: "tool_calls" for an answer that ended calling tools.
  static std::string finish_reason(const Choice& c) {
    if (c.call_count > 0 && c.finish->reason == engine::FinishReason::stop) return "tool_calls";
    return std::string(engine::finish_reason_name(c.finish->reason));
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
  json take_logprobs(Choice& c) const {
    json out = logprobs(c.logprobs, c.sent_text);
    for (const LogprobEntry& e : c.logprobs) c.sent_text += e.text.size();
    c.logprobs.clear();
    return out;
  }

  static std::optional<ApiError> failure(const Finish& f) {
    if (f.reason == engine::FinishReason::error) return ApiError(500, "The engine failed: " + f.error.substr(0, 200), "", "engine_error", "server_error");
    if (f.reason == engine::FinishReason::cancelled) return ApiError(503, "The server is shutting down.", "", "unavailable", "server_error");
    return std::nullopt;
  }

  const ServedModel& model_;
  GenerationRequest request_;
  std::optional<ReasoningSplit> reasoning_;
  std::optional<text::ToolCallFormat> tool_format_;
  CompletionIdentity who_;
  std::vector<Choice> choices_;
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
  std::string output_grammar(const GenerationRequest& g, std::optional<text::ToolCallFormat> tool_format,
                             engine::TokenConstraintFactory& compiled) const;
  std::optional<text::ToolCallFormat> reply_tool_format(const GenerationRequest& g) const;
  std::optional<ReasoningSplit> reply_reasoning(const GenerationRequest& g, const std::string& grammar) const;
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
  const std::optional<text::ToolCallFormat> tool_format = reply_tool_format(g);
  engine::BatchRequest first = batch_request(g);
  // The grammar's compile rides in the requests (the engine's commands carry its text only): held
  // until the answer ends, the devices' compiles of it find it instead of compiling it again.
  const std::string grammar = output_grammar(g, tool_format, first.constraint);
  std::vector<std::shared_ptr<RequestStream>> streams;
  std::vector<uint64_t> seeds;
  try {  // n choices: one prompt (its blocks shared once the first has prefilled them), seeds one apart
    for (int i = 0; i < g.n; ++i) {
      engine::BatchRequest r = first;
      r.seed = first.seed + static_cast<uint64_t>(i);
      if (r.seed == 0) r.seed = 1;
      seeds.push_back(r.seed);
      streams.push_back(service.submit(r, g.logprobs ? g.top_logprobs : -1, grammar));
    }
  } catch (const ApiError&) {
    for (const auto& s : streams) service.cancel(s);
    throw;
  }
  const uint64_t n = next_id++;
  char id[32];
  std::snprintf(id, sizeof id, "%s-%llx", endpoint == Endpoint::chat ? "chatcmpl" : "cmpl", static_cast<unsigned long long>(n));
  auto reply = std::make_shared<Reply>(model, g, streams, seeds, reply_reasoning(g, grammar), tool_format,
                                       CompletionIdentity{id, std::time(nullptr), model.name, endpoint});
  if (!g.stream) return reply->whole(res);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.content_type = "text/event-stream";
  res.chunks = [this, reply](const ChunkWriter& write) {
    struct CancelAtEnd {  // a client gone mid-stream, or a stream that threw, frees its blocks
      EngineService& service;
      std::vector<std::shared_ptr<RequestStream>> streams;
      ~CancelAtEnd() {
        for (const auto& s : streams) service.cancel(s);
      }
    } cancel_at_end{service, reply->request_streams()};
    return reply->stream(write);
  };
}

// The format the answers' tool calls are read in: none unless the request offers tools it may call.
std::optional<text::ToolCallFormat> HttpServer::Impl::reply_tool_format(const GenerationRequest& g) const {
  if (g.tool_choice.mode == ToolChoice::Mode::none || !g.tools.is_array() || g.tools.empty()) return std::nullopt;
  if (!model.chat_template || !model.chat_template->tool_format)
    throw ApiError(400, "This model's chat template writes no tool calls: start the server with --tool-parser NAME (" +
                            text::tool_call_format_names() + ").", "tools");
  return model.chat_template->tool_format;
}

// How the answers' reasoning is split off: chat answers, when the template mentions reasoning
// markers (or --reasoning-parser names them). Not when a grammar shapes the answer: the grammar
// applies from the answer's first token (it does not wait for the reasoning to close, as vLLM's and
// llama.cpp's can), so the text it shaped is all reply.
std::optional<ReasoningSplit> HttpServer::Impl::reply_reasoning(const GenerationRequest& g, const std::string& grammar) const {
  if (g.endpoint != Endpoint::chat || !grammar.empty() || !model.chat_template || !model.chat_template->reasoning) return std::nullopt;
  const text::ReasoningMarkers& markers = *model.chat_template->reasoning;
  // The prompt's last tokens as text hold the opening marker and the whitespace after it, if any.
  constexpr size_t PROMPT_TAIL_TOKENS = 32;
  const std::span<const int> tail = std::span(g.prompt).last(std::min(g.prompt.size(), PROMPT_TAIL_TOKENS));
  return ReasoningSplit{markers, text::prompt_opens_reasoning(markers, model.tokenizer->decode_ids(tail, false))};
}

// The GBNF the answer must follow ("": none): the client's grammar, its response_format's JSON, or
// a call of its tools when tool_choice requires one. Compiled here once (into `compiled`), so that a
// grammar that does not compile is a 400 naming where (the devices' compiles of it then find this one).
std::string HttpServer::Impl::output_grammar(const GenerationRequest& g, std::optional<text::ToolCallFormat> tool_format,
                                             engine::TokenConstraintFactory& compiled) const {
  std::string grammar, param;
  const auto schema_rules = [](const nlohmann::ordered_json& schema, const std::string& prefix) { return grammar::json_schema_to_gbnf(schema, prefix); };
  try {
    switch (g.format.kind) {
      case OutputFormat::Kind::grammar: grammar = g.format.grammar, param = "grammar"; break;
      case OutputFormat::Kind::json_object: grammar = grammar::json_object_gbnf(), param = "response_format"; break;
      case OutputFormat::Kind::json_schema:
        param = "response_format.json_schema.schema";
        grammar = grammar::json_schema_to_gbnf(g.format.schema);
        break;
      case OutputFormat::Kind::text: break;
    }
    const bool call_required = g.tool_choice.mode == ToolChoice::Mode::required || g.tool_choice.mode == ToolChoice::Mode::function;
    if (call_required && tool_format) {
      param = "tools";
      grammar = text::tool_call_grammar(*tool_format, g.tools, g.tool_choice.function, g.parallel_tool_calls, schema_rules);
    }
    if (grammar.empty()) return grammar;
    if (!model.compile_grammar) throw ApiError(400, "This server does not constrain answers to grammars.", param);
    compiled = model.compile_grammar(grammar);
  } catch (const std::invalid_argument& e) {
    throw ApiError(400, std::string(e.what()).substr(0, 300), param);
  }
  return grammar;
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

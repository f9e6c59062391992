// tpcli::serve — the OpenAI-compatible HTTP front of an EngineService (over http_connections.h).
//
// Routes: POST /v1/chat/completions and /v1/completions (whole answers, or server-sent events),
// GET /v1/models, /health, /metrics (Prometheus), /status (the chat page's), POST /tokenize and
// /detokenize, GET / (the chat page). Every error is OpenAI's shape; a path no route has is 404, a
// method its route does not take 405.
//
// Hostile input: a Content-Length past max_body_bytes gets 413 before the body is read, a POST
// without one or with a chunked body 411, two different ones 400, a head past 8 KB 431; a body's
// JSON is bounded in depth and in values while it is parsed (api_request.h); a request head must
// arrive whole within header_timeout and an idle connection goes after keep_alive; waiting
// connections hold no thread, and /health is answered even when every connection thread is busy;
// error bodies never echo the request. The listening socket takes SO_REUSEADDR only, so a port
// another server holds is an error, never shared.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "serve/engine_service.h"
#include "text/chat_template.h"
#include "text/tokenizer_interface.h"

namespace tpcli::serve {

// The model as the server presents it.
struct ServedModel {
  std::string name;
  const text::TokenizerInterface* tokenizer = nullptr;
  std::optional<text::ChatTemplate> chat_template;  // none: chat requests are refused, naming --template
  text::ChatTokens chat_tokens;
  std::vector<int> stop_ids;          // end of sequence and of an assistant turn
  std::string mesh, backend;          // "model=2", "threads"
  int devices = 1;
  std::vector<std::string> holds;     // what each device holds, a line each
  GrammarCompiler compile_grammar;    // the devices' (ServiceOptions): requests' grammars are checked with it; unset: refused
};

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                    // 0: any free port
  std::string api_key;                // "": no key asked
  // 1 MB: the longest context's prompt as text or token ids fits; a body's parse costs a bounded
  // multiple of it (api_request.h), so concurrent bodies cannot take the machine's memory.
  size_t max_body_bytes = 1u << 20;
  int max_connections = 1024;  // connection threads: requests running at once (more wait)
  std::chrono::milliseconds read_timeout{10'000};   // a body's whole arrival; each wait to write
  std::chrono::milliseconds keep_alive{5'000};      // an idle connection's wait for its next request
  std::chrono::milliseconds header_timeout{10'000}; // a request head's whole arrival, first byte to last
  // Why the devices cannot answer now (a peer process frozen in a collective), or nothing: /health
  // then answers 503 {"status": "stuck", "error": why} instead of ok. Unset: always ok.
  std::function<std::optional<std::string>()> devices_stuck;
};

class HttpServer {
 public:
  HttpServer(EngineService& service, ServedModel model, ServerOptions options);
  ~HttpServer();
  // Binds the port (a std::runtime_error naming host:port when it cannot); returns it.
  int bind();
  // Serves until stop(); waits for the engine to be ready first.
  void listen();
  // Stops accepting; requests in progress go on.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpcli::serve

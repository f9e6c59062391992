// tpcli::serve — the OpenAI-compatible HTTP front of an EngineService (cpp-httplib).
//
// Routes: POST /v1/chat/completions and /v1/completions (whole answers, or server-sent events),
// GET /v1/models, /health, /metrics (Prometheus), /status (the chat page's), POST /tokenize and
// /detokenize, GET / (the chat page). Every error is OpenAI's shape.
//
// Hostile input: a Content-Length past max_body_bytes gets 413 before the body is read, a POST
// without one or with a chunked body 411, headers past 8 KB in all 431 (one line past 8 KB:
// httplib's 400); JSON nesting is bounded (api_request.h); each connection has a thread of its own (up
// to max_connections, the rest wait), so idle or slow connections never starve /health; reads
// time out; error bodies never echo the request. The listening socket takes SO_REUSEADDR only,
// so a port another server holds is an error, never shared.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/chat_template.h"
#include "model/tokenizer_interface.h"
#include "serve/engine_service.h"

namespace tpcli::serve {

// The model as the server presents it.
struct ServedModel {
  std::string name;
  const model::TokenizerInterface* tokenizer = nullptr;
  std::optional<model::ChatTemplate> chat_template;  // none: chat requests are refused, naming --template
  model::ChatTokens chat_tokens;
  std::vector<int> stop_ids;          // end of sequence and of an assistant turn
  std::string mesh, backend;          // "model=2", "threads"
  int devices = 1;
  std::vector<std::string> holds;     // what each device holds, a line each
};

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                    // 0: any free port
  std::string api_key;                // "": no key asked
  size_t max_body_bytes = 8u << 20;
  int max_connections = 1024;
  std::chrono::seconds read_timeout{10}, keep_alive{5};
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

// tpcli::serve — a small HTTP/1.1 server layer: request heads parsed with hard limits,
// Content-Length bodies, keep-alive and pipelining, whole or chunked answers, TCP_NODELAY.
//
// Why our own and not cpp-httplib (Debian's 0.11.4, which this replaced): its read timeout is per
// recv(), so a client trickling a header byte every few seconds holds a connection thread for
// ever (1,025 of them starved every route); it gives each request a fresh read buffer, so a second
// request sent in the same write as the first is lost (pipelining); it reads a body past its limit
// before refusing it, takes any Transfer-Encoding, accepts two different Content-Lengths, and
// answers nothing to a client that half-closed after its request.
//
// Threads: one listening thread polls every connection that waits for a request head (an idle
// or slow connection costs a descriptor and its bytes so far, never a thread), with a deadline
// for the whole head. A complete head goes to a connection thread (up to max_threads; the rest
// wait in order) that reads the body, runs the handler and writes the answer, then gives the
// connection back. Cheap routes (/health) are answered on the listening thread itself, so they
// are answered when every connection thread is busy.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tpcli::serve {

struct HttpRequest {
  std::string method, path, version;  // path: without its query, percent-decoded
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-case, as sent
  std::string body;
  bool keep_alive = true;  // HTTP/1.1 unless "Connection: close"; HTTP/1.0 only with "keep-alive"
  // The value of the first header `name` (lower-case), "" when absent.
  std::string_view header(std::string_view name) const;
  bool has_header(std::string_view name) const;
};

// Writes one chunk of a chunked answer; false when the client is gone.
using ChunkWriter = std::function<bool(std::string_view bytes)>;

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json", body;
  std::vector<std::pair<std::string, std::string>> headers;
  // Set: the answer is chunked, its body written by this (false: the client left mid-answer).
  std::function<bool(const ChunkWriter& write)> chunks;
  bool close = false;  // the connection closes after this answer
  void set_header(std::string name, std::string value) { headers.emplace_back(std::move(name), std::move(value)); }
};

// Request heads as sent: the request line and every header, in bytes.
constexpr size_t MAX_HEAD_BYTES = 8u << 10;

// Reads the request head at the start of `bytes` into `request`; returns the head's length in
// bytes, 0 while it is not complete. Throws ApiError: 431 past MAX_HEAD_BYTES, 400 when malformed.
size_t parse_request_head(std::string_view bytes, HttpRequest& request);

// The body length the head announces, checked: 411 without a Content-Length on a POST or with
// a Transfer-Encoding, 413 past `max_body_bytes`, 400 for two different Content-Lengths or one
// that is not a number.
size_t body_length(const HttpRequest& request, size_t max_body_bytes);

struct HttpRoutes {
  std::function<void(const HttpRequest&, HttpResponse&)> handle;  // on a connection thread
  std::function<bool(const HttpRequest&)> answers_at_once;        // cheap: answered on the listening thread
  std::function<void(int status)> answered;                       // each answer's status, for /metrics
};

struct ConnectionLimits {
  size_t max_body_bytes = 1u << 20;
  int max_threads = 1024;
  std::chrono::milliseconds head_timeout{10'000};  // from a request head's first byte to its last
  std::chrono::milliseconds keep_alive{5'000};      // an idle connection's wait for a next request
  std::chrono::milliseconds io_timeout{10'000};     // a body's whole arrival; each wait for room to write
};

class HttpConnections {
 public:
  HttpConnections(HttpRoutes routes, ConnectionLimits limits);
  ~HttpConnections();
  // Binds and listens (SO_REUSEADDR only: a port another server holds is an error); returns the port.
  int bind(const std::string& host, int port);
  // Serves until stop(); then closes idle connections and waits a little for busy ones.
  void run();
  // Stops accepting; requests in progress go on. Safe from any thread, before or during run().
  void stop();
  // Connection threads still running (a straggler past run()'s wait).
  int busy_threads() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace tpcli::serve

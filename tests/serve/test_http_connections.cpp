// serve/: the HTTP/1.1 layer's request heads and body framing, byte by byte: heads that are not
// complete yet, pipelined heads, keep-alive by version, and each refusal with its status; a
// handler or a streamed answer that throws costs its request only.
#include <catch2/catch.hpp>

#include <httplib.h>

#include <stdexcept>
#include <string>
#include <thread>

#include "serve/api_request.h"
#include "serve/http_connections.h"

using namespace tpcli::serve;

namespace {

// The status parse_request_head or body_length refuses `bytes` with (0: none).
int refusal_status(const std::string& bytes, size_t max_body = 100) {
  try {
    HttpRequest r;
    if (parse_request_head(bytes, r) > 0) body_length(r, max_body);
  } catch (const ApiError& e) {
    return e.status();
  }
  return 0;
}

}  // namespace

TEST_CASE("http: a head is read whole, pipelined heads one at a time, keep-alive by version") {
  HttpRequest r;
  CHECK(parse_request_head("GET /health HTTP/1.1\r\nHost: x\r\n", r) == 0);  // not complete yet
  const std::string first = "GET /v1/models/my%20model?x=1 HTTP/1.1\r\nHost: x\r\nX-Padded:  a b \r\n\r\n";
  const std::string both = first + "GET /health HTTP/1.0\r\n\r\n";
  REQUIRE(parse_request_head(both, r) == first.size());
  CHECK(r.method == "GET");
  CHECK(r.path == "/v1/models/my model");
  CHECK(r.header("x-padded") == "a b");
  CHECK(r.keep_alive);
  REQUIRE(parse_request_head(std::string_view(both).substr(first.size()), r) == both.size() - first.size());
  CHECK(r.path == "/health");
  CHECK_FALSE(r.keep_alive);  // HTTP/1.0 without "Connection: keep-alive"
  REQUIRE(parse_request_head("\r\nPOST /x HTTP/1.1\r\nConnection: Close\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", r) > 0);
  CHECK_FALSE(r.keep_alive);
  CHECK(body_length(r, 5) == 5);  // the same length twice is one length
}

TEST_CASE("http: malformed heads are 400, long ones 431, and body framing 400, 411 or 413") {
  CHECK(refusal_status("GET /x\r\n\r\n") == 400);
  CHECK(refusal_status("get /x HTTP/1.1\r\n\r\n") == 400);
  CHECK(refusal_status("GET x HTTP/1.1\r\n\r\n") == 400);
  CHECK(refusal_status("GET /x HTTP/2\r\n\r\n") == 400);
  CHECK(refusal_status("GET /%zz HTTP/1.1\r\n\r\n") == 400);
  CHECK(refusal_status("GET /x HTTP/1.1\r\nA: b\r\n folded\r\n\r\n") == 400);
  CHECK(refusal_status("GET /x HTTP/1.1\r\nNo colon\r\n\r\n") == 400);
  CHECK(refusal_status("GET /x HTTP/1.1\r\nA: b\nC: d\r\n\r\n") == 400);
  CHECK(refusal_status("GET /x HTTP/1.1\r\nX: " + std::string(MAX_HEAD_BYTES, 'a')) == 431);  // not complete, already too long
  std::string empty_lines;
  for (size_t i = 0; i < MAX_HEAD_BYTES; ++i) empty_lines += "\r\n";
  CHECK(refusal_status(empty_lines) == 431);  // an endless stream of empty lines is not free
  CHECK(refusal_status("POST /x HTTP/1.1\r\n\r\n") == 411);
  CHECK(refusal_status("POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n") == 411);
  CHECK(refusal_status("POST /x HTTP/1.1\r\nContent-Length: 101\r\n\r\n") == 413);
  CHECK(refusal_status("POST /x HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n") == 413);
  CHECK(refusal_status("POST /x HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n") == 400);
  CHECK(refusal_status("POST /x HTTP/1.1\r\nContent-Length: -1\r\n\r\n") == 400);
  CHECK(refusal_status("POST /x HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n") == 400);
  CHECK(refusal_status("GET /x HTTP/1.1\r\n\r\n") == 0);
}

TEST_CASE("http: a streamed answer or a handler that throws ends its own request, and the server goes on") {
  HttpRoutes routes;
  routes.handle = [](const HttpRequest& q, HttpResponse& r) {
    if (q.path == "/throws") throw std::runtime_error("the handler failed");
    if (q.path != "/stream-throws") return void(r.body = "fine");
    r.chunks = [](const ChunkWriter& write) -> bool {
      write("data: one\n\n");
      throw std::runtime_error("the stream failed midway");
    };
  };
  routes.answers_at_once = [](const HttpRequest&) { return false; };
  routes.answered = [](int) {};
  HttpConnections server(routes, ConnectionLimits{});
  const int port = server.bind("127.0.0.1", 0);
  std::thread listener([&] { server.run(); });
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(5);
  const auto handler_threw = c.Get("/throws");
  REQUIRE(handler_threw);
  CHECK(handler_threw->status == 500);
  for (int i = 0; i < 3; ++i) {
    httplib::Client fresh("127.0.0.1", port);
    fresh.set_read_timeout(5);
    const auto cut = fresh.Get("/stream-throws");  // the chunked answer stops short: the connection closes
    CHECK((!cut || cut->body.find("data: one") != std::string::npos));
  }
  const auto after = c.Get("/fine");
  REQUIRE(after);
  CHECK(after->status == 200);
  CHECK(after->body == "fine");
  server.stop();
  listener.join();
}

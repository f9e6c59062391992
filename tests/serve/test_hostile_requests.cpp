// serve/: hostile clients against a live server (stories260K): truncated bodies, invalid UTF-8,
// huge numbers, JSON nested 10,000 deep, a 100 MB body announced but not sent, 10 KB of headers,
// wrong or missing content; each gets a 4xx in OpenAI's shape that never echoes the body, and the
// server still answers /health and a small completion after it. Then 200 idle connections and 16
// slowloris ones (a header byte a second) while /health keeps answering within a second; 1,100
// slowloris ones, and a head's deadline counted in total; concurrent bodies of empty objects under
// a bounded peak RSS; HTTP/1.1 as clients use it (pipelining, half-close, 405, two Content-Lengths,
// keep-alive answers without a delayed ACK).
// Raw sockets send what httplib's client will not; Catch2 assertions stay on the main thread.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "live_server.h"

using namespace tpcli;
using namespace tpcli::testing;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* MARKER = "HOSTILE-MARKER-7f3a";  // in every bad body: an answer must never hold it

// A TCP connection to the server, closed when it goes (no assertions: used on threads too).
class RawConnection {
 public:
  explicit RawConnection(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd_ >= 0 && ::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) close();
  }
  ~RawConnection() { close(); }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  bool open() const { return fd_ >= 0; }
  bool send(const std::string& bytes) {
    for (size_t done = 0; done < bytes.size();) {
      const ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }
  // True when the peer closes within `wait` (whatever it sends before is dropped).
  bool closed_by_peer(std::chrono::milliseconds wait) {
    const auto deadline = Clock::now() + wait;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      pollfd p{fd_, POLLIN, 0};
      if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) return false;
      char buf[4096];
      if (::recv(fd_, buf, sizeof buf, 0) <= 0) return true;
    }
  }
  void shutdown_write() { ::shutdown(fd_, SHUT_WR); }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // Every byte until the peer closes or `wait` passes.
  std::string until_closed(std::chrono::milliseconds wait) {
    std::string in;
    const auto deadline = Clock::now() + wait;
    while (read_more(in, deadline)) {
    }
    return in;
  }
  // One HTTP response (headers, then Content-Length bytes of body), or what came before the peer
  // closed or `wait` passed.
  std::string response(std::chrono::milliseconds wait = std::chrono::seconds(5)) {
    std::string in;
    const auto deadline = Clock::now() + wait;
    do {
      if (const size_t head = in.find("\r\n\r\n"); head != std::string::npos) {
        const size_t at = in.find("Content-Length: ");
        if (at == std::string::npos || at > head) return in;
        if (in.size() >= head + 4 + std::stoul(in.substr(at + 16))) return in;
      }
    } while (read_more(in, deadline));
    return in;
  }

 private:
  // Appends what arrives before `deadline`; false once the peer closed or the deadline passed.
  bool read_more(std::string& in, Clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    pollfd p{fd_, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) return false;
    char buf[4096];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) return false;
    in.append(buf, static_cast<size_t>(n));
    return true;
  }

  int fd_ = -1;
};

int status_of(const std::string& response) {
  return response.starts_with("HTTP/1.1 ") ? std::atoi(response.c_str() + 9) : 0;
}
std::string body_of(const std::string& response) {
  const size_t head = response.find("\r\n\r\n");
  return head == std::string::npos ? "" : response.substr(head + 4);
}

std::string post_request(const std::string& path, const std::string& body, const std::string& content_type = "application/json") {
  return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: " + content_type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

// A whole request over a fresh connection; the raw response.
std::string round_trip(int port, const std::string& request) {
  RawConnection c(port);
  REQUIRE(c.open());
  REQUIRE(c.send(request));
  return c.response();
}

// A refusal: 4xx, OpenAI's error shape, short, and none of the body it refuses.
void check_refused(const std::string& response, int status = 0) {
  INFO(response.substr(0, 400));
  const int got = status_of(response);
  if (status) CHECK(got == status);
  CHECK(got >= 400);
  CHECK(got < 500);
  const std::string body = body_of(response);
  CHECK(body.size() < 1024);
  CHECK(body.find(MARKER) == std::string::npos);
  const json parsed = json::parse(body, nullptr, false);
  REQUIRE_FALSE(parsed.is_discarded());
  REQUIRE(parsed.contains("error"));
  CHECK(parsed["error"]["message"].is_string());
}

// The server still answers: /health, and a small completion.
void check_still_serves(LiveServer& server) {
  httplib::Client c = server.client();
  const auto health = c.Get("/health");
  REQUIRE(health);
  CHECK(health->status == 200);
  const auto done = c.Post("/v1/completions", json{{"prompt", "Once upon a time"}, {"max_tokens", 3}}.dump(), "application/json");
  REQUIRE(done);
  INFO(done->body);
  CHECK(done->status == 200);
  CHECK(json::parse(done->body)["usage"]["completion_tokens"].get<int>() >= 1);
}

// Sends `start`, then `trickle` every 100 ms until the server closes the connection; the seconds
// that took (5 or more: it never closed within 5 s).
double seconds_until_closed(int port, const std::string& start, const std::string& trickle) {
  RawConnection c(port);
  REQUIRE(c.send(start));
  const auto begin = Clock::now();
  while (Clock::now() - begin < std::chrono::seconds(5))
    if (!c.send(trickle) || c.closed_by_peer(std::chrono::milliseconds(100))) break;
  return std::chrono::duration<double>(Clock::now() - begin).count();
}

std::string nested(int depth) { return std::string(static_cast<size_t>(depth), '[') + std::string(static_cast<size_t>(depth), ']'); }

}  // namespace

TEST_CASE("serve hostile: truncated bodies, invalid UTF-8, huge numbers and deep nesting are refused, and the server goes on", "[serve]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  LiveServer server(1);
  const int port = server.port();

  SECTION("a body shorter than its Content-Length, the client gone") {
    for (const bool half_close : {false, true}) {
      RawConnection c(port);
      REQUIRE(c.open());
      REQUIRE(c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                     "{\"prompt\": \"" + std::string(MARKER) + "\""));
      if (half_close) {  // the client says it sends no more: the server sees the end early; no 5xx, no echo
        c.shutdown_write();
        const std::string answer = c.response(std::chrono::seconds(3));
        INFO(answer);
        CHECK(status_of(answer) < 500);
        CHECK(answer.find(MARKER) == std::string::npos);
      }
      c.close();
    }
    RawConnection c(port);
    REQUIRE(c.open());
    REQUIRE(c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{\"prompt\""));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    c.close();
    check_still_serves(server);
  }
  SECTION("invalid UTF-8 in a JSON string, a key, a chat message, and an escaped lone surrogate") {
    const std::string m = MARKER;
    check_refused(round_trip(port, post_request("/v1/completions", "{\"prompt\": \"" + m + " caf\xff\xfe\", \"max_tokens\": 2}")), 400);
    check_refused(round_trip(port, post_request("/v1/completions", "{\"prompt\": \"" + m + "\", \"\xc3\x28\": 1}")), 400);
    check_refused(round_trip(port, post_request("/v1/chat/completions",
                                              "{\"messages\": [{\"role\": \"user\", \"content\": \"" + m + "\xed\xa0\x80\"}]}")), 400);
    check_refused(round_trip(port, post_request("/v1/completions", "{\"prompt\": \"" + m + "\\ud800\", \"max_tokens\": 2}")), 400);
    // Valid UTF-8 a key cuts in half where it echoes a name (64 bytes): the answer is still JSON.
    const std::string key = std::string(63, 'k') + "\xc3\xa9\xc3\xa9";
    check_refused(round_trip(port, post_request("/v1/completions", "{\"prompt\": \"" + m + "\", \"" + key + "\": 1}")), 400);
    check_still_serves(server);
  }
  SECTION("an unknown argument with a 100 KB name is named cut short") {
    const std::string key = std::string(100 << 10, 'k') + MARKER;  // past the 64 bytes echoed
    check_refused(round_trip(port, post_request("/v1/completions", "{\"prompt\": \"x\", \"" + key + "\": 1}")), 400);
    check_still_serves(server);
  }
  SECTION("numbers past every range") {
    const std::string m = MARKER;
    for (const std::string field : {"\"max_tokens\": 1e999", "\"max_tokens\": 123456789012345678901234567890",
                                    "\"max_tokens\": -123456789012345678901234567890", "\"temperature\": 1e999",
                                    "\"temperature\": 123456789012345678901234567890", "\"seed\": 123456789012345678901234567890",
                                    "\"seed\": 1e999", "\"top_p\": -1e999", "\"logprobs\": 18446744073709551617"}) {
      INFO(field);
      check_refused(round_trip(port, post_request("/v1/completions", "{\"prompt\": \"" + m + "\", " + field + "}")), 400);
    }
    check_refused(round_trip(port, post_request("/v1/completions", "{\"prompt\": [123456789012345678901234567890], \"user\": \"" + m + "\"}")), 400);
    check_refused(round_trip(port, post_request("/v1/completions", "{\"prompt\": [18446744073709551615], \"user\": \"" + m + "\"}")), 400);
    check_still_serves(server);
  }
  SECTION("JSON nested 10,000 deep: a short 400, the tree never built") {
    const std::string m = MARKER;
    check_refused(round_trip(port, post_request("/v1/completions", "{\"prompt\": " + nested(10000) + ", \"user\": \"" + m + "\"}")), 400);
    check_refused(round_trip(port, post_request("/v1/chat/completions", std::string(10000, '{') + "\"" + m + "\"")), 400);
    check_refused(round_trip(port, post_request("/tokenize", nested(10000))), 400);
    check_still_serves(server);
  }
}

TEST_CASE("serve hostile: a 100 MB body is 413 unread, 10 KB of headers are 4xx, and wrong or missing content is refused", "[serve]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  LiveServer server(1);
  const int port = server.port();

  SECTION("a 100 MB body announced by Content-Length, 4 KB of it sent") {
    RawConnection c(port);
    REQUIRE(c.open());
    const auto start = Clock::now();
    REQUIRE(c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 104857600\r\n\r\n" +
                   std::string(4096, ' ')));
    const std::string answer = c.response(std::chrono::seconds(3));
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    check_refused(answer, 413);
    CHECK(seconds < 1.0);
    CHECK(c.closed_by_peer(std::chrono::seconds(2)));  // the unread body is never parsed as a request
    c.close();
    // And a Content-Length no size_t holds.
    check_refused(round_trip(port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n{}"));
    check_still_serves(server);
  }
  SECTION("10 KB of headers, in one header and in many") {
    check_refused(round_trip(port, "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(10240, 'a') + "\r\n\r\n"));
    std::string many = "GET /health HTTP/1.1\r\nHost: x\r\n";
    for (int i = 0; i < 200; ++i) many += "X-Filler-" + std::to_string(i) + ": " + std::string(40, 'b') + "\r\n";
    REQUIRE(many.size() > 10240);
    check_refused(round_trip(port, many + "\r\n"));
    check_refused(round_trip(port, "GET /" + std::string(10240, 'p') + " HTTP/1.1\r\nHost: x\r\n\r\n"));
    check_still_serves(server);
  }
  SECTION("a wrong Content-Type, no body, a bad chunked body") {
    const std::string valid = json{{"prompt", "Once"}, {"max_tokens", 2}}.dump();
    for (const char* type : {"text/plain", "application/x-www-form-urlencoded", "application/octet-stream"}) {
      INFO(type);  // JSON under another name is still read as JSON (curl -d says form-urlencoded)
      const std::string answer = round_trip(port, post_request("/v1/completions", valid, type));
      CHECK(status_of(answer) == 200);
    }
    check_refused(round_trip(port, post_request("/v1/completions", std::string(MARKER) + "=1&b=2", "application/x-www-form-urlencoded")), 400);
    check_refused(round_trip(port, post_request("/v1/completions",
                                              "--xyz\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\n" + std::string(MARKER) + "\r\n--xyz--\r\n",
                                              "multipart/form-data; boundary=xyz")));
    check_refused(round_trip(port, post_request("/v1/chat/completions", "")), 400);
    check_refused(round_trip(port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"), 411);  // not read to EOF
    check_refused(round_trip(port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
                                 "zz\r\n" + std::string(MARKER) + "\r\n0\r\n\r\n"));
    check_refused(round_trip(port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
                                 "ffffffffffffffffff\r\n" + std::string(MARKER) + "\r\n0\r\n\r\n"));
    check_still_serves(server);
  }
}

TEST_CASE("serve hostile: 200 idle connections and 16 slowloris ones leave /health answering within a second", "[serve]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  LiveServer server(1);
  const int port = server.port();
  std::vector<std::unique_ptr<RawConnection>> idle;
  for (int i = 0; i < 200; ++i) idle.push_back(std::make_unique<RawConnection>(port));
  std::vector<std::unique_ptr<RawConnection>> slow;
  for (int i = 0; i < 16; ++i) slow.push_back(std::make_unique<RawConnection>(port));
  const int opened = static_cast<int>(std::ranges::count_if(idle, [](const auto& c) { return c->open(); }) +
                                      std::ranges::count_if(slow, [](const auto& c) { return c->open(); }));
  REQUIRE(opened == 216);

  std::atomic<bool> done{false};
  std::atomic<int> slow_bytes{0};
  std::thread trickle([&] {  // a header byte a second on each slow connection, never finishing the headers
    const std::string head = "GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    for (auto& c : slow) c->send(head);
    while (!done) {
      for (auto& c : slow)
        if (c->send("a")) ++slow_bytes;
      for (int i = 0; i < 20 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });

  std::vector<double> latencies;
  const auto until = Clock::now() + std::chrono::seconds(4);
  while (Clock::now() < until) {
    httplib::Client c("127.0.0.1", port);
    c.set_connection_timeout(2);
    c.set_read_timeout(2);
    const auto start = Clock::now();
    const auto health = c.Get("/health");
    latencies.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    CHECK((health && health->status == 200));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  httplib::Client c = server.client();
  const auto completion = c.Post("/v1/completions", json{{"prompt", "Once upon a time"}, {"max_tokens", 3}}.dump(), "application/json");
  done = true;
  trickle.join();

  REQUIRE(latencies.size() >= 10);
  for (const double s : latencies) CHECK(s < 1.0);
  CHECK(slow_bytes >= 16 * 3);  // the slow connections were still open and trickling
  REQUIRE(completion);
  CHECK(completion->status == 200);
}

namespace {

// The process's resident set: now, and its peak since reset_peak_rss() (Linux's VmHWM).
size_t rss_kb(const std::string& field) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.starts_with(field + ":")) return std::stoul(line.substr(field.size() + 1));
  return 0;
}
void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

// /health's latencies over `seconds`, a fresh connection each, none waiting over 2 s.
std::vector<double> health_latencies(int port, int seconds) {
  std::vector<double> latencies;
  const auto until = Clock::now() + std::chrono::seconds(seconds);
  while (Clock::now() < until) {
    httplib::Client c("127.0.0.1", port);
    c.set_connection_timeout(2);
    c.set_read_timeout(2);
    const auto start = Clock::now();
    const auto health = c.Get("/health");
    latencies.push_back(health && health->status == 200 ? std::chrono::duration<double>(Clock::now() - start).count() : 99.0);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return latencies;
}

}  // namespace

TEST_CASE("serve hostile: 1,100 connections trickling their heads hold no route, and a head's deadline is total", "[serve]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  SECTION("1,100 slowloris connections, more than the 1,024 connection threads") {
    LiveServer server(1);
    std::vector<std::unique_ptr<RawConnection>> slow;
    for (int i = 0; i < 1100; ++i) slow.push_back(std::make_unique<RawConnection>(server.port()));
    REQUIRE(std::ranges::all_of(slow, [](const auto& c) { return c->open(); }));
    std::atomic<bool> done{false};
    std::thread trickle([&] {  // a header byte a second on each, never finishing the head
      for (auto& c : slow) c->send("GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ");
      while (!done) {
        for (auto& c : slow) c->send("a");
        for (int i = 0; i < 20 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
    const std::vector<double> latencies = health_latencies(server.port(), 3);
    httplib::Client c = server.client();
    const auto completion = c.Post("/v1/completions", json{{"prompt", "Once upon a time"}, {"max_tokens", 3}}.dump(), "application/json");
    done = true;
    trickle.join();
    REQUIRE(latencies.size() >= 5);
    for (const double s : latencies) CHECK(s < 1.0);
    REQUIRE(completion);
    CHECK(completion->status == 200);
  }
  SECTION("every connection thread held by a body that does not come: /health is still answered") {
    serve::ServerOptions options;
    options.max_connections = 2;
    LiveServer server(1, {}, options);
    std::vector<std::unique_ptr<RawConnection>> stalled;
    for (int i = 0; i < 3; ++i) {  // two hold the threads, the third waits for one
      stalled.push_back(std::make_unique<RawConnection>(server.port()));
      REQUIRE(stalled.back()->send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const std::vector<double> latencies = health_latencies(server.port(), 1);
    REQUIRE_FALSE(latencies.empty());
    for (const double s : latencies) CHECK(s < 1.0);
  }
  SECTION("a head trickled a byte every 100 ms is closed at its deadline, whatever each byte's wait") {
    serve::ServerOptions options;
    options.header_timeout = std::chrono::milliseconds(1000);
    LiveServer server(1, {}, options);
    CHECK(seconds_until_closed(server.port(), "GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ", "a") < 2.5);
    check_still_serves(server);
  }
  SECTION("a body trickled a byte every 100 ms is dropped at its deadline too") {
    serve::ServerOptions options;
    options.read_timeout = std::chrono::milliseconds(1000);
    LiveServer server(1, {}, options);
    CHECK(seconds_until_closed(server.port(), "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{", " ") < 2.5);
  }
}

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr bool UNDER_SANITIZER = true;
#else
constexpr bool UNDER_SANITIZER = false;
#endif

TEST_CASE("serve hostile: 8 concurrent bodies of empty objects at the body limit cost a bounded memory", "[serve]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  LiveServer server(1);
  const size_t limit = serve::ServerOptions{}.max_body_bytes;
  CHECK(limit <= (2u << 20));  // well below the 8 MB that was the default
  std::string body = "{\"prompt\": \"x\", \"foo\": [{}";
  while (body.size() + 8 < limit) body += ",{}";
  body += "]}";
  reset_peak_rss();
  const size_t before = rss_kb("VmRSS");
  std::vector<std::string> answers(8);
  std::vector<std::thread> clients;
  for (size_t i = 0; i < answers.size(); ++i)
    clients.emplace_back([&, i] {
      RawConnection c(server.port());
      if (c.send(post_request("/v1/completions", body))) answers[i] = c.response(std::chrono::seconds(20));
    });
  for (std::thread& t : clients) t.join();
  const size_t peak = rss_kb("VmHWM");
  INFO("RSS " << before / 1024 << " MB before, peak " << peak / 1024 << " MB");
  for (const std::string& answer : answers) check_refused(answer, 400);
  // ~10 MB each with the client's copies; 8 MB bodies took ~280 MB each. Under a sanitizer every
  // allocation carries shadow and history, so the bound holds for the plain build only.
  if (!UNDER_SANITIZER) CHECK(peak - before < 200u << 10);
  // A body past the limit is 413, unread.
  check_refused(round_trip(server.port(), "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(limit + 1) + "\r\n\r\n{}"), 413);
  check_still_serves(server);
}

TEST_CASE("serve hostile: HTTP/1.1 as clients use it: pipelining, half-close, 405, two Content-Lengths, no delayed ACK", "[serve]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  LiveServer server(1);
  const int port = server.port();
  const std::string completion = json{{"prompt", "Once upon a time"}, {"max_tokens", 3}}.dump();

  SECTION("two GETs in one write get two answers, in order, at once") {
    RawConnection c(port);
    REQUIRE(c.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
    const auto start = Clock::now();
    const std::string both = c.until_closed(std::chrono::seconds(3));
    INFO(both);
    CHECK(std::chrono::duration<double>(Clock::now() - start).count() < 1.0);
    const size_t second = both.find("HTTP/1.1 200", 1);
    CHECK(both.starts_with("HTTP/1.1 200"));
    REQUIRE(second != std::string::npos);
    CHECK(both.find("\"status\":\"ok\"") < second);
    CHECK(both.find("stories260K", second) != std::string::npos);
  }
  SECTION("a POST and its body, then the client half-closes: the answer still comes") {
    RawConnection c(port);
    REQUIRE(c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(completion.size()) + "\r\n\r\n" + completion));
    c.shutdown_write();
    const std::string answer = c.response(std::chrono::seconds(10));
    INFO(answer);
    CHECK(status_of(answer) == 200);
    CHECK(body_of(answer).find("text_completion") != std::string::npos);
  }
  SECTION("a method the path does not take is 405, naming the ones it does") {
    const std::string post_health = round_trip(port, post_request("/health", "{}"));
    check_refused(post_health, 405);
    CHECK(post_health.find("Allow: GET") != std::string::npos);
    check_refused(round_trip(port, "GET /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"), 405);
    check_refused(round_trip(port, "DELETE /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"), 405);
    check_refused(round_trip(port, "GET /v2/nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"), 404);
  }
  SECTION("two different Content-Lengths are 400, and the connection closes") {
    RawConnection c(port);
    REQUIRE(c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(completion.size()) +
                   "\r\nContent-Length: 5\r\n\r\n" + completion));
    check_refused(c.response(), 400);
    CHECK(c.closed_by_peer(std::chrono::seconds(2)));
  }
  SECTION("requests on a reused keep-alive connection answer without waiting for a delayed ACK (TCP_NODELAY)") {
    httplib::Client c = server.client();
    c.set_keep_alive(true);
    REQUIRE(c.Get("/v1/models"));
    std::vector<double> ms;
    for (int i = 0; i < 15; ++i) {
      const auto start = Clock::now();
      const auto res = i % 2 ? c.Get("/v1/models") : c.Post("/tokenize", R"({"content": "Once"})", "application/json");
      REQUIRE(res);
      CHECK(res->status == 200);
      ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    }
    std::ranges::sort(ms);
    INFO("median " << ms[ms.size() / 2] << " ms");
    CHECK(ms[ms.size() / 2] < 20.0);  // ~43 ms each when the answer's second segment waited for the client's ACK
  }
  check_still_serves(server);
}

// tpcli::serve — the HTTP/1.1 layer (see http_connections.h).
#include "serve/http_connections.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

#include "serve/api_request.h"
#include "serve/openai_shapes.h"

namespace tpcli::serve {

namespace {

using Clock = std::chrono::steady_clock;

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trimmed(std::string_view s) {
  const size_t first = s.find_first_not_of(" \t");
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t") - first + 1);
}

ApiError malformed(const std::string& what) { return ApiError(400, "The request is malformed: " + what + "."); }

// "%2F" as "/"; a '%' without two hex digits is malformed.
std::string percent_decoded(std::string_view path) {
  std::string out;
  for (size_t i = 0; i < path.size(); ++i) {
    if (path[i] != '%') {
      out += path[i];
      continue;
    }
    unsigned value = 0;
    if (i + 2 >= path.size() || std::from_chars(path.data() + i + 1, path.data() + i + 3, value, 16).ptr != path.data() + i + 3)
      throw malformed("a '%' in the path is not followed by two hex digits");
    out += static_cast<char>(value);
    i += 2;
  }
  return out;
}

void parse_request_line(std::string_view line, HttpRequest& request) {
  const size_t first = line.find(' '), second = line.rfind(' ');
  if (first == std::string_view::npos || first == second) throw malformed("the request line is not METHOD TARGET VERSION");
  request.method = line.substr(0, first);
  const std::string_view target = line.substr(first + 1, second - first - 1);
  request.version = line.substr(second + 1);
  if (request.method.empty() || !std::ranges::all_of(request.method, [](char c) { return c >= 'A' && c <= 'Z'; }))
    throw malformed("the method is not an upper-case word");
  if (request.version != "HTTP/1.1" && request.version != "HTTP/1.0") throw malformed("the version is not HTTP/1.1 or HTTP/1.0");
  if (!target.starts_with('/')) throw malformed("the target is not a path");
  request.path = percent_decoded(target.substr(0, target.find('?')));
}

void parse_header_line(std::string_view line, HttpRequest& request) {
  const size_t colon = line.find(':');
  if (line.starts_with(' ') || line.starts_with('\t')) throw malformed("a header continues on a second line");
  if (colon == std::string_view::npos || colon == 0 || line.substr(0, colon).find_first_of(" \t") != std::string_view::npos)
    throw malformed("a header line is not NAME: VALUE");
  request.headers.emplace_back(lower(line.substr(0, colon)), trimmed(line.substr(colon + 1)));
}

bool keeps_alive(const HttpRequest& request) {
  const std::string connection = lower(request.header("connection"));
  if (connection.find("close") != std::string::npos) return false;
  return request.version == "HTTP/1.1" || connection.find("keep-alive") != std::string::npos;
}

const char* reason(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Status";
  }
}

// One client connection; its descriptor is non-blocking and closes with it.
struct Connection {
  int fd = -1;
  std::string in;  // bytes read and not yet consumed
  Clock::time_point idle_since = Clock::now();
  std::optional<Clock::time_point> head_started;  // the first byte of the head awaited

  explicit Connection(int socket) : fd(socket) {}
  ~Connection() { ::close(fd); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Reads what has arrived; false when the peer closed or failed.
  bool read_some() {
    char buffer[16384];
    for (;;) {
      const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
      if (n > 0) {
        // ACK at once: a client that writes its head and body apart (Nagle) waits for this ACK
        // before the body leaves, ~40 ms of delayed ACK otherwise. Linux clears it as it goes.
        const int yes = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_QUICKACK, &yes, sizeof yes);
        if (in.empty() && !head_started) head_started = Clock::now();
        in.append(buffer, static_cast<size_t>(n));
        return true;
      }
      if (n < 0 && errno == EINTR) continue;
      return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    }
  }
  // Reads until `in` holds `bytes`, all within `timeout` (a body trickled a byte at a time holds
  // its connection thread no longer); false when the peer left or was too slow.
  bool read_until(size_t bytes, std::chrono::milliseconds timeout) {
    in.reserve(bytes);  // not twice a body's size by doubling
    const auto until = Clock::now() + timeout;
    while (in.size() < bytes) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
      pollfd p{fd, POLLIN, 0};
      if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0 || !read_some()) return false;
    }
    return true;
  }
  // After an answer that refused a body the client may still be sending: closing with bytes
  // unread would reset the connection, and the reset can drop the answer before the client reads
  // it. Says the end (FIN), then reads and drops what comes, for at most `wait`.
  void finish_unread(std::chrono::milliseconds wait) {
    ::shutdown(fd, SHUT_WR);
    const auto until = Clock::now() + wait;
    char dropped[16384];
    for (auto left = wait; left.count() > 0; left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now())) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return;
      const ssize_t n = ::recv(fd, dropped, sizeof dropped, 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return;
    }
  }
  bool write_all(std::string_view bytes, std::chrono::milliseconds timeout) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n > 0) {
        bytes.remove_prefix(static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) return false;
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return false;
    }
    return true;
  }
};
using ConnectionPtr = std::unique_ptr<Connection>;

// A request whose head has arrived, for a connection thread.
struct Job {
  ConnectionPtr connection;
  HttpRequest request;
  size_t head_bytes = 0;
};

HttpResponse error_response(const ApiError& e) {
  HttpResponse res;
  res.status = e.status();
  res.body = dump(e.body());
  return res;
}

std::string response_head(const HttpRequest& request, const HttpResponse& res, bool close) {
  std::string head = "HTTP/1.1 " + std::to_string(res.status) + " " + reason(res.status) + "\r\nContent-Type: " + res.content_type + "\r\n";
  for (const auto& [name, value] : res.headers) head += name + ": " + value + "\r\n";
  if (close) head += "Connection: close\r\n";
  if (res.chunks) return head + "Transfer-Encoding: chunked\r\n\r\n";
  head += "Content-Length: " + std::to_string(res.body.size()) + "\r\n\r\n";
  return request.method == "HEAD" ? head : head + res.body;  // one write: no small segment waits for an ACK
}

// Writes the answer (a whole body in one write, or chunk by chunk); false when the client left.
bool write_response(Connection& c, const HttpRequest& request, const HttpResponse& res, bool close, std::chrono::milliseconds timeout) {
  if (!c.write_all(response_head(request, res, close), timeout)) return false;
  if (!res.chunks || request.method == "HEAD") return true;
  char size[24];
  const ChunkWriter write = [&](std::string_view bytes) {
    if (bytes.empty()) return true;  // an empty chunk would end the answer
    const int n = std::snprintf(size, sizeof size, "%zx\r\n", bytes.size());
    return c.write_all(std::string(size, static_cast<size_t>(n)) + std::string(bytes) + "\r\n", timeout);
  };
  return res.chunks(write) && c.write_all("0\r\n\r\n", timeout);
}

}  // namespace

std::string_view HttpRequest::header(std::string_view name) const {
  for (const auto& [key, value] : headers)
    if (key == name) return value;
  return {};
}

bool HttpRequest::has_header(std::string_view name) const {
  return std::ranges::any_of(headers, [&](const auto& h) { return h.first == name; });
}

size_t parse_request_head(std::string_view bytes, HttpRequest& request) {
  size_t start = 0;
  while (bytes.substr(start, 2) == "\r\n") start += 2;  // empty lines before a request are ignored (RFC 9112 2.2)
  const size_t end = bytes.find("\r\n\r\n", start);
  if ((end == std::string_view::npos ? bytes.size() : end + 4) > MAX_HEAD_BYTES)  // the empty lines count: an endless stream of them is refused
    throw ApiError(431, "The request's headers are too large (over " + std::to_string(MAX_HEAD_BYTES >> 10) + " KB).");
  if (end == std::string_view::npos) return 0;
  request = HttpRequest{};
  std::string_view head = bytes.substr(start, end + 2 - start);
  for (bool first = true; !head.empty(); first = false) {
    const size_t eol = head.find("\r\n");
    const std::string_view line = head.substr(0, eol);
    head.remove_prefix(eol + 2);
    if (line.find_first_of(std::string_view("\r\n\0", 3)) != std::string_view::npos) throw malformed("a bare CR, LF or NUL in the head");
    if (first) parse_request_line(line, request);
    else parse_header_line(line, request);
  }
  request.keep_alive = keeps_alive(request);
  return end + 4;
}

size_t body_length(const HttpRequest& request, size_t max_body_bytes) {
  if (request.has_header("transfer-encoding"))
    throw ApiError(411, "Chunked request bodies are not accepted: send the body with a Content-Length.");
  std::optional<std::string_view> length;
  for (const auto& [key, value] : request.headers) {
    if (key != "content-length") continue;
    if (length && *length != value) throw ApiError(400, "The request has two different Content-Length headers.");
    length = value;
  }
  if (!length) {
    if (request.method == "POST") throw ApiError(411, "A POST needs a Content-Length (0 for no body).");
    return 0;
  }
  uint64_t bytes = 0;
  const auto [end, error] = std::from_chars(length->data(), length->data() + length->size(), bytes);
  const bool whole = end == length->data() + length->size() && !length->empty();
  if (error == std::errc::result_out_of_range || (error == std::errc() && whole && bytes > max_body_bytes))
    throw ApiError(413, "The request body is too large (over " + std::to_string(max_body_bytes) + " bytes).");
  if (error != std::errc() || !whole) throw ApiError(400, "The Content-Length is not a number of bytes.");
  return static_cast<size_t>(bytes);
}

struct HttpConnections::State : std::enable_shared_from_this<State> {
  HttpRoutes routes;
  ConnectionLimits limits;
  int listening = -1;
  int wake[2] = {-1, -1};  // a byte on wake[1] wakes the listening thread's poll
  std::atomic<bool> stopping{false};
  std::mutex mutex;  // guards what follows
  std::condition_variable all_idle;
  std::deque<Job> pending;           // heads waiting for a connection thread
  std::vector<ConnectionPtr> given_back;  // keep-alive connections back from connection threads
  bool listening_thread_running = false;
  int busy = 0;                      // connection threads running

  State(HttpRoutes r, ConnectionLimits l) : routes(std::move(r)), limits(l) {
    if (::pipe2(wake, O_NONBLOCK | O_CLOEXEC) != 0) throw std::runtime_error(std::string("http: cannot make a pipe: ") + std::strerror(errno));
  }
  ~State() {
    for (const int fd : {listening, wake[0], wake[1]})
      if (fd >= 0) ::close(fd);
  }
  void wake_up() const { [[maybe_unused]] const ssize_t n = ::write(wake[1], "w", 1); }

  // Reads the body, runs the handler, writes the answer; true when the connection stays open.
  bool answer(Connection& c, HttpRequest& request, size_t head_bytes, std::chrono::milliseconds write_timeout) {
    HttpResponse res;
    bool body_unread = false;
    try {
      const size_t length = body_length(request, limits.max_body_bytes);
      if (length > 0 && lower(request.header("expect")) == "100-continue" && c.in.size() < head_bytes + length)
        c.write_all("HTTP/1.1 100 Continue\r\n\r\n", write_timeout);
      if (!c.read_until(head_bytes + length, limits.io_timeout)) return false;  // the client left or stalled mid-body
      request.body.assign(c.in, head_bytes, length);
      c.in.erase(0, head_bytes + length);
      run_handler(request, res);
    } catch (const ApiError& e) {  // the framing is refused: the body, unread, must not be read as a next request
      res = error_response(e);
      res.close = body_unread = true;
    }
    routes.answered(res.status);
    const bool close = res.close || !request.keep_alive || stopping;
    bool written = false;
    try {
      written = write_response(c, request, res, close, write_timeout);
    } catch (const std::exception&) {  // a streamed answer that failed midway ends its connection, never the server
    }
    if (written && body_unread) c.finish_unread(std::chrono::seconds(1));  // only on connection threads: cheap routes have no body
    return written && !close;
  }

  void run_handler(const HttpRequest& request, HttpResponse& res) {
    try {
      routes.handle(request, res);
    } catch (const std::exception&) {
      res = error_response(ApiError(500, "Internal server error.", "", "internal_error"));
    }
  }

  // A connection thread: serves `job`, and the requests pipelined after it; then the next job.
  static void connection_thread(std::shared_ptr<State> state, Job job) {
    for (;;) {
      state->serve(std::move(job));
      std::lock_guard lock(state->mutex);
      if (state->pending.empty()) {
        --state->busy;
        state->all_idle.notify_all();
        return;
      }
      job = std::move(state->pending.front());
      state->pending.pop_front();
    }
  }

  void serve(Job job) {
    for (;;) {
      if (!answer(*job.connection, job.request, job.head_bytes, limits.io_timeout)) return;
      try {
        job.head_bytes = parse_request_head(job.connection->in, job.request);
      } catch (const ApiError& e) {
        return refuse(*job.connection, e);
      }
      if (job.head_bytes == 0) return give_back(std::move(job.connection));  // no pipelined request: wait on the listening thread
    }
  }

  void give_back(ConnectionPtr c) {
    std::lock_guard lock(mutex);
    if (!listening_thread_running || stopping) return;  // closes it
    c->idle_since = Clock::now();
    c->head_started.reset();
    if (!c->in.empty()) c->head_started = c->idle_since;
    given_back.push_back(std::move(c));
    wake_up();
  }

  void refuse(Connection& c, const ApiError& e) {
    routes.answered(e.status());
    write_response(c, HttpRequest{}, error_response(e), true, std::chrono::milliseconds(100));
  }

  void dispatch(Job job) {
    std::lock_guard lock(mutex);
    if (busy >= limits.max_threads) {
      pending.push_back(std::move(job));
      return;
    }
    ++busy;
    std::thread(connection_thread, shared_from_this(), std::move(job)).detach();
  }

  // On the listening thread: the heads that have arrived on `c`, answered at once when cheap,
  // else given to a connection thread. A write that would block this thread long closes `c`.
  void take_heads(ConnectionPtr& c) {
    while (c) {
      Job job;
      try {
        job.head_bytes = parse_request_head(c->in, job.request);
      } catch (const ApiError& e) {
        refuse(*c, e);
        c.reset();
        return;
      }
      if (job.head_bytes == 0) return;
      const bool cheap = routes.answers_at_once(job.request) && !job.request.has_header("content-length") &&
                         !job.request.has_header("transfer-encoding");
      if (!cheap) {
        job.connection = std::move(c);
        return dispatch(std::move(job));
      }
      if (!answer(*c, job.request, job.head_bytes, std::chrono::milliseconds(50))) return c.reset();
      c->head_started.reset();
      c->idle_since = Clock::now();
      if (!c->in.empty()) c->head_started = c->idle_since;
    }
  }

  Clock::time_point deadline(const Connection& c) const {
    return c.head_started ? *c.head_started + limits.head_timeout : c.idle_since + limits.keep_alive;
  }

  void accept_all(std::vector<ConnectionPtr>& waiting, Clock::time_point& paused_until) {
    for (;;) {
      const int fd = ::accept4(listening, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
          paused_until = Clock::now() + std::chrono::milliseconds(100);  // out of descriptors: try again soon, not in a busy loop
        return;
      }
      const int yes = 1;  // answers leave at once, not after the client's delayed ACK (~40 ms on a reused connection)
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
      waiting.push_back(std::make_unique<Connection>(fd));
    }
  }

  void poll_once(std::vector<ConnectionPtr>& waiting, Clock::time_point& paused_until) {
    std::vector<ConnectionPtr> back;
    {
      std::lock_guard lock(mutex);
      back.swap(given_back);
    }
    for (ConnectionPtr& c : back) {
      take_heads(c);  // a head that came while its connection was busy
      if (c) waiting.push_back(std::move(c));
    }
    const Clock::time_point now = Clock::now();
    const bool accepting = now >= paused_until;
    std::vector<pollfd> fds = {{wake[0], POLLIN, 0}, {accepting ? listening : -1, POLLIN, 0}};
    Clock::time_point next = now + std::chrono::seconds(1);
    for (const ConnectionPtr& c : waiting) {
      fds.push_back({c->fd, POLLIN, 0});
      next = std::min(next, deadline(*c));
    }
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count();
    if (::poll(fds.data(), fds.size(), static_cast<int>(std::clamp<int64_t>(wait + 1, 0, 1000))) < 0) return;
    if (fds[0].revents) {
      char drained[256];
      while (::read(wake[0], drained, sizeof drained) > 0) {}
    }
    for (size_t i = 0; i < waiting.size(); ++i) {
      ConnectionPtr& c = waiting[i];
      if (fds[i + 2].revents && !c->read_some()) c.reset();
      else if (fds[i + 2].revents) take_heads(c);
      if (c && Clock::now() >= deadline(*c)) c.reset();  // idle too long, or its head too slow in total (however steady its bytes)
    }
    std::erase(waiting, nullptr);
    if (fds[1].revents) accept_all(waiting, paused_until);
  }
};

HttpConnections::HttpConnections(HttpRoutes routes, ConnectionLimits limits)
    : state_(std::make_shared<State>(std::move(routes), limits)) {}

HttpConnections::~HttpConnections() = default;

int HttpConnections::bind(const std::string& host, int port) {
  const auto fail = [&](int error) {
    return std::runtime_error("cannot listen on " + host + ":" + std::to_string(port) + " (" +
                              (error ? std::strerror(error) : "address not available") + ")");
  };
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || !found) throw fail(0);
  const std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> addresses(found, ::freeaddrinfo);
  const int fd = ::socket(found->ai_family, found->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, found->ai_protocol);
  if (fd < 0) throw fail(errno);
  const int yes = 1;  // not SO_REUSEPORT: two servers must not share a port
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  if (::bind(fd, found->ai_addr, found->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
    const int error = errno;
    ::close(fd);
    throw fail(error);
  }
  state_->listening = fd;
  sockaddr_storage bound{};
  socklen_t size = sizeof bound;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &size);
  return ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6&>(bound).sin6_port : reinterpret_cast<sockaddr_in&>(bound).sin_port);
}

void HttpConnections::run() {
  State& s = *state_;
  {
    std::lock_guard lock(s.mutex);
    s.listening_thread_running = true;
  }
  std::vector<ConnectionPtr> waiting;
  Clock::time_point paused_until{};
  while (!s.stopping && s.listening >= 0) s.poll_once(waiting, paused_until);
  std::unique_lock lock(s.mutex);
  s.listening_thread_running = false;
  s.given_back.clear();
  s.pending.clear();  // heads that never got a thread: closed unanswered
  ::close(s.listening);  // new clients are refused at once
  s.listening = -1;
  s.all_idle.wait_for(lock, std::chrono::seconds(3), [&] { return s.busy == 0; });
}

void HttpConnections::stop() {
  state_->stopping = true;
  state_->wake_up();
}

int HttpConnections::busy_threads() const {
  std::lock_guard lock(state_->mutex);
  return state_->busy;
}

}  // namespace tpcli::serve

#include "cli/serve_child.h"

#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace tpcli::cli {

namespace {

// A loopback port nobody holds now: the kernel's pick for port 0. Another process could take it
// before the child binds; then the child fails and says so.
int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error("bench serve: cannot open a socket: " + std::string(std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  if (!ok) throw std::runtime_error("bench serve: cannot find a free port: " + std::string(std::strerror(errno)));
  return ntohs(addr.sin_port);
}

std::string describe_exit(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status));
  return "stopped";
}

}  // namespace

ServeChild::ServeChild(const std::string& model, const std::vector<std::string>& extra_args, int ready_s) {
  const int port = free_loopback_port();
  url_ = "http://127.0.0.1:" + std::to_string(port);
  std::vector<std::string> argv = {"tpcli", "serve", "--model", model, "--host", "127.0.0.1", "--port", std::to_string(port)};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("bench serve: cannot fork tpcli serve: " + std::string(std::strerror(errno)));
  if (pid_ == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // a benchmark killed outright leaves no server behind
    if (::getppid() != parent) ::_exit(127);
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    ::execv("/proc/self/exe", args.data());
    ::_exit(127);
  }
  try {
    wait_until_healthy(ready_s);
  } catch (...) {
    stop();
    throw;
  }
}

ServeChild::~ServeChild() { stop(); }

void ServeChild::wait_until_healthy(int ready_s) {
  httplib::Client client(url_);
  client.set_connection_timeout(1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(ready_s);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      throw std::runtime_error("bench serve: tpcli serve " + describe_exit(status) + " before it answered " + url_ + "/health");
    }
    if (auto res = client.Get("/health"); res && res->status == 200) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  throw std::runtime_error("bench serve: tpcli serve did not answer " + url_ + "/health within " + std::to_string(ready_s) + " s");
}

void ServeChild::stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  for (int waited_ms = 0; waited_ms < 15000; waited_ms += 50) {  // serve's --grace (10 s by default) lets running requests end
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

}  // namespace tpcli::cli

// tpcli::dist — the process launcher: fork/exec (or ssh) N ranks, forward their output, stop all
// ranks when one fails. The ssh command line and the remote wrapper are described in launcher.h.
#include "distributed/launch/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <random>
#include <sstream>

namespace tpcli::dist {

namespace {

using Clock = std::chrono::steady_clock;

// Set by SIGINT/SIGTERM while launch() runs: a signal handler can only talk through statics.
volatile sig_atomic_t g_stop_signal = 0;   // the latest one
volatile sig_atomic_t g_stop_signals = 0;  // how many came
void on_stop_signal(int sig) {
  g_stop_signal = sig;
  g_stop_signals = g_stop_signals + 1;
}

void write_all(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;  // reader gone: drop the output, keep supervising
    data += w;
    n -= static_cast<size_t>(w);
  }
}

void note(int fd, const std::string& line) {
  const std::string s = "tpcli launch: " + line + "\n";
  write_all(fd, s.data(), s.size());
}

// Stderr lines that several ranks print alike (990 ranks failing with one error) are shown once, from
// the first rank that printed it, and noted at the end with their count. That first rank repeating its
// line still shows each copy: that is its output, not an echo of the others'.
class LineFolder {
 public:
  // Whether `rank`'s `line` (without the "[r] " prefix) is to be shown.
  bool show(int rank, const std::string& line) {
    auto it = seen_.find(line);
    if (it == seen_.end()) {
      if (seen_.size() < MAX_LINES) seen_.emplace(line, Printers{rank, {rank}});  // beyond: shown, not folded
      return true;
    }
    it->second.ranks.insert(rank);
    return rank == it->second.first;
  }
  // One note per folded line: "(990 processes) LINE".
  void report(int fd) const;

 private:
  static constexpr size_t MAX_LINES = 4096;  // distinct lines remembered (a long run's progress lines)
  struct Printers {
    int first;            // the rank whose copies are shown
    std::set<int> ranks;  // every rank that printed the line
  };
  std::map<std::string, Printers> seen_;
};

void LineFolder::report(int fd) const {
  for (const auto& [line, printers] : seen_)
    if (const size_t ranks = printers.ranks.size(); ranks > 1) {
      std::string text = line;
      if (!text.empty() && text.back() == '\n') text.pop_back();
      note(fd, "(" + std::to_string(ranks) + " processes) " + text);
    }
}

// One pipe from a rank: raw pass-through, or whole lines prefixed with the rank.
struct Stream {
  int fd = -1;         // read end, -1 once closed
  int to_fd = 2;       // where it goes
  bool raw = false;
  std::string prefix;  // "[r] "
  std::string pending; // partial line
  int rank = 0;
  LineFolder* folder = nullptr;  // null: every line shown

  void forward(const char* data, size_t n) {
    if (raw) return write_all(to_fd, data, n);
    pending.append(data, n);
    size_t start = 0;
    for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
      const std::string text = pending.substr(start, nl + 1 - start);
      if (folder && !folder->show(rank, text)) continue;
      const std::string line = prefix + text;
      write_all(to_fd, line.data(), line.size());
    }
    pending.erase(0, start);
  }
  void close_stream() {
    if (!pending.empty()) forward("\n", 1);
    ::close(fd);
    fd = -1;
  }
};

struct Rank {
  pid_t pid = -1;
  std::string host;              // "" when local, else as given in --hosts
  int lifeline = -1;             // ssh ranks: write end of their stdin; closing it stops the remote rank
  std::optional<int> exit_code;  // set once reaped
  Stream out, err;

  std::string name(int i) const { return "rank " + std::to_string(i) + (host.empty() ? "" : " (on " + host + ")"); }
  void close_lifeline() {
    if (lifeline >= 0) ::close(lifeline);
    lifeline = -1;
  }
};

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

int pick_free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (s < 0 || ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (s >= 0) ::close(s);
    throw LaunchError("cannot find a free port on 127.0.0.1: " + std::string(std::strerror(errno)));
  }
  ::close(s);
  return ntohs(a.sin_port);
}

void check_port_free(int port) {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // as ZeroMQ binds
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = s >= 0 && ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  const int err = errno;
  if (s >= 0) ::close(s);
  if (!ok)
    throw LaunchError("--port " + std::to_string(port) + ": 127.0.0.1:" + std::to_string(port) + " is not free (" +
                      std::strerror(err) + "); choose another port, or omit --port to pick a free one");
}

// The IPv4 address a rank on `host` binds and is reached at: "user@name" -> name, resolved here.
std::string host_address(const std::string& host) {
  const std::string name = host.substr(host.find('@') + 1);  // npos + 1 == 0: no user
  in_addr numeric{};
  if (::inet_pton(AF_INET, name.c_str(), &numeric) == 1) return name;
  if (name.find(':') != std::string::npos)
    throw LaunchError("host " + host + ": IPv6 addresses are not supported yet; give the host's IPv4 address");
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(name.c_str(), nullptr, &hints, &found);
  if (rc != 0 || !found)
    throw LaunchError("host " + host + ": cannot resolve " + name + " on this machine (" + ::gai_strerror(rc) +
                      "); give the host's IPv4 address (ranks bind and connect by address)");
  char text[INET_ADDRSTRLEN] = "";
  ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(found->ai_addr)->sin_addr, text, sizeof text);
  ::freeaddrinfo(found);
  return text;
}

// The ssh client and its leading arguments: options.ssh, else $TPCLI_SSH, else "ssh"; split at spaces.
std::vector<std::string> ssh_command(const std::string& configured) {
  std::string text = configured;
  if (text.empty()) {
    const char* v = std::getenv("TPCLI_SSH");
    text = v && *v ? v : "ssh";
  }
  std::vector<std::string> words;
  std::istringstream s(text);
  for (std::string w; s >> w;) words.push_back(w);
  if (words.empty()) throw LaunchError("TPCLI_SSH='" + text + "' names no command");
  return words;
}

// Runs on the remote host as `sh -c REMOTE_WRAPPER tpcli-rank CWD COMMAND...` (see launcher.h): cd,
// start COMMAND in a session of its own (setsid, where present), and stop its process group when
// stdin (the launcher's lifeline) closes: SIGTERM, then SIGKILL 3 s later. Exits with COMMAND's code
// (128 + signal when a signal ended it; the shell's "Killed" note is dropped: the launcher says so),
// so ssh's own 255 keeps meaning "ssh failed".
constexpr const char* REMOTE_WRAPPER =
    "cd \"$1\" || exit 1; shift; "
    "command -v setsid >/dev/null 2>&1 && set -- setsid \"$@\"; "
    "exec 3<&0; "
    "\"$@\" </dev/null & rank=$!; "
    "(trap 'kill $c; exit 0' TERM; cat <&3 >/dev/null & c=$!; wait $c; "
    "kill -s TERM -- -$rank || kill -s TERM $rank; "
    "for i in 1 2 3; do sleep 1; kill -0 $rank || exit 0; done; "
    "kill -s KILL -- -$rank || kill -s KILL $rank) >/dev/null 2>&1 & watch=$!; "
    "exec 3<&-; wait $rank 2>/dev/null; code=$?; kill $watch 2>/dev/null; exit $code";

// The argv a rank runs: the command itself (local) or ssh to its host with the environment inline.
std::vector<std::string> rank_argv(const std::vector<std::string>& command, const std::vector<std::string>& env,
                                   const std::string& host, const LaunchOptions& o) {
  if (host.empty()) return command;
  char cwd[4096];
  const std::string dir = ::getcwd(cwd, sizeof cwd) ? cwd : ".";
  std::string remote = "exec env";
  auto append = [&](const std::string& word) {  // (not `" " + string&&`: gcc 12 -Wrestrict false positive)
    remote += ' ';
    remote += shell_quote(word);
  };
  for (const std::string& e : env) append(e);
  remote += " sh -c";
  append(REMOTE_WRAPPER);
  remote += " tpcli-rank";
  append(dir);
  for (const std::string& a : command) append(a);
  std::vector<std::string> argv = ssh_command(o.ssh);
  const std::string connect_timeout = "ConnectTimeout=" + std::to_string(std::min(o.timeout_s, 10));
  argv.insert(argv.end(), {"-o", "BatchMode=yes", "-o", connect_timeout, "-T", host, remote});
  return argv;
}

// Forks one rank. The child dies with the launcher (PR_SET_PDEATHSIG) and gets its own env. A
// remote rank's stdin is a pipe the launcher holds (Rank::lifeline); a local rank's is inherited.
Rank spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env, int rank, const std::string& host,
           const LaunchOptions& o) {
  int out[2], err[2], in[2] = {-1, -1};
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0 || (!host.empty() && ::pipe2(in, O_CLOEXEC) != 0))
    throw LaunchError("cannot create pipes: " + std::string(std::strerror(errno)));
  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw LaunchError("cannot fork rank " + std::to_string(rank) + ": " + std::strerror(errno));
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != launcher) ::_exit(127);  // the launcher died before prctl took effect
    // A process group of its own: a terminal's Ctrl-C reaches the launcher alone, which passes it
    // to rank 0 only (see launch()).
    ::setpgid(0, 0);
    if (in[0] >= 0) ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    for (const std::string& e : env) ::putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    const std::string msg = "tpcli launch: rank " + std::to_string(rank) + ": cannot run " + argv[0] + ": " +
                            std::strerror(errno) + "\n";
    write_all(2, msg.data(), msg.size());
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  if (in[0] >= 0) ::close(in[0]);
  Rank r;
  r.pid = pid;
  r.host = host;
  r.lifeline = in[1];
  const std::string prefix = std::string("[") + std::to_string(rank) + "] ";
  const bool stdout_raw = rank == 0 && !o.tag_output;
  r.out = Stream{out[0], (rank == 0 || o.tag_output) ? o.out_fd : o.err_fd, stdout_raw, prefix, {}, rank};
  r.err = Stream{err[0], o.err_fd, false, prefix, {}, rank};
  return r;
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string describe(int code) {
  if (code > 128) return "was killed by signal " + std::to_string(code - 128) + " (" + strsignal(code - 128) + ")";
  return "exited with code " + std::to_string(code);
}

// Why rank `i` failed, in one line.
std::string failure(const Rank& r, int i, int code) {
  if (!r.host.empty() && code == 255)
    return "rank " + std::to_string(i) + ": ssh to " + r.host +
           " failed with exit code 255 (host unreachable, login refused, or connection lost)";
  return r.name(i) + " " + describe(code);
}

// Reads what is ready on the ranks' pipes (waiting up to `wait_ms`).
void pump(std::vector<Rank>& ranks, int wait_ms) {
  std::vector<pollfd> fds;
  std::vector<Stream*> streams;
  for (Rank& r : ranks)
    for (Stream* s : {&r.out, &r.err})
      if (s->fd >= 0) {
        fds.push_back({s->fd, POLLIN, 0});
        streams.push_back(s);
      }
  if (fds.empty()) {
    ::usleep(static_cast<useconds_t>(wait_ms) * 1000);
    return;
  }
  if (::poll(fds.data(), fds.size(), wait_ms) <= 0) return;
  char buf[65536];
  for (size_t i = 0; i < fds.size(); ++i) {
    if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
    if (n > 0) {
      streams[i]->forward(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      streams[i]->close_stream();
    }
  }
}

// Reads what a reaped rank left in its pipes, without waiting (grandchildren may keep them open,
// and writing: a bounded number of reads).
void drain(Rank& r) {
  char buf[65536];
  for (Stream* s : {&r.out, &r.err}) {
    for (int reads = 0; s->fd >= 0 && reads < 16; ++reads) {
      pollfd p{s->fd, POLLIN, 0};
      if (::poll(&p, 1, 0) <= 0) break;
      const ssize_t n = ::read(s->fd, buf, sizeof buf);
      if (n > 0) {
        s->forward(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        s->close_stream();
      }
    }
  }
}

}  // namespace

std::string self_executable() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw LaunchError("cannot find this executable (/proc/self/exe)");
  return std::string(buf, static_cast<size_t>(n));
}

std::vector<std::string> read_hostfile(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw LaunchError("--hostfile " + path + ": cannot open");
  std::vector<std::string> hosts;
  std::string line;
  for (int no = 1; std::getline(f, line); ++no) {
    line = line.substr(0, line.find('#'));
    std::istringstream s(line);
    std::string host, extra;
    if (!(s >> host)) continue;
    int slots = 1;
    if (s >> extra) {
      if (extra.rfind("slots=", 0) != 0) throw LaunchError(path + ":" + std::to_string(no) + ": expected 'host [slots=N]'");
      try {
        slots = std::stoi(extra.substr(6));
      } catch (const std::exception&) {
        slots = 0;
      }
      if (slots < 1) throw LaunchError(path + ":" + std::to_string(no) + ": slots must be a positive integer");
    }
    for (int i = 0; i < slots; ++i) hosts.push_back(host);
  }
  if (hosts.empty()) throw LaunchError("--hostfile " + path + ": no hosts in it");
  return hosts;
}

// Names this launch in every rank's hello (distributed/zmq_wire.h), so a coordinator never takes a rank
// of another launch that happens to reach its port.
static std::string random_job_token() {
  std::random_device device;
  const uint64_t token = (static_cast<uint64_t>(device()) << 32) ^ device();
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(token));
  return text;
}

// Refuses more than MAX_RANKS_PER_HOST ranks on any one host (rank r runs on hosts[r % size]).
void check_ranks_per_host(const LaunchOptions& o) {
  std::map<std::string, int64_t> per_host;
  if (o.hosts.empty()) per_host["this machine"] = o.processes;
  const int64_t n = o.processes, size = static_cast<int64_t>(o.hosts.size());
  for (int64_t i = 0; i < size; ++i)
    per_host[o.hosts[static_cast<size_t>(i)]] += n / size + (i < n % size ? 1 : 0);
  for (const auto& [host, count] : per_host)
    if (count > MAX_RANKS_PER_HOST)
      throw LaunchError("-n " + std::to_string(o.processes) + ": " + std::to_string(count) + " ranks on " + host +
                        ", more than the " + std::to_string(MAX_RANKS_PER_HOST) +
                        " a host may run (for more devices use --devices-per-process, or more --hosts)");
}

int launch(const LaunchOptions& o, std::vector<std::string> command) {
  if (command.empty()) throw LaunchError("no command to launch (usage: tpcli launch -n N -- tpcli infer ...)");
  if (o.processes < 1) throw LaunchError("-n " + std::to_string(o.processes) + ": need at least 1 rank");
  check_ranks_per_host(o);
  if (o.devices_per_process < 1) throw LaunchError("--devices-per-process must be at least 1");
  if (o.timeout_s < 1) throw LaunchError("--timeout must be at least 1 second");
  const bool local = o.hosts.empty();
  if (command[0] == "tpcli") command[0] = self_executable();  // the same build on every rank
  int port = o.port;
  if (port == 0) port = local ? pick_free_port() : 29500;
  if (port < 1 || port > 65535) throw LaunchError("--port " + std::to_string(port) + " is not a TCP port");
  if (local && o.port != 0) check_port_free(port);
  const std::string transport = o.transport.empty() ? (local ? "ipc" : "tcp") : o.transport;
  // Each host's address, as ranks bind it (TPCLI_HOST) and peers reach it; one loopback address is
  // fine only if every rank is on that host.
  std::vector<std::string> addresses;
  for (const std::string& h : o.hosts) addresses.push_back(host_address(h));
  for (size_t i = 0; i < addresses.size(); ++i) {
    const bool alone = std::all_of(addresses.begin(), addresses.end(), [&](auto& a) { return a == addresses[i]; });
    if (addresses[i].rfind("127.", 0) == 0 && !alone)
      throw LaunchError("host " + o.hosts[i] + " is " + addresses[i] +
                        " (loopback) on this machine, which the other hosts cannot reach; give its IPv4 address");
    if (transport == "ipc" && !alone)
      throw LaunchError("--transport ipc needs every rank on one host, but the hosts include " + o.hosts[0] + " and " +
                        o.hosts[i] + "; use tcp");
  }
  const std::string host0 = local ? "127.0.0.1" : addresses[0];
  const std::string job = random_job_token();

  struct sigaction stop{}, old_int{}, old_term{};
  stop.sa_handler = on_stop_signal;
  sigemptyset(&stop.sa_mask);
  g_stop_signal = 0;
  g_stop_signals = 0;
  sigaction(SIGINT, &stop, &old_int);
  sigaction(SIGTERM, &stop, &old_term);

  std::vector<Rank> ranks;
  LineFolder folder;
  std::optional<std::pair<int, int>> failed;  // (rank, exit code)
  std::optional<Clock::time_point> stopping;  // SIGTERM sent at
  int forwarded_signal = 0;                    // the signal passed to rank 0 alone (0: none yet)
  std::optional<Clock::time_point> rank0_ended;
  auto stop_all = [&] {
    if (stopping) return;
    stopping = Clock::now();
    for (Rank& r : ranks) {
      r.close_lifeline();
      if (!r.exit_code) ::kill(r.pid, SIGTERM);
    }
  };
  try {
    for (int i = 0; i < o.processes; ++i) {
      const size_t h = local ? 0 : static_cast<size_t>(i) % o.hosts.size();
      const std::string host = local ? "" : o.hosts[h];
      const std::vector<std::string> env{
          "TPCLI_RANK=" + std::to_string(i),
          "TPCLI_WORLD_SIZE=" + std::to_string(o.processes),
          "TPCLI_COORDINATOR=tcp://" + host0 + ":" + std::to_string(port),
          "TPCLI_HOST=" + (local ? std::string("127.0.0.1") : addresses[h]),
          "TPCLI_TRANSPORT=" + transport,
          "TPCLI_TIMEOUT=" + std::to_string(o.timeout_s),
          "TPCLI_DEVICES_PER_PROCESS=" + std::to_string(o.devices_per_process),
          "TPCLI_JOB=" + job};
      ranks.push_back(spawn(rank_argv(command, env, host, o), env, i, host, o));
      ranks.back().err.folder = &folder;  // stdout is the ranks' output: every line of it stays
    }
  } catch (const std::exception&) {
    stop_all();
    for (Rank& r : ranks) {
      ::waitpid(r.pid, nullptr, 0);
      for (Stream* s : {&r.out, &r.err})
        if (s->fd >= 0) s->close_stream();
    }
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
    throw;
  }

  for (;;) {
    pump(ranks, 50);
    bool running = false;
    for (size_t i = 0; i < ranks.size(); ++i) {
      Rank& r = ranks[i];
      if (r.exit_code) continue;
      int status = 0;
      if (::waitpid(r.pid, &status, WNOHANG) == r.pid) {
        r.exit_code = exit_code_of(status);
        r.close_lifeline();
        if (i == 0) rank0_ended = Clock::now();
        if (*r.exit_code != 0 && !failed && !stopping) {
          failed = {static_cast<int>(i), *r.exit_code};
          // After a passed-on signal a rank's own stop code is no failure, and rank 0 (saving,
          // draining) must not be stopped: the ranks end through their collectives.
          if (!forwarded_signal) {
            drain(r);  // its last words (ssh's error, say) before the note
            note(o.err_fd, failure(r, static_cast<int>(i), *r.exit_code) +
                               (o.stop_on_failure ? "; stopping the other ranks" : ""));
            if (o.stop_on_failure) stop_all();
          }
        }
      } else {
        running = true;
      }
    }
    // The first SIGINT/SIGTERM goes to rank 0 alone, which stops as it does when run alone (a
    // server drains, training saves) and ends the others through its collectives (every rank
    // stopping at once cut the server's answers short). A second signal stops every rank.
    if (g_stop_signals >= 2 && !stopping) {
      note(o.err_fd, std::string("got ") + strsignal(g_stop_signal) + " again; stopping all ranks");
      if (!failed) failed = {-1, 128 + g_stop_signal};
      stop_all();
    } else if (g_stop_signals == 1 && !forwarded_signal && !stopping) {
      forwarded_signal = g_stop_signal;
      note(o.err_fd, std::string("got ") + strsignal(forwarded_signal) +
                         "; passed to rank 0, which ends the others (a second signal stops all ranks)");
      if (!ranks[0].exit_code) ::kill(ranks[0].pid, forwarded_signal);
    }
    if (forwarded_signal && rank0_ended && running && !stopping &&
        Clock::now() - *rank0_ended > std::chrono::duration<double>(o.kill_grace_s)) {
      note(o.err_fd, "rank 0 has ended; stopping the ranks still running");
      stop_all();
    }
    if (stopping && running && Clock::now() - *stopping > std::chrono::duration<double>(o.kill_grace_s))
      for (Rank& r : ranks)
        if (!r.exit_code) ::kill(r.pid, SIGKILL);
    bool open = false;
    for (Rank& r : ranks) open |= r.out.fd >= 0 || r.err.fd >= 0;
    if (!running && !open) break;
    if (!running && stopping) {  // grandchildren may hold the pipes open: don't wait on them
      pump(ranks, 0);
      for (Rank& r : ranks)
        for (Stream* s : {&r.out, &r.err})
          if (s->fd >= 0) s->close_stream();
      break;
    }
  }
  for (Rank& r : ranks) r.close_lifeline();
  folder.report(o.err_fd);
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  return failed ? failed->second : 0;
}

}  // namespace tpcli::dist

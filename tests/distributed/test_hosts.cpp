// `tpcli launch --hosts` for real, with Linux network namespaces as the hosts: two namespaces joined
// by a veth pair (10.213.0.1 and 10.213.0.2), and a stand-in "ssh" (a shell script handed to the
// launcher through TPCLI_SSH) that runs the remote command in the namespace of its host, with an
// empty environment and the stdin of the "client", as sshd would. Addresses outside the two are
// unreachable: the stand-in prints ssh's message and exits 255.
//
// Creating namespaces needs root (CAP_NET_ADMIN); without it every test here warns "skipped: ..."
// and passes.
#include <catch2/catch.hpp>

#include "support/shared_data.h"
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "distributed/launch/launcher.h"
#include "support/temp_dir.h"

using namespace tpcli::dist;
using tpcli::testing::slurp;
using tpcli::testing::TempDir;

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* HOST_A = "10.213.0.1";
constexpr const char* HOST_B = "10.213.0.2";
constexpr const char* NOWHERE = "10.213.0.9";  // on the subnet, but no namespace answers

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

struct Ran {
  int code = -1;
  std::string out, err;
  double seconds = 0;
};

// Runs a shell command line, capturing its stdout and stderr through files in `scratch`.
Ran run_sh(const TempDir& scratch, const std::string& command) {
  const std::string out = (scratch.path() / "run.out").string(), err = (scratch.path() / "run.err").string();
  const auto t0 = Clock::now();
  const int status = std::system(("(" + command + ") >" + quote(out) + " 2>" + quote(err)).c_str());
  Ran r;
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

// Two network namespaces joined by a veth pair, and the "ssh" that reaches them; all removed at the
// end of the scope. Names carry the pid, so parallel test processes do not collide.
class NetnsHosts {
 public:
  NetnsHosts()
      : tag_(std::to_string(::getpid())), ns_a_("tpcli-" + tag_ + "-a"), ns_b_("tpcli-" + tag_ + "-b"),
        veth_a_("tpa" + tag_), veth_b_("tpb" + tag_) {
    const std::string setup =
        "ip netns add " + ns_a_ + " && ip netns add " + ns_b_ +
        " && ip link add " + veth_a_ + " type veth peer name " + veth_b_ +
        " && ip link set " + veth_a_ + " netns " + ns_a_ + " && ip link set " + veth_b_ + " netns " + ns_b_ +
        " && ip -n " + ns_a_ + " addr add " + HOST_A + "/24 dev " + veth_a_ +
        " && ip -n " + ns_b_ + " addr add " + HOST_B + "/24 dev " + veth_b_ +
        " && ip -n " + ns_a_ + " link set lo up && ip -n " + ns_b_ + " link set lo up" +
        " && ip -n " + ns_a_ + " link set " + veth_a_ + " up && ip -n " + ns_b_ + " link set " + veth_b_ + " up";
    const Ran r = run_sh(scratch_, setup);
    if (r.code != 0) {
      error_ = r.err.empty() ? "exit code " + std::to_string(r.code) : r.err.substr(0, r.err.find('\n'));
      return;
    }
    ssh_ = scratch_.write("ssh", R"(#!/bin/sh
# Stands in for ssh: ssh [-o OPTION | -T ...]... HOST COMMAND...
printf '%s\n' "$*" >> ")" + (scratch_.path() / "ssh.log").string() + R"("
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-p|-l|-i) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
host=$1; shift
case "$host" in
  )" + HOST_A + ") ns=" + ns_a_ + R"( ;;
  )" + HOST_B + ") ns=" + ns_b_ + R"( ;;
  *) echo "ssh: connect to host $host port 22: No route to host" >&2; exit 255 ;;
esac
# As sshd: no environment from the client, the words joined and run by the login shell; not
# exec'd, so the "remote" side outlives a killed client, as it would behind a real ssh.
env -i PATH="$PATH" ip netns exec "$ns" sh -c "$*"
)");
    std::filesystem::permissions(ssh_, std::filesystem::perms::owner_all);
  }
  ~NetnsHosts() {
    run_sh(scratch_, "ip netns del " + ns_a_ + "; ip netns del " + ns_b_ + "; ip link del " + veth_a_);
  }
  NetnsHosts(const NetnsHosts&) = delete;
  NetnsHosts& operator=(const NetnsHosts&) = delete;

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  const std::string& ssh() const { return ssh_; }  // the stand-in, for TPCLI_SSH
  const std::string& ns_a() const { return ns_a_; }
  const std::string& ns_b() const { return ns_b_; }
  std::string ssh_log() const { return slurp(scratch_.path() / "ssh.log"); }
  const TempDir& scratch() const { return scratch_; }

 private:
  TempDir scratch_;
  std::string tag_, ns_a_, ns_b_, veth_a_, veth_b_;
  std::string error_, ssh_;
};

#define SKIP_WITHOUT_NAMESPACES(hosts)                                                                  \
  if (!(hosts).ok())                                                                                     \
  tpcli::testing::skip_test("cannot create network namespaces (" + (hosts).error() + "); needs root/CAP_NET_ADMIN")

// `tpcli launch ARGS` run from `cwd` with the stand-in ssh, under a 60 s timeout (a hang fails
// instead of blocking the suite).
Ran tpcli_launch(const NetnsHosts& hosts, const std::string& args, const std::string& cwd = "/") {
  return run_sh(hosts.scratch(), "cd " + quote(cwd) + " && TPCLI_SSH=" + quote(hosts.ssh()) + " timeout -k 5 60 " +
                                     quote(TPCLI_BINARY) + " launch " + args);
}

// False once the process is gone or a zombie (orphans are reaped by an init that may be late).
bool alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z' && line[paren + 2] != 'X';
}

bool dies_within(pid_t pid, double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (alive(pid)) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

}  // namespace

TEST_CASE("launch --hosts: each rank runs in its host's namespace with its address, cwd and quoted words") {
  std::string ns_a;
  {
    NetnsHosts hosts;
    SKIP_WITHOUT_NAMESPACES(hosts);
    ns_a = hosts.ns_a();
    const std::filesystem::path cwd = hosts.scratch().path() / "a dir's name";
    std::filesystem::create_directories(cwd);
    const std::string script =
        "printf '%s %s %s %s %s|' $TPCLI_RANK $TPCLI_HOST $TPCLI_COORDINATOR $TPCLI_TRANSPORT "
        "$(ip netns identify $$); pwd; printf '<%s>' \"$@\"; echo";
    const Ran r = tpcli_launch(hosts,
                               "-n 3 --port 29511 --tag-output --hosts " + std::string(HOST_A) + "," + HOST_B +
                                   " -- sh -c " + quote(script) + " x 'a b' \"it's\" '$HOME' ''",
                               cwd.string());
    INFO(r.err);
    REQUIRE(r.code == 0);
    // Rank r on host r % 2, bound on that host's address; the coordinator on the first host.
    const std::string coordinator = std::string(" tcp://") + HOST_A + ":29511 tcp ";
    const std::string tail = "|" + cwd.string() + "\n";
    CHECK(r.out.find("[0] 0 " + std::string(HOST_A) + coordinator + hosts.ns_a() + tail) != std::string::npos);
    CHECK(r.out.find("[1] 1 " + std::string(HOST_B) + coordinator + hosts.ns_b() + tail) != std::string::npos);
    CHECK(r.out.find("[2] 2 " + std::string(HOST_A) + coordinator + hosts.ns_a() + tail) != std::string::npos);
    CHECK(r.out.find("[1] <a b><it's><$HOME><>\n") != std::string::npos);
    // ssh was asked never to prompt, once per rank, with the host before the command.
    const std::string log = hosts.ssh_log();
    CHECK(std::count(log.begin(), log.end(), '\n') == 3);
    CHECK(log.find("-o BatchMode=yes") != std::string::npos);
    CHECK(log.find("-T " + std::string(HOST_B) + " exec env ") != std::string::npos);
  }
  if (ns_a.empty()) return;
  TempDir scratch;
  CHECK(run_sh(scratch, "ip netns list | grep -w " + ns_a).code != 0);  // removed with `hosts`
}

TEST_CASE("launch --hosts: tpcli infer over two namespaces prints exactly what the thread backend prints") {
  tpcli::testing::require_shared("data/stories260K.bin");
  tpcli::testing::require_shared("data/tok512.bin");
  const std::string data = tpcli::testing::shared_path("data/");
  NetnsHosts hosts;
  SKIP_WITHOUT_NAMESPACES(hosts);
  const std::string infer = "infer --model " + quote(data + "stories260K.bin") + " -z " + quote(data + "tok512.bin") +
                            " -t 0 -i 'Once upon a time' --devices 2";
  const Ran threads = run_sh(hosts.scratch(), quote(TPCLI_BINARY) + " " + infer);
  INFO(threads.err);
  REQUIRE(threads.code == 0);
  REQUIRE(threads.out.rfind("Once upon a time", 0) == 0);
  const Ran zmq = tpcli_launch(hosts, "-n 2 --hosts " + std::string(HOST_A) + "," + HOST_B + " -- tpcli " + infer +
                                          " --backend zmq");
  INFO(zmq.err);
  CHECK(zmq.code == 0);
  CHECK(zmq.out == threads.out);
}

TEST_CASE("launch --hosts: an unreachable host is a one-line error naming it, without waiting for the timeout") {
  NetnsHosts hosts;
  SKIP_WITHOUT_NAMESPACES(hosts);
  // The stand-in ssh fails as ssh does (exit code 255); rank 0 would sleep for 30 s.
  const Ran r = tpcli_launch(hosts, "-n 2 --timeout 30 --hosts " + std::string(HOST_A) + "," + NOWHERE +
                                        " -- sleep 30");
  INFO(r.err);
  CHECK(r.code == 255);
  CHECK(r.seconds < 10);
  CHECK(r.err.find("[1] ssh: connect to host " + std::string(NOWHERE) + " port 22: No route to host\n") !=
        std::string::npos);
  const std::string note = "tpcli launch: rank 1: ssh to " + std::string(NOWHERE) +
                           " failed with exit code 255 (host unreachable, login refused, or connection lost); "
                           "stopping the other ranks\n";
  CHECK(r.err.find(note) != std::string::npos);

  // The real ssh client, started inside the first namespace: nothing listens on port 22 of the
  // second, so it gives up at once, with its own message, and BatchMode keeps it from prompting.
  if (run_sh(hosts.scratch(), "command -v ssh").code != 0) {
    WARN("skipped the real-ssh half: no ssh client");
    return;
  }
  const Ran real = run_sh(hosts.scratch(), "TPCLI_SSH=" + quote("ip netns exec " + hosts.ns_a() + " ssh") +
                                               " timeout -k 5 60 " + quote(TPCLI_BINARY) + " launch -n 1 --hosts " +
                                               HOST_B + " -- tpcli --version </dev/null");
  INFO(real.err);
  CHECK(real.code == 255);
  CHECK(real.seconds < 15);
  CHECK(real.err.find("[0] ssh: connect to host " + std::string(HOST_B) + " port 22: Connection refused") !=
        std::string::npos);
  CHECK(real.err.find("tpcli launch: rank 0: ssh to " + std::string(HOST_B) + " failed with exit code 255") !=
        std::string::npos);
}

TEST_CASE("launch --hosts: a rank killed on its host ends the run naming it, and the other host's rank is stopped") {
  NetnsHosts hosts;
  SKIP_WITHOUT_NAMESPACES(hosts);
  const std::filesystem::path dir = hosts.scratch().path();
  LaunchOptions o;
  o.processes = 2;
  o.hosts = {HOST_A, HOST_B};
  o.ssh = hosts.ssh();
  o.kill_grace_s = 1;
  FILE* err = std::tmpfile();
  o.err_fd = fileno(err);
  // Each rank tells its pid, then sleeps; rank 0 ignores SIGTERM, so only the SIGKILL that follows stops it.
  const std::string script = "echo $$ > rank$TPCLI_RANK.pid.tmp && mv rank$TPCLI_RANK.pid.tmp rank$TPCLI_RANK.pid && "
                             "if [ $TPCLI_RANK = 0 ]; then trap '' TERM; fi; exec sleep 60";
  const std::filesystem::path old_cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir);  // the ranks' working directory is the launcher's
  const auto t0 = Clock::now();
  auto run = std::async(std::launch::async, [&] { return launch(o, {"sh", "-c", script}); });
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    const std::filesystem::path file = dir / ("rank" + std::to_string(r) + ".pid");
    while (!std::filesystem::exists(file) && Clock::now() - t0 < std::chrono::seconds(20))
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    pids.push_back(std::stoi("0" + slurp(file)));
  }
  std::filesystem::current_path(old_cwd);
  if (pids[0] <= 0 || pids[1] <= 0) {
    if (run.wait_for(std::chrono::seconds(0)) != std::future_status::ready)
      ::raise(SIGTERM);  // launch() stops every rank on SIGTERM
    run.get();
    FAIL("the ranks did not start within 20 s");
  }
  ::kill(pids[1], SIGKILL);
  const int code = run.get();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const std::string text = tpcli::testing::slurp_and_close(err);
  INFO(text);
  CHECK(code == 137);
  CHECK(seconds < 15);
  CHECK(text.find("tpcli launch: rank 1 (on " + std::string(HOST_B) +
                  ") was killed by signal 9 (Killed); stopping the other ranks\n") != std::string::npos);
  // Rank 0's ssh client is gone; its process on the other host is stopped through the lifeline.
  CHECK(dies_within(pids[0], 8));
  if (alive(pids[0])) ::kill(pids[0], SIGKILL);
}

TEST_CASE("launch --hosts: a launcher killed with SIGKILL leaves no rank running on the hosts") {
  NetnsHosts hosts;
  SKIP_WITHOUT_NAMESPACES(hosts);
  const std::filesystem::path dir = hosts.scratch().path();
  const std::string script = "echo $$ > rank$TPCLI_RANK.pid.tmp && mv rank$TPCLI_RANK.pid.tmp rank$TPCLI_RANK.pid && "
                             "exec sleep 60";
  const Ran started = run_sh(hosts.scratch(), "cd " + quote(dir.string()) + " && TPCLI_SSH=" + quote(hosts.ssh()) + " " +
                                                  quote(TPCLI_BINARY) + " launch -n 2 --hosts " + HOST_A + "," +
                                                  HOST_B + " -- sh -c " + quote(script) +
                                                  " >/dev/null 2>&1 </dev/null & echo $!");
  const pid_t launcher = std::stoi("0" + started.out);
  REQUIRE(launcher > 0);
  std::vector<pid_t> pids;
  const auto t0 = Clock::now();
  for (int r = 0; r < 2; ++r) {
    const std::filesystem::path file = dir / ("rank" + std::to_string(r) + ".pid");
    while (!std::filesystem::exists(file) && Clock::now() - t0 < std::chrono::seconds(20))
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    pids.push_back(std::stoi("0" + slurp(file)));
  }
  ::kill(launcher, SIGKILL);
  REQUIRE(pids[0] > 0);
  REQUIRE(pids[1] > 0);
  // Its ssh clients die with it (PR_SET_PDEATHSIG); the ranks' lifelines close, and they are stopped.
  CHECK(dies_within(pids[0], 5));
  CHECK(dies_within(pids[1], 5));
  for (pid_t pid : pids)
    if (alive(pid)) ::kill(pid, SIGKILL);
}

TEST_CASE("launch --hosts: hosts that cannot work are one-line errors before anything starts") {
  LaunchOptions o;
  o.processes = 2;
  o.hosts = {"127.0.0.1", "10.213.0.2"};
  CHECK_THROWS_WITH(launch(o, {"true"}), "host 127.0.0.1 is 127.0.0.1 (loopback) on this machine, which the other "
                                         "hosts cannot reach; give its IPv4 address");
  o.hosts = {"10.213.0.1", "user@10.213.0.2"};
  o.transport = "ipc";
  CHECK_THROWS_WITH(launch(o, {"true"}), Catch::StartsWith("--transport ipc needs every rank on one host"));
  o.transport = "";
  // (A name that does not resolve is an error too; not tested: without DNS the lookup may take long.)
  o.hosts = {"10.213.0.1", "fe80::1"};
  CHECK_THROWS_WITH(launch(o, {"true"}), Catch::Contains("IPv6 addresses are not supported"));
}

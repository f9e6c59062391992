// The ZeroMQ backend and the launcher, with real processes: the test binary launches copies of
// itself (the hidden test case "zmq child rank") through dist::launch, one per rank, and each runs
// the shared collective checks (tests/distributed/collective_checks.h) against serial references.
// Start-up errors are tested in-process, with one thread per "rank" (each its own ZeroMQ context).
#include <catch2/catch.hpp>

#include "support/shared_data.h"

#include "support/temp_dir.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <future>
#include <iostream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <zmq.hpp>

#include "distributed/collective_checks.h"
#include "distributed/launch/launcher.h"
#include "distributed/runtime.h"
#include "distributed/zmq/zmq_backend.h"
#include "distributed/zmq/zmq_transport.h"

using namespace tpcli::dist;
using namespace tpcli::testing;

namespace {

using Clock = std::chrono::steady_clock;

struct Ran {
  int code = -1;
  std::string out, err;
  double seconds = 0;
};

// Runs `command` through the launcher, capturing what it forwards.
Ran run_launch(LaunchOptions o, const std::vector<std::string>& command) {
  FILE* out = std::tmpfile();
  FILE* err = std::tmpfile();
  o.out_fd = fileno(out);
  o.err_fd = fileno(err);
  const auto t0 = Clock::now();
  Ran r;
  r.code = launch(o, command);
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  r.out = slurp_and_close(out);
  r.err = slurp_and_close(err);
  return r;
}

// `processes` copies of this test binary, each running `scenario` as one rank. shared_memory false:
// every byte over sockets, even between these local processes (TPCLI_SHM=0).
Ran run_ranks(int processes, const std::string& scenario, int devices_per_process = 1, bool stop_on_failure = true,
              int timeout_s = 20, bool shared_memory = true) {
  LaunchOptions o;
  o.processes = processes;
  o.devices_per_process = devices_per_process;
  o.timeout_s = timeout_s;
  o.kill_grace_s = 1;
  o.stop_on_failure = stop_on_failure;
  return run_launch(o, {"env", "TPCLI_ZMQ_TEST=" + scenario, shared_memory ? "TPCLI_SHM=1" : "TPCLI_SHM=0",
                        self_executable(), "zmq child rank"});
}

// A free port below Linux's ephemeral range (32768-60999): a port the kernel handed out for "*" and
// that was then released could go to the next "*" bind, such as another rank's data socket started at
// the same moment, before rank 0 binds its coordinator there ("Address already in use").
int free_port() {
  static std::mt19937 rng(std::random_device{}());
  zmq::context_t ctx;
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int port = 20000 + static_cast<int>(rng() % 12000);
    try {
      zmq::socket_t s(ctx, zmq::socket_type::rep);
      s.bind("tcp://127.0.0.1:" + std::to_string(port));
      return port;
    } catch (const zmq::error_t&) {
    }
  }
  throw std::runtime_error("no free port in 20000-31999");
}

// Waits (up to 20 s) until something listens on 127.0.0.1:port: a plain TCP connect that is
// closed at once, which a ZeroMQ socket shrugs off. (Binding the port to test it would race the
// listener's own bind.)
bool listening_within_20s(int port) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    const bool connected = ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(s);
    if (connected) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

ZmqConfig local_config(int rank, int world, int port, double timeout_s = 5) {
  ZmqConfig c;
  c.rank = rank;
  c.world_size = world;
  c.coordinator = "tcp://127.0.0.1:" + std::to_string(port);
  c.timeout_s = timeout_s;
  return c;
}

// The error a rank's start-up throws ("" if it started), run in a thread of its own.
std::future<std::string> start_rank(ZmqConfig config, int mesh_size) {
  return std::async(std::launch::async, [config, mesh_size] {
    try {
      ZmqBackend backend(config, Mesh::line(mesh_size));
      return std::string();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
  });
}

// ---- what a child rank runs ----

void every_size(Group& g, uint64_t seed) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{20000}})
    check_every_collective(g, n, seed + static_cast<uint64_t>(n));
  // Over 1 MB per message: chunked; the sums exact (member order, as the thread backend).
  const int64_t big = 700001;
  std::vector<float> x = member_input(seed, g.rank(), big);
  g.all_sum(x);
  expect_close("all_sum exact", x, tree_sum(seed, 0, g.size(), big), 0.0f, g.rank());
  check_reduce_scatter(g, big, seed + 1);
  check_all_gather(g, 300000, seed + 2);
  check_broadcast(g, 300000, 1 % g.size(), seed + 3);
  check_all_to_all_v(g, 300000, seed + 4);
  check_random_sequence(g, 150, 100000, seed + 5);
  check_typed_collectives(g, 300001, seed + 6);  // byte messages over 1 MB: chunked, odd lengths
}

// Messages larger than a shared-memory ring (4 MB): sends wait for room while receivers drain, and
// collectives whose output overlaps their input must not overwrite what is still being sent.
void beyond_ring(Group& g, uint64_t seed) {
  const int S = g.size(), r = g.rank();
  const int64_t big = 1'100'000 * S;  // 4.4 MB slices
  std::vector<float> x = member_input(seed, r, big);
  g.all_sum(x);
  expect_close("all_sum beyond the ring", x, tree_sum(seed, 0, S, big), 0.0f, r);
  check_reduce_scatter(g, big, seed + 1);
  check_broadcast(g, 1'100'000, S - 1, seed + 2);

  // In place, as Group allows: all_gather from this member's chunk of out, reduce_scatter into this
  // member's chunk of in.
  const int64_t n = 1'100'000;
  std::vector<float> gathered = nan_buffer(n * S);
  const std::vector<float> own = member_input(seed + 3, r, n);
  std::copy(own.begin(), own.end(), gathered.begin() + r * n);
  g.all_gather(std::span<const float>(gathered).subspan(static_cast<size_t>(r * n), static_cast<size_t>(n)), gathered);
  for (int m = 0; m < S; ++m) {
    const std::vector<float> y = member_input(seed + 3, m, n);
    const auto got = std::span<const float>(gathered).subspan(static_cast<size_t>(m * n), static_cast<size_t>(n));
    expect_close("all_gather in place", got, y, 0.0f, r);
  }

  std::vector<float> scattered = member_input(seed + 4, r, n * S);
  const auto mine = std::span<float>(scattered).subspan(static_cast<size_t>(r * n), static_cast<size_t>(n));
  g.reduce_scatter(scattered, mine);
  const std::vector<float> sum = serial_sum(seed + 4, S, n * S);
  expect_close("reduce_scatter in place", mine, std::span<const float>(sum).subspan(static_cast<size_t>(r * n), static_cast<size_t>(n)),
               sum_tol(S), r);
}

void child_body(const std::string& scenario, Device& dev) {
  if (scenario == "collectives") {
    every_size(dev.world(), 42);
  } else if (scenario == "started") {  // asynchronous forms, incl. messages beyond a shared-memory ring
    for (int64_t n : {int64_t{1}, int64_t{5000}, int64_t{300000}}) check_started_collectives(dev.world(), n, 500 + static_cast<uint64_t>(n));
  } else if (scenario == "beyond_ring") {
    beyond_ring(dev.world(), 7);
  } else if (scenario == "mesh2x2") {
    for (const std::vector<std::string>& axes :
         std::vector<std::vector<std::string>>{{"data"}, {"model"}, {"data", "model"}}) {
      const std::vector<int> members = dev.mesh().group_members(dev.rank(), axes);
      for (int64_t n : {int64_t{1}, int64_t{5000}, int64_t{40000}})
        check_every_collective(dev.axes(axes), n, 1000 * static_cast<uint64_t>(members[0]) + static_cast<uint64_t>(n));
    }
  } else if (scenario == "die") {  // device 1 is killed in the middle of a run of collectives
    std::vector<float> x(100000, 1.0f);
    for (int i = 0; i < 1000; ++i) {
      if (i == 3 && dev.rank() == 1) ::raise(SIGKILL);
      dev.world().all_sum(x);
      std::fill(x.begin(), x.end(), 1.0f);
    }
  } else if (scenario == "early_return") {  // device 1 skips the collective its peers make
    std::vector<float> x(10, 1.0f);
    if (dev.rank() != 1) dev.world().all_sum(x);
  } else if (scenario == "throw_started") {  // device 1 fails while the others wait on started ones
    std::vector<float> in(3000, 1.0f), out(3000), x(3000, 1.0f);
    for (int i = 0; i < 10; ++i) {
      if (i == 3 && dev.rank() == 1) throw std::runtime_error("boom");
      Pending a2a = dev.world().start_all_to_all(in, out);
      Pending bcast = dev.world().start_broadcast(x, 1);
      a2a.wait();
      bcast.wait();
    }
  } else if (scenario == "throw" || scenario == "stop") {  // device 1 fails / freezes mid-run
    std::vector<float> x(1000, 1.0f);
    for (int i = 0; i < 1000; ++i) {
      if (i == 3 && dev.rank() == 1) {
        if (scenario == "throw") throw std::runtime_error("boom");
        ::raise(SIGSTOP);
      }
      dev.world().all_sum(x);
    }
  } else {
    throw std::runtime_error("unknown TPCLI_ZMQ_TEST scenario " + scenario);
  }
}

Mesh child_mesh(const std::string& scenario, int devices) {
  if (scenario == "mesh2x2") return Mesh({{"data", 2}, {"model", 2}});
  if (scenario == "wrong_count") return Mesh::line(2);
  return Mesh::line(devices);
}

}  // namespace

// Hidden: run by the tests below, once per rank, through the launcher.
TEST_CASE("zmq child rank", "[.zmq_child]") {
  const char* scenario = std::getenv("TPCLI_ZMQ_TEST");
  REQUIRE(scenario);
  const ZmqConfig config = ZmqConfig::from_env();
  RunOptions options;
  use_zmq_backend(options, config);
  try {
    run_on_mesh(child_mesh(scenario, config.world_size * config.devices_per_process),
                [&](Device& dev) { child_body(scenario, dev); }, options);
  } catch (const std::exception& e) {
    std::cerr << "child error: " << e.what() << std::endl;
    throw;
  }
}

TEST_CASE("zmq: every collective over 2/3/4 processes matches the serial reference") {
  for (int n : {2, 3, 4}) {
    INFO(n << " processes");
    const Ran r = run_ranks(n, "collectives");
    INFO(r.err);
    CHECK(r.code == 0);
  }
}

TEST_CASE("zmq: started collectives over 2 and 3 processes equal the blocking forms and the serial reference") {
  for (int n : {2, 3}) {
    INFO(n << " processes");
    const Ran r = run_ranks(n, "started");
    INFO(r.err);
    CHECK(r.code == 0);
  }
}

TEST_CASE("zmq: every collective over sockets only (TPCLI_SHM=0) matches the serial reference") {
  for (int n : {2, 3}) {
    INFO(n << " processes");
    const Ran r = run_ranks(n, "collectives", 1, true, 20, false);
    INFO(r.err);
    CHECK(r.code == 0);
  }
}

TEST_CASE("zmq: messages beyond a shared-memory ring, and in-place collectives, over rings and sockets") {
  for (const auto& [n, shared_memory] : std::vector<std::pair<int, bool>>{{2, true}, {3, true}, {2, false}}) {
    INFO(n << " processes, shared memory " << shared_memory);
    const Ran r = run_ranks(n, "beyond_ring", 1, true, 20, shared_memory);
    INFO(r.err);
    CHECK(r.code == 0);
  }
  const Ran k2 = run_ranks(2, "beyond_ring", 2);  // 2 devices per process share the rings
  INFO(k2.err);
  CHECK(k2.code == 0);
}

TEST_CASE("zmq: sub-groups along each axis of a 2x2 mesh over 4 processes") {
  const Ran r = run_ranks(4, "mesh2x2");
  INFO(r.err);
  CHECK(r.code == 0);
}

TEST_CASE("zmq: 2 devices per process (shared memory inside and ZeroMQ between)") {
  const Ran a = run_ranks(2, "collectives", 2);
  INFO(a.err);
  CHECK(a.code == 0);
  const Ran b = run_ranks(2, "mesh2x2", 2);
  INFO(b.err);
  CHECK(b.code == 0);
}

TEST_CASE("zmq: a rank killed mid-collective makes every other rank fail promptly and name it") {
  // The launcher would stop the others itself: let them find out on their own.
  const Ran r = run_ranks(3, "die", 1, false);
  INFO(r.err);
  CHECK(r.code != 0);
  CHECK(r.seconds < 15);  // well inside the 20 s timeout: the dropped connection is noticed
  CHECK(r.err.find("[0] child error: device 0: zmq: lost rank 1") != std::string::npos);
  CHECK(r.err.find("[2] child error: device 2: zmq: lost rank 1") != std::string::npos);
  CHECK(r.err.find("rank 1 was killed by signal 9") != std::string::npos);
}

TEST_CASE("zmq: a rank that throws ends every rank's run with its message") {
  const Ran r = run_ranks(3, "throw", 1, false);
  INFO(r.err);
  CHECK(r.code != 0);
  CHECK(r.seconds < 15);
  CHECK(r.err.find("[0] child error: device 0: device 1 failed: boom") != std::string::npos);
  CHECK(r.err.find("[2] child error: device 2: device 1 failed: boom") != std::string::npos);
}

TEST_CASE("zmq: a rank that throws wakes the others waiting on a started all_to_all or broadcast with its message") {
  const Ran r = run_ranks(3, "throw_started", 1, false);
  INFO(r.err);
  CHECK(r.code != 0);
  CHECK(r.seconds < 15);
  CHECK(r.err.find("[0] child error: device 0: device 1 failed: boom") != std::string::npos);
  CHECK(r.err.find("[2] child error: device 2: device 1 failed: boom") != std::string::npos);
}

TEST_CASE("zmq: a frozen rank makes the others time out naming it and the launcher stops all") {
  const Ran r = run_ranks(2, "stop", 1, true, 2);  // 2 s timeout
  INFO(r.err);
  CHECK(r.code != 0);
  CHECK(r.seconds < 15);
  CHECK(r.err.find("[0] child error: device 0: zmq: timed out after 2 s: device 0 in all_sum got nothing from rank 1") !=
        std::string::npos);
}

TEST_CASE("zmq: a device that returns while a device of its process waits for it fails the run") {
  const Ran r = run_ranks(2, "early_return", 2, false);  // devices 0 and 1 share process 0
  INFO(r.err);
  CHECK(r.code != 0);
  CHECK(r.seconds < 15);
  CHECK(r.err.find("device 1 finished its run while device 0 in all_sum waits for it") != std::string::npos);
}

TEST_CASE("zmq: a wrong rank count is a one-line error") {
  const Ran r = run_ranks(3, "wrong_count");  // a 2-device mesh over 3 processes
  CHECK(r.code != 0);
  CHECK(r.err.find("the mesh has 2 devices but the run has 3 processes") != std::string::npos);

  // Ranks that disagree on the world size: rank 0 names the offender, which hears it too.
  const int port = free_port();
  auto root = start_rank(local_config(0, 2, port), 2);
  auto other = start_rank(local_config(1, 3, port), 3);
  const std::string e0 = root.get(), e1 = other.get();
  CHECK(e0 == "zmq: rank 1 was started with TPCLI_WORLD_SIZE=3 but rank 0 with 2 (wrong rank count)");
  CHECK(e1 == e0 + " (reported by rank 0)");
}

TEST_CASE("zmq: ranks with different configs refuse to start and name the rank") {
  const int port = free_port();
  ZmqConfig c0 = local_config(0, 2, port), c1 = local_config(1, 2, port);
  c0.config_hash = 1;
  c1.config_hash = 2;
  auto root = start_rank(c0, 2);
  auto other = start_rank(c1, 2);
  const std::string e0 = root.get(), e1 = other.get();
  CHECK(e0.find("rank 1 has config hash 2 but rank 0 has 1") != std::string::npos);
  CHECK(e1.find("rank 1 has config hash 2 but rank 0 has 1") != std::string::npos);

  // And with equal hashes the same pair starts.
  c1.config_hash = 1;
  auto ok0 = start_rank(c0, 2);
  auto ok1 = start_rank(c1, 2);
  CHECK(ok0.get() == "");
  CHECK(ok1.get() == "");
}

TEST_CASE("zmq: ranks on one host move data through shared memory unless TPCLI_SHM=0") {
  for (bool shared_memory : {true, false}) {
    const int port = free_port();
    auto start = [&](int rank) {
      return std::async(std::launch::async, [=] {
        ZmqConfig c = local_config(rank, 2, port);
        c.shared_memory = shared_memory;
        ZmqTransport transport(c, 2);
        return transport.uses_shared_memory(1 - rank);
      });
    };
    auto a = start(0), b = start(1);
    CHECK(a.get() == shared_memory);
    CHECK(b.get() == shared_memory);
  }
}

TEST_CASE("zmq: TPCLI_HOST names resolve to an address, wildcards are refused") {
  auto config_with_host = [](const char* host) {
    ::setenv("TPCLI_RANK", "0", 1);
    ::setenv("TPCLI_WORLD_SIZE", "2", 1);
    ::setenv("TPCLI_COORDINATOR", "tcp://127.0.0.1:29999", 1);
    ::setenv("TPCLI_TRANSPORT", "tcp", 1);
    ::setenv("TPCLI_HOST", host, 1);
    std::string result;
    try {
      result = ZmqConfig::from_env().host;
    } catch (const std::exception& e) {
      result = e.what();
    }
    for (const char* v : {"TPCLI_RANK", "TPCLI_WORLD_SIZE", "TPCLI_COORDINATOR", "TPCLI_TRANSPORT", "TPCLI_HOST"})
      ::unsetenv(v);
    return result;
  };
  CHECK(config_with_host("10.1.2.3") == "10.1.2.3");
  CHECK(config_with_host("localhost") == "127.0.0.1");
  CHECK(config_with_host("*") == "zmq: TPCLI_HOST=* cannot be given to the other ranks: set this host's own address");
  CHECK(config_with_host("0.0.0.0").find("cannot be given to the other ranks") != std::string::npos);
  // (An unresolvable name is not tried: with no reachable DNS server the lookup can take long.)
}

TEST_CASE("zmq: a coordinator port in use is a one-line error") {
  zmq::context_t ctx;
  zmq::socket_t squatter(ctx, zmq::socket_type::rep);
  squatter.bind("tcp://127.0.0.1:*");
  const std::string ep = squatter.get(zmq::sockopt::last_endpoint);
  const int port = std::stoi(ep.substr(ep.rfind(':') + 1));

  const std::string e = start_rank(local_config(0, 1, port), 1).get();
  CHECK(e == "zmq: rank 0 cannot bind the coordinator at " + ep +
                 ": Address already in use (port in use: choose another with --port)");

  LaunchOptions o;
  o.processes = 2;
  o.port = port;
  CHECK_THROWS_WITH(launch(o, {"true"}), Catch::Contains("--port " + std::to_string(port)) &&
                                              Catch::Contains("is not free"));
}

TEST_CASE("zmq: an unreachable coordinator is a one-line error after the timeout") {
  const auto t0 = Clock::now();
  const std::string e = start_rank(local_config(1, 2, free_port(), 1.0), 2).get();
  CHECK(e.find("rank 1 got no answer from the coordinator at tcp://127.0.0.1:") == 5);
  CHECK(std::chrono::duration<double>(Clock::now() - t0).count() < 5);
}

TEST_CASE("launch: rank 0's stdout passes through and the rest is prefixed on stderr") {
  LaunchOptions o;
  o.processes = 3;
  const Ran r = run_launch(o, {"sh", "-c", "printf 'out %s' $TPCLI_RANK; echo; echo err $TPCLI_RANK >&2"});
  CHECK(r.code == 0);
  CHECK(r.out == "out 0\n");
  CHECK(r.err.find("[0] err 0\n") != std::string::npos);
  CHECK(r.err.find("[1] out 1\n") != std::string::npos);
  CHECK(r.err.find("[2] err 2\n") != std::string::npos);

  o.tag_output = true;
  const Ran t = run_launch(o, {"sh", "-c", "echo out $TPCLI_RANK"});
  CHECK(t.out.find("[0] out 0\n") != std::string::npos);
  CHECK(t.out.find("[2] out 2\n") != std::string::npos);
}

// Issue 25: -n 1000 forked a thousand processes, and their common error came 990 times.
TEST_CASE("launch: -n beyond the ranks a host may run is one line naming -n, before any start") {
  LaunchOptions o;
  o.processes = 1000;
  CHECK_THROWS_WITH(launch(o, {"true"}), "-n 1000: 1000 ranks on this machine, more than the 256 a host may run "
                                         "(for more devices use --devices-per-process, or more --hosts)");
  o.processes = MAX_RANKS_PER_HOST + 1;
  CHECK_THROWS_WITH(launch(o, {"true"}), Catch::StartsWith("-n 257: 257 ranks on this machine"));
  // Over hosts the cap is per host: 600 ranks on 3 hosts are 200 each; two slots of one host add up.
  o.processes = 600;
  o.hosts = {"10.0.0.1", "10.0.0.2", "10.0.0.1"};
  CHECK_THROWS_WITH(launch(o, {"true"}), Catch::StartsWith("-n 600: 400 ranks on 10.0.0.1, more than the 256"));
}

TEST_CASE("launch: a line many ranks print alike is shown once, and counted at the end") {
  LaunchOptions o;
  o.processes = 12;
  o.stop_on_failure = false;  // let every rank fail with its own (identical) message
  const Ran r = run_launch(o, {"sh", "-c", "echo 'tpcli: out of file handles' >&2; echo rank $TPCLI_RANK >&2; exit 3"});
  INFO(r.err);
  CHECK(r.code == 3);
  const auto count = [&](const std::string& what) {
    size_t n = 0;
    for (size_t at = r.err.find(what); at != std::string::npos; at = r.err.find(what, at + 1)) ++n;
    return n;
  };
  CHECK(count("tpcli: out of file handles\n") == 2);  // the first rank's line, and the note
  CHECK(r.err.find("tpcli launch: (12 processes) tpcli: out of file handles\n") != std::string::npos);
  CHECK(count("] rank ") == 12);                       // lines that differ all pass
  // The rank shown repeating its own line still shows each copy; the other's copies are folded.
  o.processes = 2;
  const Ran twice = run_launch(o, {"sh", "-c", "echo again >&2; echo again >&2"});
  INFO(twice.err);
  const bool zero_first = twice.err.find("[0] again\n[0] again\n") != std::string::npos;
  const bool one_first = twice.err.find("[1] again\n[1] again\n") != std::string::npos;
  CHECK(zero_first != one_first);
  CHECK(twice.err.find("tpcli launch: (2 processes) again\n") != std::string::npos);
  // Stdout is the ranks' output: alike lines all stay.
  o.tag_output = true;
  const Ran out = run_launch(o, {"sh", "-c", "echo same"});
  CHECK(out.out.find("[0] same\n") != std::string::npos);
  CHECK(out.out.find("[1] same\n") != std::string::npos);
}

TEST_CASE("launch: the environment tells each rank its place") {
  LaunchOptions o;
  o.processes = 2;
  o.port = free_port();
  o.timeout_s = 7;
  o.tag_output = true;
  const Ran r = run_launch(o, {"sh", "-c", "echo $TPCLI_RANK/$TPCLI_WORLD_SIZE $TPCLI_COORDINATOR $TPCLI_TIMEOUT"});
  const std::string tail = " tcp://127.0.0.1:" + std::to_string(o.port) + " 7\n";
  CHECK(r.out.find("[0] 0/2" + tail) != std::string::npos);
  CHECK(r.out.find("[1] 1/2" + tail) != std::string::npos);
}

TEST_CASE("launch: one failing rank stops the others and gives its exit code") {
  LaunchOptions o;
  o.processes = 3;
  const Ran r = run_launch(o, {"sh", "-c", "if [ $TPCLI_RANK = 2 ]; then exit 5; fi; exec sleep 60"});
  CHECK(r.code == 5);
  CHECK(r.seconds < 10);  // the sleepers were stopped, not waited for
  CHECK(r.err.find("tpcli launch: rank 2 exited with code 5; stopping the other ranks") != std::string::npos);

  // A rank that ignores SIGTERM is killed after the grace period.
  o.kill_grace_s = 0.5;
  const Ran k = run_launch(o, {"sh", "-c", "if [ $TPCLI_RANK = 0 ]; then exit 3; fi; trap '' TERM; sleep 60"});
  CHECK(k.code == 3);
  CHECK(k.seconds < 10);
}

TEST_CASE("launch: bad options are one-line errors before anything starts") {
  LaunchOptions o;
  o.processes = 0;
  CHECK_THROWS_WITH(launch(o, {"true"}), "-n 0: need at least 1 rank");
  o.processes = 1;
  CHECK_THROWS_WITH(launch(o, {}), Catch::Contains("no command to launch"));
  CHECK_THROWS_WITH(read_hostfile("/nonexistent/hosts"), "--hostfile /nonexistent/hosts: cannot open");
}

// `command` plus `extra` and --backend zmq, launched as `processes` ranks.
Ran run_over_zmq(std::vector<std::string> command, int processes, const std::vector<std::string>& extra = {}) {
  command.insert(command.end(), extra.begin(), extra.end());
  command.insert(command.end(), {"--backend", "zmq"});
  LaunchOptions o;
  o.processes = processes;
  return run_launch(o, command);
}

TEST_CASE("zmq: tpcli infer over 2 and 4 processes prints exactly what the thread backend prints") {
  tpcli::testing::require_shared("data/stories260K.bin");
  tpcli::testing::require_shared("data/tok512.bin");
  const std::string data = tpcli::testing::shared_path("data/");
  for (int n : {2, 4}) {
    INFO(n << " devices");
    const std::vector<std::string> infer{TPCLI_BINARY, "infer", "--model", data + "stories260K.bin", "-z",
                                         data + "tok512.bin", "-t", "0", "-i", "Once upon a time",
                                         "--devices", std::to_string(n)};
    LaunchOptions one;
    const Ran threads = run_launch(one, infer);  // a single process: the thread backend
    REQUIRE(threads.code == 0);
    REQUIRE(threads.out.rfind("Once upon a time", 0) == 0);
    const Ran zmq = run_over_zmq(infer, n);
    INFO(zmq.err);
    CHECK(zmq.code == 0);
    CHECK(zmq.out == threads.out);
  }
}

TEST_CASE("zmq: seeded sampling over 2 and 4 processes prints what 1 device prints (fixed-order sums)") {
  tpcli::testing::require_shared("data/stories260K.bin");
  tpcli::testing::require_shared("data/tok512.bin");
  const std::string data = tpcli::testing::shared_path("data/");
  const std::vector<std::string> infer{TPCLI_BINARY, "infer", "--model", data + "stories260K.bin", "-z", data + "tok512.bin",
                                       "-t", "0.9", "-s", "11", "-n", "120", "-i", "Once upon a time"};
  const Ran one = run_launch(LaunchOptions{}, infer);
  REQUIRE(one.code == 0);
  for (int n : {2, 4}) {
    INFO(n << " processes");
    const Ran zmq = run_over_zmq(infer, n, {"--devices", std::to_string(n)});
    INFO(zmq.err);
    CHECK(zmq.code == 0);
    CHECK(zmq.out == one.out);
  }
}

// Four requests through the batched engine; its prompts file in `dir`.
std::string batch_prompts(TempDir& dir) {
  return dir.write("prompts.jsonl",
                   "{\"prompt\": \"Once upon a time\", \"max_tokens\": 30, \"temperature\": 0}\n"
                   "{\"prompt\": \"The dog\", \"max_tokens\": 20, \"seed\": 7, \"stop\": \"park\"}\n"
                   "{\"prompt\": \"Once upon a time there was\", \"max_tokens\": 25, \"temperature\": 0.8, \"seed\": 3}\n"
                   "{\"prompt\": \"Lily\", \"max_tokens\": 40, \"seed\": 9}\n");
}

TEST_CASE("zmq: infer --batch over 2 processes prints exactly what the thread backend prints") {
  tpcli::testing::require_shared("data/stories260K.bin");
  tpcli::testing::require_shared("data/tok512.bin");
  const std::string data = tpcli::testing::shared_path("data/");
  TempDir dir;
  const std::vector<std::string> infer{TPCLI_BINARY, "infer", "--model", data + "stories260K.bin", "-z", data + "tok512.bin",
                                       "--batch", batch_prompts(dir), "--parallel", "3", "--kv-blocks", "5", "--devices", "2"};
  const Ran threads = run_launch(LaunchOptions{}, infer);
  REQUIRE(threads.code == 0);
  REQUIRE(std::count(threads.out.begin(), threads.out.end(), '\n') == 4);
  const Ran zmq = run_over_zmq(infer, 2);
  INFO(zmq.err);
  CHECK(zmq.code == 0);
  CHECK(zmq.out == threads.out);  // rank 0 prints; every rank ran the same schedule
}

TEST_CASE("zmq: launched infer without --devices runs on the launched world, each rank reporting its own devices") {
  tpcli::testing::require_shared("data/stories260K.bin");
  tpcli::testing::require_shared("data/tok512.bin");
  const std::string data = tpcli::testing::shared_path("data/");
  const std::vector<std::string> infer{TPCLI_BINARY, "infer", "--model", data + "stories260K.bin", "-z",
                                       data + "tok512.bin", "-t", "0", "-n", "64", "-i", "Once upon a time"};
  std::vector<std::string> on_threads = infer;
  on_threads.insert(on_threads.end(), {"--devices", "4"});
  const Ran threads = run_launch(LaunchOptions{}, on_threads);
  REQUIRE(threads.code == 0);
  REQUIRE(threads.out.rfind("Once upon a time", 0) == 0);

  // 2 processes x 2 devices, said once: the mesh is model=4, as --devices 4 on threads.
  std::vector<std::string> over_zmq = infer;
  over_zmq.insert(over_zmq.end(), {"--backend", "zmq"});
  LaunchOptions o;
  o.processes = 2;
  o.devices_per_process = 2;
  const Ran zmq = run_launch(o, over_zmq);
  INFO(zmq.err);
  REQUIRE(zmq.code == 0);
  CHECK(zmq.out == threads.out);
  // Rank 0 hosts devices 0 and 1, rank 1 devices 2 and 3; nobody reports the other's.
  for (const char* line : {"[0] device 0: ", "[0] device 1: ", "[1] device 2: ", "[1] device 3: "})
    CHECK(zmq.err.find(line) != std::string::npos);
  for (const char* line : {"[0] device 2: ", "[0] device 3: ", "[1] device 0: ", "[1] device 1: ", "0.00 MB"})
    CHECK(zmq.err.find(line) == std::string::npos);

  // An explicit --devices still wins, and a wrong one is still the one-line error it was.
  over_zmq.insert(over_zmq.end(), {"--devices", "2"});
  const Ran wrong = run_launch(o, over_zmq);
  CHECK(wrong.code != 0);
  CHECK(wrong.err.find("has 2 devices") != std::string::npos);
}

// ---- isolation between launches (issue 12) ----

TEST_CASE("zmq: the coordinator refuses a rank of another launch and keeps waiting for its own") {
  const int port = free_port();
  ZmqConfig c0 = local_config(0, 2, port, 10), intruder = local_config(1, 2, port, 10), c1 = local_config(1, 2, port, 10);
  c0.job = c1.job = "job-a";
  intruder.job = "job-b";  // same command, same binary: only the token differs
  auto root = start_rank(c0, 2);
  const std::string refused = start_rank(intruder, 2).get();
  CHECK(refused.find("rank 1 belongs to another launch (job job-b") != std::string::npos);
  CHECK(refused.find("reported by rank 0") != std::string::npos);
  auto own = start_rank(c1, 2);
  CHECK(root.get() == "");
  CHECK(own.get() == "");
}

TEST_CASE("zmq: two launches on one port: the second fails with 'port in use', the first still starts") {
  const int port = free_port();
  ZmqConfig a0 = local_config(0, 2, port, 10), a1 = local_config(1, 2, port, 10), b0 = local_config(0, 2, port, 10);
  a0.job = a1.job = "job-a";
  b0.job = "job-b";
  auto first = start_rank(a0, 2);
  REQUIRE(listening_within_20s(port));  // a0 has bound the coordinator (a fixed sleep was too short under TSan and load)
  const std::string second = start_rank(b0, 2).get();
  CHECK(second.find("port in use") != std::string::npos);
  auto first_rank1 = start_rank(a1, 2);
  CHECK(first.get() == "");
  CHECK(first_rank1.get() == "");
}

TEST_CASE("zmq wire: hellos and chunk headers from the network are bounded before use") {
  using tpcli::dist::Hello;
  using tpcli::dist::parse_wire_header;
  using tpcli::dist::WireHeader;
  Hello h{1, 2, 1, 2, "0.1.0", "ab", "cd", "ipc://@x"};
  h.job = "0123abcd";
  const auto back = Hello::decode(h.encode());
  REQUIRE(back);
  CHECK(back->job == "0123abcd");
  CHECK(back->rank == 1);
  CHECK_FALSE(Hello::decode("HELLO -1 2 1 2 v b c i h r j"));         // negative rank
  CHECK_FALSE(Hello::decode("HELLO 1 99999999 1 2 v b c i h r j"));   // absurd world
  CHECK_FALSE(Hello::decode("HELLO 1 2 1 2 v b c i h r"));            // a field short
  CHECK_FALSE(Hello::decode("GET / HTTP/1.1"));

  auto parse = [](WireHeader w, size_t payload_bytes) {
    return parse_wire_header(std::as_bytes(std::span<const WireHeader>(&w, 1)), payload_bytes, 2, 4);
  };
  const auto data = static_cast<uint32_t>(tpcli::dist::WireKind::DATA);
  CHECK(parse({tpcli::dist::WIRE_MAGIC, data, 0, 0, 1, 2, 8, 4}, 16));        // floats 4..8 of 8
  CHECK_FALSE(parse({tpcli::dist::WIRE_MAGIC, data, 0, 0, 1, 2, 8, 5}, 16));  // would end past the message
  CHECK_FALSE(parse({tpcli::dist::WIRE_MAGIC, data, 0, 0, 1, 2, 8, -4}, 16)); // before it
  CHECK_FALSE(parse({tpcli::dist::WIRE_MAGIC, data, 0, 0, 1, 9, 8, 0}, 16));  // no device 9 in a mesh of 4
  CHECK_FALSE(parse({tpcli::dist::WIRE_MAGIC, data, 0, 0, 1, 2, 8, 0}, 15));  // not whole floats
  CHECK_FALSE(parse({tpcli::dist::WIRE_MAGIC, 77, 0, 0, 1, 2, 8, 0}, 16));    // unknown kind
  CHECK_FALSE(parse({0x12345678, data, 0, 0, 1, 2, 8, 0}, 16));               // not ours
}

// The MPI backend with real processes: the test binary starts copies of itself under mpirun (the
// hidden test case "mpi child rank"), each running the shared collective checks
// (tests/distributed/collective_checks.h) against serial references. Skipped in a build without MPI.
#include <catch2/catch.hpp>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>

#include "distributed/collective_checks.h"
#include "distributed/launch/launcher.h"
#include "distributed/mpi/mpi_backend.h"
#include "distributed/runtime.h"
#include "support/run_tpcli.h"
#include "support/shared_data.h"
#include "support/temp_dir.h"

using namespace tpcli::dist;
using namespace tpcli::testing;

namespace {

// mpirun as CI runs it: more processes than cores, and allowed as root (CI containers run as root).
std::string mpirun(int processes) {
  return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 "
         "timeout 60 mpirun --oversubscribe -n " + std::to_string(processes) + " ";
}

void require_mpi() {
  if (!mpi_available()) skip_test("this build has no MPI backend (TPCLI_MPI=OFF or no MPI found)");
}

// `processes` copies of this test binary under mpirun, each running `scenario` with K devices
// (and `environment`, "NAME=VALUE ...").
RunResult run_ranks(int processes, const std::string& scenario, int devices_per_process = 1,
                    const std::string& environment = "") {
  tpcli::testing::RunOptions o;
  o.launcher = mpirun(processes) + "env " + environment + " TPCLI_MPI_TEST=" + scenario +
               " TPCLI_MPI_K=" + std::to_string(devices_per_process);
  o.binary = self_executable();
  return run_tpcli_line("'mpi child rank'", o);
}

void child_body(const std::string& scenario, Device& dev) {
  if (scenario == "collectives") {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{70000}})
      check_every_collective(dev.world(), n, 42 + static_cast<uint64_t>(n));
    check_random_sequence(dev.world(), 60, 20000, 7);
  } else if (scenario == "mesh2x2") {  // every sub-group; with 2 devices per process not the world
    std::vector<std::vector<std::string>> groups{{"data"}, {"model"}};
    if (dev.mesh().size() == 4 && std::getenv("TPCLI_MPI_K") == std::string("1")) groups.push_back({"data", "model"});
    for (const std::vector<std::string>& axes : groups) {
      const std::vector<int> members = dev.mesh().group_members(dev.rank(), axes);
      for (int64_t n : {int64_t{1}, int64_t{5000}})
        check_every_collective(dev.axes(axes), n, 1000 * static_cast<uint64_t>(members[0]) + static_cast<uint64_t>(n));
    }
  } else if (scenario == "mixed") {  // 2 devices per process: the world has devices here and there
    Group& world = dev.world();
    for (int64_t n : {int64_t{1}, int64_t{5000}}) {
      check_every_collective(world, n, 10 + static_cast<uint64_t>(n));
      check_broadcast(world, n, 1, 30 + static_cast<uint64_t>(n));  // root 1 shares a process with 0
    }
  } else if (scenario == "freeze") {  // device 1 stops mid-run (SIGSTOP) and never comes back
    std::vector<float> x(1000, 1.0f);
    for (int i = 0; i < 1000; ++i) {
      if (i == 3 && dev.rank() == 1) ::raise(SIGSTOP);
      dev.world().all_sum(x);
    }
  } else if (scenario == "throw" || scenario == "die") {  // device 1 fails mid-run
    std::vector<float> x(1000, 1.0f);
    for (int i = 0; i < 1000; ++i) {
      if (i == 3 && dev.rank() == 1) {
        if (scenario == "throw") throw std::runtime_error("boom");
        ::raise(SIGKILL);
      }
      dev.world().all_sum(x);
    }
  } else {
    throw std::runtime_error("unknown TPCLI_MPI_TEST scenario " + scenario);
  }
}

}  // namespace

// Hidden: run by the tests below, once per process, under mpirun.
TEST_CASE("mpi child rank", "[.mpi_child]") {
  const std::string scenario = std::getenv("TPCLI_MPI_TEST");
  const int K = std::atoi(std::getenv("TPCLI_MPI_K"));
  const int devices = mpi_process_count() * K;
  const Mesh mesh = scenario.starts_with("mesh2x2") || scenario == "mixed" ? Mesh({{"data", 2}, {"model", 2}})
                                                                            : Mesh::line(devices);
  tpcli::dist::RunOptions options;
  use_mpi_backend(options, mesh.size());
  run_on_mesh(mesh, [&](Device& dev) { child_body(scenario, dev); }, options);
}

TEST_CASE("mpi: every collective over 3 processes matches the serial reference") {
  require_mpi();
  const RunResult r = run_ranks(3, "collectives");
  INFO(r.err);
  CHECK(r.code == 0);
}

TEST_CASE("mpi: sub-groups along each axis of a 2x2 mesh, one and two devices per process") {
  require_mpi();
  const RunResult one = run_ranks(4, "mesh2x2");
  INFO(one.err);
  CHECK(one.code == 0);
  const RunResult two = run_ranks(2, "mesh2x2", 2);  // model: threads inside a process; data: MPI
  INFO(two.err);
  CHECK(two.code == 0);
}

TEST_CASE("mpi: a group with devices in one process and in others does every collective, matching the serial reference") {
  require_mpi();
  const RunResult r = run_ranks(2, "mixed", 2);
  INFO(r.err);
  CHECK(r.code == 0);
  CHECK(r.err.find(", expected ") == std::string::npos);  // no check failed (collective_checks.h)
}

TEST_CASE("mpi: a rank that throws or dies ends the job promptly, naming it") {
  require_mpi();
  const RunResult thrown = run_ranks(3, "throw");
  INFO(thrown.err);
  CHECK(thrown.code != 0);
  CHECK(thrown.code != 124);  // not the timeout
  CHECK(thrown.err.find("mpi: process 1 (device 1) failed: boom") != std::string::npos);
  const RunResult killed = run_ranks(3, "die");
  INFO(killed.err);
  CHECK(killed.code != 0);
  CHECK(killed.code != 124);
  CHECK(killed.err.find("rank 1") != std::string::npos);  // mpirun's report names the rank
}

// Issue 39: a frozen rank (SIGSTOP) held the others in MPI's blocking collectives for ever. Now each
// waits TPCLI_TIMEOUT, names the rank that no longer answers (rank 2, waiting like rank 0, answers
// its roll call), and the job ends.
TEST_CASE("mpi: a frozen rank makes the others time out within TPCLI_TIMEOUT, naming it, and the job ends") {
  require_mpi();
  const auto start = std::chrono::steady_clock::now();
  const RunResult r = run_ranks(3, "freeze", 1, "TPCLI_TIMEOUT=2");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(r.err);
  CHECK(r.code != 0);
  CHECK(r.code != 124);  // ended by the timeout of the ranks, not of the test
  CHECK(r.err.find("mpi: timed out after 2 s: device ") != std::string::npos);
  CHECK(r.err.find(" in all_sum got nothing from rank 1 (stuck or unreachable") != std::string::npos);
  CHECK(r.err.find("rank 2 (") == std::string::npos);  // the rank that waits too is not blamed
  CHECK(seconds < 20);
}

TEST_CASE("mpi: a bad TPCLI_TIMEOUT is a usage error naming it") {
  require_mpi();
  require_shared("data/stories260K.bin");
  tpcli::testing::RunOptions o;
  o.launcher = mpirun(2) + "env TPCLI_TIMEOUT=soon";
  const RunResult r = run_tpcli_line("infer --model " + shell_quote(shared_path("data/stories260K.bin")) + " -z " +
                                         shell_quote(shared_path("data/tok512.bin")) + " -n 5 --backend mpi",
                                     o);
  CHECK(r.code == 2);
  CHECK(r.err.find("tpcli infer: mpi backend: TPCLI_TIMEOUT=soon must be a whole number of seconds, 1 to 86400") !=
        std::string::npos);
}

// ---- tpcli itself under mpirun, against the threads backend ----

namespace {

// The "loss" of every line of a metrics.jsonl.
std::vector<double> losses_of(const std::string& metrics) {
  std::vector<double> losses;
  for (size_t at = metrics.find("\"loss\": "); at != std::string::npos; at = metrics.find("\"loss\": ", at + 1))
    losses.push_back(std::stod(metrics.substr(at + 8)));
  return losses;
}

}  // namespace

TEST_CASE("mpi: mpirun -n 2 tpcli infer (1 and 2 devices a process) prints exactly what tpcli infer prints on threads") {
  require_mpi();
  require_shared("data/stories260K.bin");
  const std::string args = "infer --model " + shell_quote(shared_path("data/stories260K.bin")) + " -z " +
                           shell_quote(shared_path("data/tok512.bin")) + " -t 0 -n 60 -i 'Once upon a time'";
  const RunResult threads = run_tpcli_line(args + " --devices 2");
  REQUIRE(threads.code == 0);
  tpcli::testing::RunOptions o;
  o.launcher = mpirun(2);
  const RunResult mpi = run_tpcli_line(args + " --backend mpi", o);  // the mesh: the MPI world, 2 devices
  INFO(mpi.err);
  REQUIRE(mpi.code == 0);
  CHECK(mpi.out == threads.out);  // only rank 0 prints the text
  CHECK(threads.out.size() > 100);
  // Two devices in each of the 2 processes: the model axis is a group with members here and there.
  const RunResult threads4 = run_tpcli_line(args + " --devices 4");
  const RunResult mpi4 = run_tpcli_line(args + " --devices 4 --backend mpi", o);
  INFO(mpi4.err);
  REQUIRE(mpi4.code == 0);
  CHECK(mpi4.out == threads4.out);
}

// `tpcli infer` on stories260K with its tokenizer, then `flags`.
std::string infer_stories260k(const std::string& flags) {
  return "infer --model " + shell_quote(shared_path("data/stories260K.bin")) + " -z " + shell_quote(shared_path("data/tok512.bin")) +
         " " + flags;
}

// The tpcli command line `args` with --backend mpi under mpirun -n `processes`.
RunResult run_under_mpirun(const std::string& args, int processes) {
  tpcli::testing::RunOptions o;
  o.launcher = mpirun(processes);
  return run_tpcli_line(args + " --backend mpi", o);
}

TEST_CASE("mpi: seeded sampling under mpirun -n 2 and -n 4 prints what 1 device prints (fixed-order sums)") {
  require_mpi();
  require_shared("data/stories260K.bin");
  const std::string args = infer_stories260k("-t 0.9 -s 11 -n 120 -i 'Once upon a time'");
  const RunResult one = run_tpcli_line(args);
  REQUIRE(one.code == 0);
  for (int n : {2, 4}) {
    INFO(n << " processes");
    const RunResult mpi = run_under_mpirun(args, n);
    INFO(mpi.err);
    REQUIRE(mpi.code == 0);
    CHECK(mpi.out == one.out);
  }
}

TEST_CASE("mpi: mpirun -n 2 tpcli infer --batch prints exactly what the thread backend prints") {
  require_mpi();
  require_shared("data/stories260K.bin");
  TempDir dir;
  const std::string prompts = dir.write("prompts.jsonl",
                                        "{\"prompt\": \"Once upon a time\", \"max_tokens\": 30, \"temperature\": 0}\n"
                                        "{\"prompt\": \"The dog\", \"max_tokens\": 20, \"seed\": 7}\n"
                                        "{\"prompt\": \"Lily\", \"max_tokens\": 40, \"seed\": 9}\n");
  const std::string args = infer_stories260k("--batch " + shell_quote(prompts) + " --parallel 2 --kv-blocks 4 --devices 2");
  const RunResult threads = run_tpcli_line(args);
  REQUIRE(threads.code == 0);
  const RunResult mpi = run_under_mpirun(args, 2);
  INFO(mpi.err);
  REQUIRE(mpi.code == 0);
  CHECK(mpi.out == threads.out);
  CHECK(std::count(threads.out.begin(), threads.out.end(), '\n') == 3);
}

TEST_CASE("mpi: a rank whose model file is missing ends the whole job with its error, no rank left waiting") {
  require_mpi();
  require_shared("data/stories260K.bin");
  // Rank 1 gets a model path that does not exist; rank 0 the real one, so it waits for rank 1 in
  // the first collective. A normal exit of rank 1 would leave it there (until mpirun's timeout).
  tpcli::testing::RunOptions o;
  o.launcher = mpirun(2) +
               "sh -c 'if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then set -- \"$0\" infer --model /nonexistent/model.bin "
               "--backend mpi; else set -- \"$0\" \"$@\"; fi; exec \"$@\"'";
  const RunResult r = run_tpcli_line("infer --model " + shell_quote(shared_path("data/stories260K.bin")) + " -z " +
                                         shell_quote(shared_path("data/tok512.bin")) + " -n 200 -i 'Once' --backend mpi",
                                     o);
  INFO(r.err);
  CHECK(r.code != 0);
  CHECK(r.code != 124);  // not ended by the timeout: ended by the failing rank
  CHECK(r.err.find("/nonexistent/model.bin") != std::string::npos);
}

TEST_CASE("mpi: mpirun -n 4 and -n 2 tpcli train on a 2x2 mesh have the threads backend's losses, rank 0 writing") {
  require_mpi();
  const TempDir dir;
  const std::string args = "train " + shell_quote(std::string(TPCLI_SOURCE_DIR) + "/configs/tiny.toml") +
                           " --mesh data=2,model=2 --set train.steps=3 --set train.batch_size=4 --set "
                           "train.seq_len=32 --set train.eval_every=0 --set train.sample_tokens=0 --set "
                           "train.log_every=1 --set train.out_dir=";
  const RunResult threads = run_tpcli_line(args + shell_quote((dir.path() / "threads").string()));
  INFO(threads.err);
  REQUIRE(threads.code == 0);
  tpcli::testing::RunOptions o;
  o.launcher = mpirun(4);
  const RunResult mpi = run_tpcli_line(args + shell_quote((dir.path() / "mpi").string()) + " --backend mpi", o);
  INFO(mpi.err);
  REQUIRE(mpi.code == 0);
  const std::vector<double> want = losses_of(slurp(dir.path() / "threads" / "metrics.jsonl"));
  const std::vector<double> got = losses_of(slurp(dir.path() / "mpi" / "metrics.jsonl"));
  REQUIRE(want.size() == 3);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) CHECK(std::abs(got[i] - want[i]) <= 1e-6);
  CHECK(std::filesystem::exists(dir.path() / "mpi" / "latest.safetensors"));
  // Only rank 0 reports: the summary line once.
  size_t summaries = 0;
  for (size_t at = mpi.out.find("final loss"); at != std::string::npos; at = mpi.out.find("final loss", at + 1)) ++summaries;
  CHECK(summaries == 1);

  // 2 processes x 2 devices: the model axis inside each process, data and the world across.
  tpcli::testing::RunOptions two;
  two.launcher = mpirun(2);
  const RunResult k2 = run_tpcli_line(args + shell_quote((dir.path() / "k2").string()) + " --backend mpi", two);
  INFO(k2.err);
  REQUIRE(k2.code == 0);
  const std::vector<double> got_k2 = losses_of(slurp(dir.path() / "k2" / "metrics.jsonl"));
  REQUIRE(got_k2.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) CHECK(std::abs(got_k2[i] - want[i]) <= 1e-6);
}

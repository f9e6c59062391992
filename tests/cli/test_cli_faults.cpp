// The command line under bad input (issue 12): CLI11's errors are one line with the tpcli prefix;
// a FIFO or a directory where a file belongs is refused by name at once; NaN sampling settings
// are refused before anything runs.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "support/run_tpcli.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;

using tpcli::testing::scratch;

namespace {

using Run = tpcli::testing::RunResult;

// Under a 20 s timeout: a blocked open fails the test (exit 124) instead of hanging the suite.
Run run_tpcli(const std::string& args) {
  return tpcli::testing::run_tpcli_line(
      args, {.cwd = TPCLI_SOURCE_DIR, .environment = "OMP_WAIT_POLICY=passive", .timeout_seconds = 20});
}

int lines_of(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

// A random-weight model with a 512-token vocabulary (models/stories260K.toml), made once.
const std::string& model_file() {
  static const std::string path = [] {
    const std::string p = (scratch() / "model.bin").string();
    const Run r = run_tpcli("init --model-config models/stories260K.toml --out " + p + " --seed 1");
    REQUIRE(r.code == 0);
    return p;
  }();
  return path;
}

}  // namespace

TEST_CASE("cli faults: CLI11's errors are one line with the tpcli prefix, exit 2") {
  for (const auto& [args, expect] : std::vector<std::pair<std::string, std::string>>{
           {"infer", "tpcli infer: --model is required"},
           {"infer --model x --bogus", "tpcli infer: "},
           {"train", "tpcli train: "},
           {"infer --model x -n notanumber", "tpcli infer: "},
           {"nosuchcommand", "tpcli: "}}) {
    INFO("tpcli " << args);
    const Run r = run_tpcli(args);
    INFO("stderr: " << r.err);
    CHECK(r.code == 2);
    CHECK(lines_of(r.err) == 1);
    CHECK(r.err.rfind(expect, 0) == 0);
  }
  const Run help = run_tpcli("infer --help");  // help stays CLI11's, exit 0
  CHECK(help.code == 0);
  CHECK(help.out.find("--model") != std::string::npos);
}

TEST_CASE("cli faults: a FIFO as --model or -z is refused by name at once") {
  const std::string fifo = (scratch() / "pipe").string();
  fs::remove(fifo);
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  for (const std::string& args : {"infer --model " + fifo, "infer --model " + model_file() + " -z " + fifo + " -n 4",
                                  "inspect " + fifo + ".bin"}) {
    INFO("tpcli " << args);
    if (args.starts_with("inspect")) fs::rename(fifo, fifo + ".bin");
    const Run r = run_tpcli(args);
    INFO("stderr: " << r.err);
    CHECK(r.code != 0);
    CHECK(r.code != 124);  // not killed by the timeout
    CHECK(r.seconds < 10);
    CHECK(lines_of(r.err) == 1);
    CHECK(r.err.find("is a FIFO (named pipe)") != std::string::npos);
  }
}

// A directory is a valid -z when it holds a tokenizer.json; an empty one is refused by name.
TEST_CASE("cli faults: a tokenizer path that is a directory names the path") {
  const std::string dir = scratch().string();
  const Run r = run_tpcli("infer --model " + model_file() + " -z " + dir + " -n 4");
  INFO("stderr: " << r.err);
  CHECK(r.code == 2);
  CHECK(lines_of(r.err) == 1);
  CHECK(r.err.find(dir + ": no tokenizer.json in this directory") != std::string::npos);
}

TEST_CASE("cli faults: -t nan and -p nan are refused with one line before generating") {
  for (const std::string flag : {"-t nan", "-p nan", "-t inf"}) {
    INFO(flag);
    const Run r = run_tpcli("infer --model " + model_file() + " -z /nonexistent/tok.bin -n 4 " + flag);
    INFO("stderr: " << r.err);
    CHECK(r.code == 2);
    CHECK(lines_of(r.err) == 1);
    CHECK(r.err.find("is not a finite number") != std::string::npos);
    CHECK(r.out.empty());
  }
}

// Issue 25: absurd modelled links ran forever (or, inf, did nothing).
TEST_CASE("cli faults: absurd --link values are one line naming the flag and the bound, exit 2") {
  for (const auto& [args, expect] : std::vector<std::pair<std::string, std::string>>{
           {"infer --model " + model_file() + " -n 2 --devices 2 --link model=1,1e12",
            "tpcli infer: --link model=1,1e12: latency 1e+12 us is beyond 1e+06 us"},
           {"infer --model " + model_file() + " -n 2 --devices 2 --link model=1e-12,1",
            "tpcli infer: --link model=1e-12,1: bandwidth 1e-12 GB/s is below 0.001 GB/s"},
           {"infer --model " + model_file() + " -n 2 --devices 2 --link model=1,inf",
            "tpcli infer: --link model=1,inf: latency inf us is not a finite number >= 0"}}) {
    INFO("tpcli " << args);
    const Run r = run_tpcli(args);
    INFO("stderr: " << r.err);
    CHECK(r.code == 2);
    CHECK(lines_of(r.err) == 1);
    CHECK(r.err.rfind(expect, 0) == 0);
  }
}

// Issue 25: -n 1000 started a thousand processes.
TEST_CASE("cli faults: launch -n beyond the ranks a host may run is one line naming -n, exit 2") {
  const Run r = run_tpcli("launch -n 1000 -- true");
  INFO("stderr: " << r.err);
  CHECK(r.code == 2);
  CHECK(lines_of(r.err) == 1);
  CHECK(r.err.rfind("tpcli launch: -n 1000: 1000 ranks on this machine, more than the 256 a host may run", 0) == 0);
}

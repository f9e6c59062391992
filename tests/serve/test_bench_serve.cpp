// serve/: `tpcli bench serve` as a user runs it: against a tpcli serve it starts itself (--model), every
// request of every level succeeds and is counted in its row; with nothing to reach, or neither --url
// nor --model, it says so in one line and exits non-zero. With --json-schema each level runs again
// constrained: its row, and the ratio of the two levels' output rates.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "support/run_tpcli.h"
#include "support/shared_data.h"
#include "support/temp_dir.h"

using namespace tpcli::testing;

namespace {

int lines_of(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

// The table row of `clients` (it starts "|       C |"), or "" when there is none.
std::string row_of(const std::string& out, int clients) {
  const std::string start = "| " + std::string(7 - std::to_string(clients).size(), ' ') + std::to_string(clients) + " |";
  const size_t at = out.find(start);
  return at == std::string::npos ? "" : out.substr(at, out.find('\n', at) - at);
}

}  // namespace

TEST_CASE("bench serve: --model serves stories260K itself, and every request of 1 and 3 clients succeeds") {
  require_shared("data/stories260K.bin");
  const RunResult r = run_tpcli({"bench", "serve", "--model", shared_path("data/stories260K.bin"), "-z",
                                 shared_path("data/tok512.bin"), "--devices", "2", "--parallel", "4", "--clients", "1,3",
                                 "--prompt-tokens", "8", "--max-tokens", "6", "--requests-per-client", "2"},
                                {.environment = "OMP_WAIT_POLICY=passive", .timeout_seconds = 120});
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.code == 0);
  // | clients | requests | failed | ...: 2 and 6 requests, none failed, the first level its own 1.00x
  CHECK(row_of(r.out, 1).rfind("|       1 |        2 |      0 |", 0) == 0);
  CHECK(row_of(r.out, 1).find("1.00x") != std::string::npos);
  CHECK(row_of(r.out, 3).rfind("|       3 |        6 |      0 |", 0) == 0);
  CHECK(r.out.find("failed; the first") == std::string::npos);
}

TEST_CASE("bench serve: --json-schema runs each level again with the schema, every request succeeding, and prints the ratio") {
  require_shared("data/stories260K.bin");
  const TempDir tmp;
  const std::string schema = tmp.write("schema.json", R"({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})");
  const RunResult r = run_tpcli({"bench", "serve", "--model", shared_path("data/stories260K.bin"), "-z",
                                 shared_path("data/tok512.bin"), "--parallel", "4", "--clients", "2", "--prompt-tokens", "8",
                                 "--max-tokens", "40", "--requests-per-client", "2", "--json-schema", schema},
                                {.environment = "OMP_WAIT_POLICY=passive", .timeout_seconds = 120});
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.code == 0);
  CHECK(row_of(r.out, 2).rfind("|       2 |        4 |      0 |", 0) == 0);
  CHECK(r.out.find("| 2+schema |        4 |      0 |") != std::string::npos);
  CHECK(r.out.find("2 clients with a JSON schema each: ") != std::string::npos);
  CHECK(r.out.find("failed; the first") == std::string::npos);

  const std::string bad = tmp.write("bad.json", "{not json");
  const RunResult refused = run_tpcli({"bench", "serve", "--url", "http://127.0.0.1:1", "--json-schema", bad}, {.timeout_seconds = 30});
  CHECK(refused.code == 2);
  CHECK(lines_of(refused.err) == 1);
  CHECK(refused.err.find("--json-schema " + bad) != std::string::npos);
}

TEST_CASE("bench serve: an unreachable server or a missing target is one line, non-zero") {
  const RunResult refused = run_tpcli({"bench", "serve", "--url", "http://127.0.0.1:1", "--clients", "1"},
                                      {.timeout_seconds = 30});
  CHECK(refused.code == 1);
  CHECK(lines_of(refused.err) == 1);
  CHECK(refused.err.find("cannot reach http://127.0.0.1:1") != std::string::npos);
  const RunResult neither = run_tpcli({"bench", "serve", "--clients", "1"}, {.timeout_seconds = 30});
  CHECK(neither.code == 2);
  CHECK(lines_of(neither.err) == 1);
  const RunResult stray = run_tpcli({"bench", "serve", "--url", "http://127.0.0.1:1", "--devices", "2"}, {.timeout_seconds = 30});
  CHECK(stray.code == 2);
  CHECK(stray.err.find("--devices") != std::string::npos);
}

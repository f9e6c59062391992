// Test support: what a refused command line must look like — exit code 2, one line on stderr
// naming the culprit, nothing on stdout.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "support/run_tpcli.h"

namespace tpcli::testing {

inline void check_one_line_error(const RunResult& r, const std::string& expect) {
  INFO(r.err);
  CHECK(r.code == 2);
  CHECK(r.err.find(expect) != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(r.out.empty());
}

}  // namespace tpcli::testing

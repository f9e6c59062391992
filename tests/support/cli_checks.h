// Test support for command-line tests: what a refused command line must look like (exit code 2,
// one line on stderr naming the culprit, nothing on stdout), and `tpcli logits`'s output read back.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "support/run_tpcli.h"

namespace tpcli::testing {

inline void check_one_line_error(const RunResult& r, const std::string& expect) {
  INFO(r.err);
  CHECK(r.code == 2);
  CHECK(r.err.find(expect) != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(r.out.empty());
}

// Lines of space-separated numbers (`tpcli logits`: [P][V]).
inline std::vector<std::vector<double>> parse_rows(const std::string& text) {
  std::vector<std::vector<double>> rows;
  std::stringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::vector<double>& row = rows.emplace_back();
    std::stringstream in(line);
    for (double x; in >> x;) row.push_back(x);
  }
  return rows;
}

}  // namespace tpcli::testing

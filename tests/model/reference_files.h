// Test helpers: locating /work/shared files and reading llama2.c's reference outputs.
#pragma once

#include <catch2/catch.hpp>

#include "support/shared_data.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace tpcli::testing {

inline std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

inline std::vector<int> parse_ints(const std::string& s) {
  std::vector<int> out;
  std::istringstream in(s);
  int v;
  while (in >> v) out.push_back(v);
  return out;
}

// A JSON string literal (with its quotes) -> its bytes (\uXXXX below 0x80 and UTF-8 above).
inline std::string json_string(const std::string& lit) {
  REQUIRE(lit.size() >= 2);
  REQUIRE(lit.front() == '"');
  std::string out;
  for (size_t i = 1; i + 1 < lit.size(); ++i) {
    char c = lit[i];
    if (c != '\\') {
      out += c;
      continue;
    }
    c = lit[++i];
    switch (c) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'u': {
        unsigned cp = std::stoul(lit.substr(i + 1, 4), nullptr, 16);
        i += 4;
        if (cp < 0x80) out += static_cast<char>(cp);
        else if (cp < 0x800) { out += static_cast<char>(0xC0 | (cp >> 6)); out += static_cast<char>(0x80 | (cp & 0x3F)); }
        else { out += static_cast<char>(0xE0 | (cp >> 12)); out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F)); out += static_cast<char>(0x80 | (cp & 0x3F)); }
        break;
      }
      default: out += c;
    }
  }
  return out;
}

// One line of reference/llama2c_stories260K.tsv.
struct RunCase {
  std::string name, prompt;
  float temperature = 0, topp = 0;
  unsigned long long seed = 0;  // 0: none given
  int steps = 0;
  std::string stdout_text;
  std::vector<int> token_ids;
};

inline std::vector<RunCase> read_run_cases() {
  std::ifstream in(shared_path("reference/llama2c_stories260K.tsv"));
  std::string line;
  std::getline(in, line);
  const auto header = split(line, '\t');
  auto col = [&](const std::string& name) {
    for (size_t i = 0; i < header.size(); ++i)
      if (header[i] == name) return i;
    FAIL("column " << name << " missing from llama2c_stories260K.tsv");
    return size_t{0};
  };
  std::vector<RunCase> cases;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto f = split(line, '\t');
    RunCase c;
    c.name = f[col("case")];
    c.prompt = json_string(f[col("prompt_json")]);
    c.temperature = std::stof(f[col("temperature")]);
    c.topp = std::stof(f[col("topp")]);
    c.seed = f[col("seed")].empty() ? 0 : std::stoull(f[col("seed")]);
    c.steps = std::stoi(f[col("steps")]);
    c.stdout_text = json_string(f[col("stdout_json")]);
    c.token_ids = parse_ints(f[col("token_ids")]);
    cases.push_back(std::move(c));
  }
  return cases;
}

}  // namespace tpcli::testing

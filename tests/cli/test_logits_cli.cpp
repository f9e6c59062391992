// cli/: `tpcli logits` and `tpcli infer --tokens ... --ids`, the interfaces that compare tpcli with
// transformers or llama.cpp on the same token ids, checked against ../shared/reference/hf-archs
// (an independent float64 PyTorch forward pass of a Hugging Face Llama directory): every logit of
// every position on 1 and 3 devices, and the greedy continuation id for id. Bad --tokens values
// are one-line errors.
//
// Dimension legend: P prompt positions, V vocab_size.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "support/cli_checks.h"
#include "support/run_tpcli.h"
#include "support/shared_data.h"
#include "support/temp_dir.h"

namespace {

using Result = tpcli::testing::RunResult;
using tpcli::testing::check_one_line_error;
using tpcli::testing::parse_rows;

Result run(const std::vector<std::string>& args, const std::string& cwd = "") {
  return tpcli::testing::run_tpcli(args, {.cwd = cwd, .environment = "OMP_WAIT_POLICY=passive", .timeout_seconds = 120});
}

const char* LLAMA = "reference/hf-archs/llama";

// "153,270,108\n" -> the same text without its line end.
std::string ids_text(const std::string& relative) {
  std::string text = tpcli::testing::slurp(tpcli::testing::shared_path(relative));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  return text;
}

std::vector<int> parse_ids(const std::string& text) {
  std::vector<int> ids;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) ids.push_back(std::stoi(item));
  return ids;
}



}  // namespace

TEST_CASE("logits: every position's logits of a Hugging Face Llama match the float64 reference to 1e-4 on 1 and 3 devices") {
  tpcli::testing::require_shared(std::string(LLAMA) + ".logits.txt");
  const std::string model = tpcli::testing::shared_path(LLAMA);
  const std::string tokens = ids_text(std::string(LLAMA) + ".tokens.txt");
  const auto expected = parse_rows(tpcli::testing::slurp(tpcli::testing::shared_path(std::string(LLAMA) + ".logits.txt")));
  REQUIRE(expected.size() == parse_ids(tokens).size());
  for (const char* devices : {"1", "3"}) {
    INFO("devices " << devices);
    const Result r = run({"logits", "--model", model, "--tokens", tokens, "--devices", devices});
    INFO(r.err);
    REQUIRE(r.code == 0);
    const auto got = parse_rows(r.out);  // [P][V]
    REQUIRE(got.size() == expected.size());
    double worst = 0;
    for (size_t p = 0; p < got.size(); ++p) {
      REQUIRE(got[p].size() == expected[p].size());
      for (size_t v = 0; v < got[p].size(); ++v) worst = std::max(worst, std::abs(got[p][v] - expected[p][v]));
    }
    CHECK(worst < 1e-4);
  }
}

TEST_CASE("infer --tokens --ids: a Hugging Face Llama without a tokenizer continues the ids greedily as the reference") {
  tpcli::testing::require_shared(std::string(LLAMA) + ".greedy.txt");
  const std::string model = tpcli::testing::shared_path(LLAMA);
  const std::string tokens = ids_text(std::string(LLAMA) + ".tokens.txt");
  const std::vector<int> greedy = parse_ids(ids_text(std::string(LLAMA) + ".greedy.txt"));
  REQUIRE(greedy.size() == 32);
  for (const char* devices : {"1", "3"}) {
    INFO("devices " << devices);
    const Result r = run({"infer", "--model", model, "--tokens", tokens, "-t", "0", "-n", "56", "--ids", "--devices", devices});
    INFO(r.err);
    REQUIRE(r.code == 0);
    CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);  // one JSON array, nothing else
    // -n 56 runs 56 positions: 24 prompt ids, then 32 picked ids fed, and the one picked after the last.
    const std::vector<int> got = nlohmann::json::parse(r.out).get<std::vector<int>>();
    REQUIRE(got.size() == 33);
    CHECK(std::vector<int>(got.begin(), got.begin() + 32) == greedy);
  }
}

TEST_CASE("infer --tokens --ids: a llama2.c .bin runs without a tokenizer.bin, all -n positions") {
  tpcli::testing::require_shared("data/stories260K.bin");
  const tpcli::testing::TempDir empty;  // no tokenizer.bin in the working directory
  const Result r = run({"infer", "--model", tpcli::testing::shared_path("data/stories260K.bin"), "--tokens", "1,403,407",
                        "-t", "0", "-n", "20", "--ids"},
                       empty.path().string());
  INFO(r.err);
  REQUIRE(r.code == 0);
  const std::vector<int> got = nlohmann::json::parse(r.out).get<std::vector<int>>();
  CHECK(got.size() == 18);  // 20 positions: 2 ids forced after the first, 18 picked
}

TEST_CASE("logits and infer --ids: a bad --tokens value is a one-line error naming it") {
  tpcli::testing::require_shared(LLAMA);
  const std::string model = tpcli::testing::shared_path(LLAMA);
  struct Case {
    std::string tokens, expect;
  };
  for (const Case& c : std::vector<Case>{{"", "--tokens '': no token ids"},
                                         {"5,x,7", "--tokens 5,x,7: 'x' (item 2) is not an integer"},
                                         {"5,,7", "--tokens 5,,7: '' (item 2) is not an integer"},
                                         {"5,", "--tokens 5,: '' (item 2) is not an integer"},
                                         {"1.5", "--tokens 1.5: '1.5' (item 1) is not an integer"},
                                         {"5,512", "--tokens 5,512: token id 512 is outside the vocabulary [0, 512)"},
                                         {"-1", "--tokens -1: token id -1 is outside the vocabulary"},
                                         {"99999999999999999999", "is not an integer token id"}}) {
    INFO(c.tokens);
    check_one_line_error(run({"logits", "--model", model, "--tokens", c.tokens}), c.expect);
    check_one_line_error(run({"infer", "--model", model, "--tokens", c.tokens, "--ids", "-n", "4"}), c.expect);
  }
  // More ids than the context holds.
  const std::string too_many = "--tokens 5,6,7,8,9: 5 token ids, more than the model's context of 4 positions";
  check_one_line_error(run({"logits", "--model", model, "--context", "4", "--tokens", "5,6,7,8,9"}), too_many);
  check_one_line_error(run({"infer", "--model", model, "--context", "4", "--tokens", "5,6,7,8,9", "--ids"}), too_many);
  // --tokens and --ids go together, and exclude a text prompt.
  for (const std::vector<std::string>& extra : std::vector<std::vector<std::string>>{
           {"--tokens", "5,6"}, {"--ids"}, {"--tokens", "5,6", "--ids", "-i", "hello"}}) {
    std::vector<std::string> args = {"infer", "--model", model};
    args.insert(args.end(), extra.begin(), extra.end());
    const Result r = run(args);
    INFO(r.err);
    CHECK(r.code == 2);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(r.out.empty());
  }
}

TEST_CASE("logits, infer and inspect: a Qwen3-MoE directory with its experts dealt over --mesh expert=2,model=2") {
  const std::string name = "reference/hf-archs/qwen3_moe";
  tpcli::testing::require_shared(name + ".logits.txt");
  const std::string model = tpcli::testing::shared_path(name);
  const std::string tokens = ids_text(name + ".tokens.txt");
  const auto expected = parse_rows(tpcli::testing::slurp(tpcli::testing::shared_path(name + ".logits.txt")));
  const Result r = run({"logits", "--model", model, "--tokens", tokens, "--mesh", "expert=2,model=2"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto got = parse_rows(r.out);
  REQUIRE(got.size() == expected.size());
  double worst = 0;
  for (size_t p = 0; p < got.size(); ++p) {
    REQUIRE(got[p].size() == expected[p].size());
    for (size_t v = 0; v < got[p].size(); ++v) worst = std::max(worst, std::abs(got[p][v] - expected[p][v]));
  }
  CHECK(worst <= 1e-4);
  const Result ids = run({"infer", "--model", model, "--tokens", tokens, "-t", "0", "-n", "56", "--ids", "--mesh", "expert=2"});
  INFO(ids.err);
  REQUIRE(ids.code == 0);
  const auto generated = nlohmann::json::parse(ids.out).get<std::vector<int>>();
  const std::vector<int> want = parse_ids(ids_text(name + ".greedy.txt"));
  REQUIRE(generated.size() >= want.size());
  CHECK(std::vector<int>(generated.begin(), generated.begin() + static_cast<std::ptrdiff_t>(want.size())) == want);
  const Result plan = run({"inspect", model, "--mesh", "expert=2,model=2"});
  INFO(plan.out << plan.err);
  REQUIRE(plan.code == 0);
  CHECK(plan.out.find("layers.1.experts.w1     f32[8@expert, 32@model, 64]") != std::string::npos);
  CHECK(plan.out.find("all_to_all_v moves at most 1.0 KB per MoE block") != std::string::npos);
}

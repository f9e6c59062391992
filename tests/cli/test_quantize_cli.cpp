// tpcli quantize / infer --quantize / perplexity / inspect on a quantized file, as a user meets
// them (subprocesses of TPCLI_BINARY), on the real stories260K model: the quantized file generates
// the same text on 1 and 2 devices and as the same quantization done on load; bad flags are
// one-line errors with exit 2.
#include <catch2/catch.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "support/run_tpcli.h"
#include "support/temp_dir.h"

using tpcli::testing::TempDir;

namespace {

using Result = tpcli::testing::RunResult;

// Runs tpcli with `args` (stdin closed), capturing stdout, stderr and the exit code.
Result run(const std::vector<std::string>& args) { return tpcli::testing::run_tpcli(args); }

const std::string SHARED = TPCLI_SHARED_DIR;
const std::string MODEL = SHARED + "/data/stories260K.bin";
const std::string TOKENIZER = SHARED + "/data/tok512.bin";

double perplexity_of(const std::string& out) {
  const size_t at = out.find("perplexity ");
  REQUIRE(at != std::string::npos);
  return std::stod(out.substr(at + 11));
}

}  // namespace

TEST_CASE("tpcli quantize writes a file that infer runs the same on 1 and 2 devices and as --quantize on load",
          "[quantize]") {
  if (!std::filesystem::exists(MODEL) || !std::filesystem::exists(TOKENIZER)) {
    WARN("SKIPPED: " << MODEL << " absent");
    return;
  }
  TempDir dir;
  const std::string q8 = (dir.path() / "q8.safetensors").string();
  const Result made = run({"quantize", "--model", MODEL, "--out", q8, "--bits", "8", "--group-size", "32"});
  REQUIRE(made.code == 0);
  CHECK(made.err.find("affine 8-bit g32") != std::string::npos);
  const std::vector<std::string> gen = {"-z", TOKENIZER, "-t", "0", "-n", "48", "-i", "Once upon a time"};
  auto infer = [&](std::vector<std::string> args) {
    args.insert(args.begin(), "infer");
    args.insert(args.end(), gen.begin(), gen.end());
    return run(args);
  };
  const Result one = infer({"--model", q8}), two = infer({"--model", q8, "--devices", "2"});
  const Result on_load = infer({"--model", MODEL, "--quantize", "8", "--group-size", "32"});
  REQUIRE(one.code == 0);
  CHECK(one.out.find("Once upon a time") != std::string::npos);
  CHECK(two.out == one.out);
  CHECK(on_load.out == one.out);
  // 4 devices hold 2 heads of 8 = 16 of wo's columns, cutting its groups of 32: each holds the groups they touch
  const Result four = infer({"--model", q8, "--devices", "4"});
  CHECK(four.code == 0);
  CHECK(four.out == one.out);

  const Result inspect = run({"inspect", q8});
  CHECK(inspect.code == 0);
  CHECK(inspect.out.find("quantization affine 8-bit g32") != std::string::npos);
  CHECK(inspect.out.find("weight bytes per device (MB): 1:") != std::string::npos);

  // perplexity of a short text: the same on 2 devices, and the f32 model's is close
  const std::string text = (dir.path() / "text.txt").string();
  std::ofstream(text) << "Once upon a time, there was a little girl named Lily. She liked to play outside in the sun. "
                         "One day, she saw a big dog in the park. The dog was happy and wagged its tail.\n";
  const Result p1 = run({"perplexity", "--model", q8, "--data", text, "-z", TOKENIZER, "-c", "16"});
  const Result p2 = run({"perplexity", "--model", q8, "--data", text, "-z", TOKENIZER, "-c", "16", "--devices", "2"});
  const Result pf = run({"perplexity", "--model", MODEL, "--data", text, "-z", TOKENIZER, "-c", "16"});
  REQUIRE(p1.code == 0);
  REQUIRE(p2.code == 0);
  REQUIRE(pf.code == 0);
  CHECK(perplexity_of(p2.out) == Approx(perplexity_of(p1.out)).epsilon(1e-4));
  CHECK(perplexity_of(p1.out) == Approx(perplexity_of(pf.out)).epsilon(0.02));
  // --decode: token by token through the matrix-vector kernels, the batched figure up to rounding;
  // with --int8-activations the activations' int8 rounding moves it more. On this 260K-parameter
  // model and 16-token windows the shift is chaotic: a build whose f32 code rounds differently
  // (the ASan build) moved it 2.4% (1.9358 to 1.9821), so the bound is 5%: it still catches a wrong
  // scale or bias term, which multiplies the perplexity.
  const Result pd = run({"perplexity", "--model", q8, "--data", text, "-z", TOKENIZER, "-c", "16", "--decode"});
  const Result pi = run({"perplexity", "--model", q8, "--data", text, "-z", TOKENIZER, "-c", "16", "--decode",
                         "--int8-activations"});
  // the batched forward takes int8 activations too (the same kernels, batch-invariant)
  const Result pb = run({"perplexity", "--model", q8, "--data", text, "-z", TOKENIZER, "-c", "16", "--int8-activations"});
  REQUIRE(pd.code == 0);
  REQUIRE(pi.code == 0);
  REQUIRE(pb.code == 0);
  CHECK(perplexity_of(pd.out) == Approx(perplexity_of(p1.out)).epsilon(1e-4));
  CHECK(perplexity_of(pi.out) == Approx(perplexity_of(p1.out)).epsilon(0.05));
  CHECK(perplexity_of(pb.out) == Approx(perplexity_of(pi.out)).epsilon(1e-4));
}

TEST_CASE("quantize, infer --quantize and perplexity: bad input is one line, exit 2", "[quantize]") {
  TempDir dir;
  const std::string out = (dir.path() / "q.safetensors").string();
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"quantize", "--model", MODEL, "--out", out, "--bits", "3"},
           {"quantize", "--model", MODEL, "--out", out, "--group-size", "48"},
           {"quantize", "--model", MODEL, "--out", out, "--mode", "nvfp4"},
           {"quantize", "--model", MODEL, "--out", (dir.path() / "q.bin").string()},
           {"quantize", "--model", (dir.path() / "missing.bin").string(), "--out", out},
           {"infer", "--model", MODEL, "--quantize", "5"},
           {"perplexity", "--model", MODEL, "--data", (dir.path() / "missing.txt").string(), "-z", TOKENIZER}}) {
    INFO(args[0] << " " << args.back());
    const Result r = run(args);
    CHECK(r.code == 2);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK_FALSE(std::filesystem::exists(out));
  }
}

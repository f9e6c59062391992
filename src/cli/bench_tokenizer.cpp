// tpcli bench tokenizer [--corpus FILE] [--tokenizer PATH ...] [--repeats R]
//
// Encoding speed of each tokenizer on one corpus (default ../shared/data/tinyshakespeare.txt with
// the llama2.c and Hugging Face tokenizers of ../shared/data), against a baseline measured in the
// same run: a pass that turns every byte into an id (what any tokenizer must at least read and
// write). Reports MB/s, tokens, and the time relative to that pass; decoding is checked to give the
// text back where the tokenizer is lossless on it.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "files/regular_file.h"
#include "formats/gguf_vocabulary.h"

namespace tpcli::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct BenchTokenizerFlags {
  std::string corpus = "../shared/data/tinyshakespeare.txt";
  std::vector<std::string> tokenizers = {"../shared/data/tok512.bin", "../shared/data/tokenizer.bin",
                                         "../shared/data/hf-tokenizers/mistral", "../shared/data/hf-tokenizers/llama3"};
  int repeats = 3;
};

// Best seconds of fn over `repeats` calls (the least disturbed run on a shared machine).
double best_seconds(int repeats, const std::function<void()>& fn) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

std::string read_corpus(const std::string& path) {
  try {
    files::require_regular_file(path, "a text file");  // /dev/zero would be read until memory runs out
  } catch (const std::runtime_error& e) {
    throw UsageError(std::string("--corpus ") + e.what());
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("--corpus " + path + ": cannot open");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void run_bench(const BenchTokenizerFlags& f) {
  const std::string text = read_corpus(f.corpus);
  const double mb = static_cast<double>(text.size()) / 1e6;
  std::vector<int> bytes_as_ids;
  const double baseline = best_seconds(f.repeats, [&] {
    bytes_as_ids.assign(text.begin(), text.end());
    for (int& id : bytes_as_ids) id = static_cast<unsigned char>(id);
  });
  std::printf("corpus %s: %.2f MB; baseline (one id per byte) %.1f MB/s\n", f.corpus.c_str(), mb, mb / baseline);
  std::printf("%-40s %10s %10s %12s %10s %8s\n", "tokenizer", "load s", "MB/s", "tokens", "x baseline", "round trip");
  for (const std::string& path : f.tokenizers) {
    if (!std::filesystem::exists(path)) {
      std::printf("%-40s absent\n", path.c_str());
      continue;
    }
    text::LoadedTokenizer loaded;
    const double load = best_seconds(1, [&] { loaded = formats::load_tokenizer(path); });
    std::vector<int> ids;
    const double seconds = best_seconds(f.repeats, [&] { ids = loaded.tokenizer->encode_text(text, false); });
    const bool same = loaded.tokenizer->decode_ids(ids, false) == text;
    std::printf("%-40s %10.2f %10.2f %12zu %10.1f %8s\n", path.c_str(), load, mb / seconds, ids.size(), seconds / baseline,
                same ? "equal" : "differs");
    std::fflush(stdout);
  }
}

void setup_bench_tokenizer(CLI::App& sub) {
  auto flags = std::make_shared<BenchTokenizerFlags>();
  sub.add_option("--corpus", flags->corpus, "text to encode")->capture_default_str();
  sub.add_option("--tokenizer", flags->tokenizers, "tokenizer.json, model directory or llama2.c tokenizer.bin (repeatable)");
  sub.add_option("--repeats", flags->repeats, "timed encodings of the corpus per tokenizer (best is shown)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  sub.callback([flags] { run_bench(*flags); });
}

const bool registered = register_bench(
    {"tokenizer", "Encoding MB/s of llama2.c and tokenizer.json tokenizers vs one id per byte", setup_bench_tokenizer});

}  // namespace

}  // namespace tpcli::cli

// tpcli tokenize --tokenizer TOK --out DIR FILES... — text files to token shards in llm.c's format
// (train/token_shards.h), for training with [data] format = "shards".
//
// Each FILE is one document: its tokens (after a BOS when the tokenizer has one) are split into
// the first 1 - --val-fraction for training and the rest for validation, and written as
// DIR/STEM_train_000000.bin, ... (at most --shard-tokens tokens each) and DIR/STEM_val_000000.bin.
// Files are tokenized in parallel (--jobs, default: the cores), each worker with its own
// tokenizer; a progress bar on stderr counts the input bytes done. TOK: "bytes" (vocabulary 256),
// a llama2.c tokenizer.bin, a tokenizer.json or a directory holding one. Shards are written
// into --out (absent or empty), which appears with all of them or, after a failure, not at all.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "cli/commands.h"
#include "cli/tokenizer_setup.h"
#include "files/atomic_file.h"
#include "files/regular_file.h"
#include "train/data.h"
#include "train/token_shards.h"

namespace tpcli::cli {

namespace {

namespace fs = std::filesystem;

struct TokenizeFlags {
  std::string tokenizer;
  std::string out;
  std::vector<std::string> files;
  double val_fraction = 0.1;
  int64_t shard_tokens = 100'000'000;  // llm.c's fineweb shard size
  int jobs = 0;
};

// One worker's text -> tokens, and the vocabulary the shards are written for.
struct Encoder {
  int64_t vocab_size = 256;
  std::function<std::vector<int>(const std::string&)> encode;
};

Encoder open_encoder(const std::string& tokenizer) {
  if (tokenizer == "bytes")
    return {256, [](const std::string& text) { return std::vector<int>(text.begin(), text.end()); }};
  std::shared_ptr<text::TokenizerInterface> loaded = open_tokenizer(tokenizer).tokenizer;
  return {loaded->vocab_size(), [loaded](const std::string& text) {
            // A document starts with BOS, as llama2.c's and llm.c's pretokenizers write it.
            return loaded->encode_text(text, !loaded->bos_text().empty());
          }};
}

struct ShardCounts {
  int shards = 0;
  int64_t train_tokens = 0, val_tokens = 0;
};

std::string shard_name(const std::string& dir, const std::string& file, const char* split, int index) {
  char number[16];
  std::snprintf(number, sizeof number, "%06d", index);
  return (fs::path(dir) / (fs::path(file).stem().string() + "_" + split + "_" + number + ".bin")).string();
}

// Writes one file's tokens as its train shards and its val shard into `dir`.
ShardCounts write_file_shards(const TokenizeFlags& f, const Encoder& encoder, const std::string& file,
                              const std::string& dir) {
  std::vector<int> tokens = encoder.encode(train::read_text_file(file));  // (N,)
  const auto n_val = static_cast<int64_t>(std::floor(static_cast<double>(tokens.size()) * f.val_fraction));
  const int64_t n_train = static_cast<int64_t>(tokens.size()) - n_val;
  ShardCounts counts;
  const std::span<const int> all(tokens);
  for (int64_t begin = 0, index = 0; begin < n_train; begin += f.shard_tokens, ++index) {
    const int64_t n = std::min(f.shard_tokens, n_train - begin);
    train::write_token_shard(shard_name(dir, file, "train", static_cast<int>(index)),
                             all.subspan(static_cast<size_t>(begin), static_cast<size_t>(n)), encoder.vocab_size);
    ++counts.shards;
  }
  if (n_val > 0) {
    train::write_token_shard(shard_name(dir, file, "val", 0), all.subspan(static_cast<size_t>(n_train)), encoder.vocab_size);
    ++counts.shards;
  }
  counts.train_tokens = n_train;
  counts.val_tokens = n_val;
  return counts;
}

// The bar on stderr: a live line on a terminal, a line per file otherwise.
class ProgressBar {
 public:
  ProgressBar(int files, uintmax_t bytes) : files_(files), bytes_(bytes) {}
  void file_done(uintmax_t bytes) {
    std::lock_guard lock(mutex_);
    done_files_ += 1;
    done_bytes_ += bytes;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double part = bytes_ ? static_cast<double>(done_bytes_) / static_cast<double>(bytes_) : 1.0;
    std::string bar(30, '.');
    std::fill_n(bar.begin(), static_cast<size_t>(part * 30), '#');
    std::fprintf(stderr, "%stokenize [%s] %d/%d files, %.1f/%.1f MB, %.1f MB/s%s", tty_ ? "\r\033[K" : "",
                 bar.c_str(), done_files_, files_, static_cast<double>(done_bytes_) / 1e6,
                 static_cast<double>(bytes_) / 1e6, static_cast<double>(done_bytes_) / 1e6 / std::max(seconds, 1e-9),
                 tty_ && done_files_ < files_ ? "" : "\n");
    std::fflush(stderr);
  }

 private:
  const int files_;
  const uintmax_t bytes_;
  int done_files_ = 0;
  uintmax_t done_bytes_ = 0;
  const bool tty_ = isatty(STDERR_FILENO) != 0;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::mutex mutex_;
};

// Inputs must be readable files whose stems differ (they name the shards).
uintmax_t check_inputs(const TokenizeFlags& f) {
  std::map<std::string, std::string> stems;
  uintmax_t bytes = 0;
  for (const std::string& file : f.files) {
    try {
      files::require_regular_file(file, "a text file");
    } catch (const std::exception& e) {
      throw UsageError(e.what());
    }
    const std::string stem = fs::path(file).stem().string();
    auto [it, fresh] = stems.emplace(stem, file);
    if (!fresh) throw UsageError(file + ": same name as " + it->second + " (shards are named after the file: rename one)");
    bytes += fs::file_size(file);
  }
  if (!(f.val_fraction >= 0 && f.val_fraction < 1))  // written so that NaN fails too
    throw UsageError("--val-fraction " + std::to_string(f.val_fraction) + " must be in [0, 1)");
  if (f.shard_tokens < 1 || f.shard_tokens > INT32_MAX)
    throw UsageError("--shard-tokens " + std::to_string(f.shard_tokens) + " must be in [1, 2^31 - 1]");
  return bytes;
}

// Tokenizes every file into `dir` on `jobs` threads; the first error stops them and is rethrown.
ShardCounts write_all_shards(const TokenizeFlags& f, const Encoder& first, const std::string& dir, uintmax_t bytes) {
  const int files = static_cast<int>(f.files.size());
  const int jobs = std::clamp(f.jobs > 0 ? f.jobs : static_cast<int>(std::thread::hardware_concurrency()), 1, files);
  ProgressBar progress(files, bytes);
  std::atomic<int> next{0};
  std::mutex mutex;
  ShardCounts total;
  std::exception_ptr error;
  std::atomic<bool> failed{false};
  auto work = [&](int worker) {
    try {
      const Encoder encoder = worker == 0 ? first : open_encoder(f.tokenizer);
      for (int i = next++; i < files && !failed; i = next++) {
        const ShardCounts counts = write_file_shards(f, encoder, f.files[static_cast<size_t>(i)], dir);
        progress.file_done(fs::file_size(f.files[static_cast<size_t>(i)]));
        std::lock_guard lock(mutex);
        total.shards += counts.shards;
        total.train_tokens += counts.train_tokens;
        total.val_tokens += counts.val_tokens;
      }
    } catch (...) {
      std::lock_guard lock(mutex);
      if (!error) error = std::current_exception();
      failed = true;
    }
  };
  std::vector<std::thread> threads;
  for (int w = 1; w < jobs; ++w) threads.emplace_back(work, w);
  work(0);
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
  return total;
}

void run_tokenize(const TokenizeFlags& f) {
  const uintmax_t bytes = check_inputs(f);
  try {
    files::require_new_folder(f.out);
  } catch (const std::runtime_error& e) {
    throw UsageError("--out " + std::string(e.what()));
  }
  const Encoder first = open_encoder(f.tokenizer);  // a bad tokenizer fails here, before any thread
  // The folder appears with every shard or not at all: a training run globbing it never sees half
  // the files of a run that failed (a full disk) or was stopped.
  ShardCounts total;
  files::write_directory_atomically(f.out, [&](const std::string& dir) { total = write_all_shards(f, first, dir, bytes); });

  std::printf("wrote %d shards to %s: %lld train and %lld val tokens (%s, vocabulary %lld)\n", total.shards,
              f.out.c_str(), static_cast<long long>(total.train_tokens), static_cast<long long>(total.val_tokens),
              train::shard_token_bytes(first.vocab_size) == 2 ? "uint16" : "uint32",
              static_cast<long long>(first.vocab_size));
  std::printf("train on them with: [data] format = \"shards\", path = \"%s/*_train_*.bin\", val_path = \"%s/*_val_*.bin\", "
              "tokenizer = \"%s\"\n",
              f.out.c_str(), f.out.c_str(), f.tokenizer.c_str());
}

void setup_tokenize(CLI::App& sub) {
  auto f = std::make_shared<TokenizeFlags>();
  sub.add_option("--tokenizer", f->tokenizer, "\"bytes\", a llama2.c tokenizer.bin, a tokenizer.json or its directory")
      ->required();
  sub.add_option("--out", f->out, "new folder for the shards (absent or empty)")->required();
  sub.add_option("files", f->files, "text files, one document each")->required()->type_name("FILES...");
  sub.add_option("--val-fraction", f->val_fraction, "the last part of each file that goes to its _val_ shard")
      ->capture_default_str();
  sub.add_option("--shard-tokens", f->shard_tokens, "tokens per train shard at most")->capture_default_str();
  sub.add_option("--jobs", f->jobs, "files tokenized at once (0: the cores)")->check(CLI::Range(0, 1 << 16));
  sub.callback([f] { run_tokenize(*f); });
}

const bool registered = register_command({"tokenize", "Write text files as token shards (llm.c's format)", setup_tokenize});

}  // namespace

}  // namespace tpcli::cli

// Token shards (llm.c's format): files written by hand the way llm.c writes them read back
// token for token in both versions; bad headers fail with one line naming the file; windows over
// several shards follow the documented formula and replay; a data-parallel run's devices read
// disjoint windows that together make the global batch.
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>

#include "support/temp_dir.h"
#include "train/loop.h"
#include "train/token_shards.h"

using namespace tpcli;
using tpcli::testing::TempDir;

namespace {

// A shard written field by field as llm.c's write_datafile does: 256 int32 (magic, version, count,
// zeros), then the tokens as uint16 or uint32.
template <typename Token>
void write_by_hand(const std::string& path, int32_t magic, int32_t version, const std::vector<int>& tokens) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic, header[1] = version, header[2] = static_cast<int32_t>(tokens.size());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), 1024);
  for (int t : tokens) {
    const auto v = static_cast<Token>(t);
    out.write(reinterpret_cast<const char*>(&v), sizeof v);
  }
}

std::vector<int> read_all(const train::TokenShard& shard) {
  std::vector<int> tokens(static_cast<size_t>(shard.size()));
  shard.read(0, tokens);
  return tokens;
}

std::string file_bytes(const std::string& path) { return tpcli::testing::slurp(path); }

}  // namespace

TEST_CASE("token shards: version 1 (uint16) and version 7 (uint32) round trip, byte-identical to llm.c's layout") {
  TempDir dir;
  struct Case {
    int64_t vocab;
    std::vector<int> tokens;
    int32_t magic, version;
    int bytes;
  };
  const std::vector<Case> cases = {{50257, {0, 1, 50256, 65535 % 50257, 7}, 20240520, 1, 2},
                                   {65536, {65535, 0, 12}, 20240520, 1, 2},
                                   {128256, {128255, 65536, 0, 70000, 3}, 20240801, 7, 4}};
  for (const Case& c : cases) {
    const std::string ours = (dir.path() / "ours.bin").string(), theirs = (dir.path() / "theirs.bin").string();
    train::write_token_shard(ours, c.tokens, c.vocab);
    if (c.bytes == 2)
      write_by_hand<uint16_t>(theirs, c.magic, c.version, c.tokens);
    else
      write_by_hand<uint32_t>(theirs, c.magic, c.version, c.tokens);
    CHECK(file_bytes(ours) == file_bytes(theirs));
    CHECK(std::filesystem::file_size(ours) == 1024 + c.tokens.size() * static_cast<size_t>(c.bytes));
    const train::TokenShard shard(theirs);
    CHECK(shard.token_bytes() == c.bytes);
    CHECK(read_all(shard) == c.tokens);
  }
}

TEST_CASE("token shards: a token outside the vocabulary is refused when writing, naming the file") {
  TempDir dir;
  const std::string path = (dir.path() / "x_train_000000.bin").string();
  CHECK_THROWS_WITH(train::write_token_shard(path, std::vector<int>{1, 300}, 256),
                    Catch::Contains(path) && Catch::Contains("token 300 at position 1"));
  CHECK_FALSE(std::filesystem::exists(path));  // nothing half-written
}

TEST_CASE("token shards: a bad header or size is a one-line error naming the file") {
  TempDir dir;
  const std::string path = (dir.path() / "bad_train_000000.bin").string();
  auto error_of = [&] {
    try {
      train::TokenShard shard(path);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto check_one_line = [&](const std::string& needle) {
    const std::string e = error_of();
    INFO(e);
    CHECK(e.find(path) == 0);
    CHECK(e.find(needle) != std::string::npos);
    CHECK(e.find('\n') == std::string::npos);
  };
  write_by_hand<uint16_t>(path, 12345, 1, {1, 2, 3});
  check_one_line("magic 12345");
  write_by_hand<uint16_t>(path, 20240520, 7, {1, 2, 3});  // a uint16 magic with the uint32 version
  check_one_line("version 7");
  write_by_hand<uint16_t>(path, 20240520, 1, {1, 2, 3});
  std::filesystem::resize_file(path, 1024 + 5);  // one token and a half
  check_one_line("truncated");
  std::ofstream(path, std::ios::binary | std::ios::trunc) << "short";
  check_one_line("header");
  std::filesystem::remove(path);
  check_one_line("No such file");
  CHECK_THROWS_WITH(train::ShardTokens((dir.path() / "*_train_*.bin").string(), 256), Catch::Contains("matches no"));
}

TEST_CASE("token shards: windows over several shards follow o = ((s*B + r)*T) mod (N - T) and replay") {
  TempDir dir;
  // 0..N-1 in three shards of uneven sizes (one empty): token = position in the split.
  std::vector<int> all(1000);
  std::iota(all.begin(), all.end(), 0);
  const std::vector<std::pair<int, int>> pieces = {{0, 333}, {333, 333}, {333, 1000}};
  for (size_t k = 0; k < pieces.size(); ++k)
    write_by_hand<uint16_t>((dir.path() / ("d_train_00000" + std::to_string(k) + ".bin")).string(), 20240520, 1,
                            std::vector<int>(all.begin() + pieces[k].first, all.begin() + pieces[k].second));
  const std::string pattern = (dir.path() / "*_train_*.bin").string();
  auto shards = std::make_shared<const train::ShardTokens>(pattern, 1000);
  REQUIRE(shards->size() == 1000);
  REQUIRE(shards->shards().size() == 3);
  const int B = 4, T = 40;
  const train::BatchSampler sampler(shards, B, T, false, 1);
  const train::BatchSampler replay(std::make_shared<const train::ShardTokens>(pattern, 1000), B, T, false, 1);
  for (int64_t step : {0, 1, 2, 17, 500}) {
    std::vector<int> in(B * T), tg(B * T), in2(B * T), tg2(B * T);
    sampler.fill(step, 0, B, in, tg);
    replay.fill(step, 0, B, in2, tg2);
    CHECK(in == in2);
    CHECK(tg == tg2);
    for (int r = 0; r < B; ++r) {
      const int64_t o = ((step * B + r) * T) % (1000 - T);
      for (int i = 0; i < T; ++i) {
        REQUIRE(in[static_cast<size_t>(r * T + i)] == o + i);
        REQUIRE(tg[static_cast<size_t>(r * T + i)] == o + i + 1);
      }
    }
  }
  // A window across the boundary at 333 (offset 320 = step 2, row 0 for B = 4, T = 40).
  std::vector<int> window(41);
  shards->read(320, window);
  CHECK(window.front() == 320);
  CHECK(window.back() == 360);
  // The model's vocabulary is checked on every read, naming the shard.
  const train::ShardTokens small(pattern, 500);
  CHECK_THROWS_WITH(small.read(480, window), Catch::Contains("d_train_000002.bin") && Catch::Contains("token 500"));
}

namespace {

// Records which thread (device) read which windows of the split it wraps.
class RecordingTokens : public train::TokenSource {
 public:
  explicit RecordingTokens(std::shared_ptr<const train::TokenSource> inner) : inner_(std::move(inner)) {}
  int64_t size() const override { return inner_->size(); }
  void read(int64_t offset, std::span<int> out) const override {
    {
      std::lock_guard lock(mutex_);
      reads_[std::this_thread::get_id()].push_back(offset);
    }
    inner_->read(offset, out);
  }
  std::map<std::thread::id, std::vector<int64_t>> reads() const {
    std::lock_guard lock(mutex_);
    return reads_;
  }

 private:
  std::shared_ptr<const train::TokenSource> inner_;
  mutable std::mutex mutex_;
  mutable std::map<std::thread::id, std::vector<int64_t>> reads_;
};

}  // namespace

TEST_CASE("token shards: each device of a data=2 run reads its own windows, together the global batch") {
  TempDir dir;
  std::vector<int> tokens(6000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int>((i * 7 + i / 13) % 256);
  train::write_token_shard((dir.path() / "a_train_000000.bin").string(), std::span(tokens).first(2500), 256);
  train::write_token_shard((dir.path() / "a_train_000001.bin").string(), std::span(tokens).subspan(2500), 256);
  auto recording = std::make_shared<RecordingTokens>(
      std::make_shared<const train::ShardTokens>((dir.path() / "*_train_*.bin").string(), 256));

  train::TrainOptions o;
  o.mesh = dist::Mesh({{"data", 2}, {"model", 1}});
  o.tokenizer = std::make_shared<const train::TextTokenizer>(train::TextTokenizer::bytes());
  o.corpus = std::make_shared<const train::Corpus>(train::Corpus{recording, nullptr});
  o.model = {.dim = 16, .hidden_dim = 32, .n_layers = 1, .n_heads = 2, .n_kv_heads = 2, .vocab_size = 256, .seq_len = 16};
  o.steps = 3, o.batch_size = 4, o.seq_len = 16, o.shuffle = false;
  o.schedule = {1e-3, 1e-4, 1, 3, train::Decay::Constant};
  o.eval_every = 0, o.eval_batches = 0, o.progress = false, o.sample_tokens = 0, o.run.blas_threads = 1;
  train::train(o);

  const auto reads = recording->reads();
  REQUIRE(reads.size() == 2);  // two devices, each reading for itself
  std::multiset<int64_t> together;
  std::vector<std::set<int64_t>> per_device;
  for (const auto& [thread, offsets] : reads) {
    CHECK(offsets.size() == 3 * 2);  // 3 steps x B/D = 2 rows
    per_device.emplace_back(offsets.begin(), offsets.end());
    together.insert(offsets.begin(), offsets.end());
  }
  std::multiset<int64_t> expected;
  for (int64_t s = 0; s < 3; ++s)
    for (int r = 0; r < 4; ++r) expected.insert(((s * 4 + r) * 16) % (6000 - 16));
  CHECK(together == expected);
  for (int64_t o1 : per_device[0]) CHECK(per_device[1].count(o1) == 0);
}

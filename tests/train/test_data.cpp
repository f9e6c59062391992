// Tokenizers, the 90/10 split and the replayable batch formula of issue 4.
#include <catch2/catch.hpp>

#include <numeric>
#include <set>
#include <vector>

#include "train/data.h"

using namespace tpcli::train;

TEST_CASE("chars tokenizer: sorted unique characters and a round trip") {
  auto tok = TextTokenizer::chars("hello world\n");
  CHECK(tok.vocab() == "\n dehlorw");
  CHECK(tok.vocab_size() == 9);
  auto ids = tok.encode("lower");
  CHECK(ids == std::vector<int>{5, 6, 8, 3, 7});
  CHECK(tok.decode(ids) == "lower");
  CHECK_THROWS_WITH(tok.encode("xyz"), Catch::Contains("not in the 9-character vocabulary"));
}

TEST_CASE("bytes tokenizer: token = byte value") {
  auto tok = TextTokenizer::bytes();
  CHECK(tok.vocab_size() == 256);
  auto ids = tok.encode("A\xff");
  CHECK(ids == std::vector<int>{65, 255});
  CHECK(tok.decode(ids) == "A\xff");
}

TEST_CASE("split: first 90% train and the rest validate") {
  std::vector<int> t(1000);
  std::iota(t.begin(), t.end(), 0);
  auto c = split_corpus(t);
  REQUIRE(c.train->size() == 900);
  REQUIRE(c.val->size() == 100);
  std::vector<int> last(1), first(1);
  c.train->read(899, last);
  c.val->read(0, first);
  CHECK(last[0] == 899);
  CHECK(first[0] == 900);
}

TEST_CASE("unshuffled batches follow o = ((s*B + r)*T) mod (n - T): every window of T + 1 tokens") {
  std::vector<int> t(500);
  std::iota(t.begin(), t.end(), 0);  // token value = its position
  const int B = 4, T = 16;
  BatchSampler s(t, B, T, false, 1);
  for (int64_t step : {0, 1, 7, 123}) {
    std::vector<int> in(B * T), tg(B * T);
    s.fill(step, 0, B, in, tg);
    for (int r = 0; r < B; ++r) {
      int64_t o = ((step * B + r) * T) % (500 - T);
      for (int i = 0; i < T; ++i) {
        REQUIRE(in[r * T + i] == o + i);
        REQUIRE(tg[r * T + i] == o + i + 1);
      }
    }
  }
}

TEST_CASE("data ranks take rows d*B/D up to (d+1)*B/D and together cover the global batch") {
  std::vector<int> t(300);
  std::iota(t.begin(), t.end(), 0);
  for (bool shuffle : {false, true}) {
    BatchSampler s(t, 6, 5, shuffle, 42);
    std::vector<int> all(30), all_tg(30);
    s.fill(3, 0, 6, all, all_tg);
    for (int D : {1, 2, 3, 6}) {
      std::vector<int> joined;
      for (int d = 0; d < D; ++d) {
        auto rows = data_rows(6, D, d);
        CHECK(rows.begin == d * 6 / D);
        std::vector<int> in(static_cast<size_t>((rows.end - rows.begin) * 5)), tg(in.size());
        s.fill(3, rows.begin, rows.end, in, tg);
        joined.insert(joined.end(), in.begin(), in.end());
      }
      CHECK(joined == all);
    }
  }
}

TEST_CASE("shuffled batches are seeded and reproducible and differ by seed and step and stay in range") {
  std::vector<int> t(10000);
  std::iota(t.begin(), t.end(), 0);
  BatchSampler a(t, 8, 32, true, 1337), b(t, 8, 32, true, 1337), c(t, 8, 32, true, 1338);
  std::set<int64_t> seen;
  for (int64_t step = 0; step < 20; ++step)
    for (int r = 0; r < 8; ++r) {
      int64_t o = a.offset(step, r);
      CHECK(o == b.offset(step, r));
      CHECK(o >= 0);
      CHECK(o < 10000 - 32 - 1);
      seen.insert(o);
    }
  CHECK(seen.size() > 150);  // 160 draws from ~10^4 windows: nearly all distinct
  int same = 0;
  for (int r = 0; r < 8; ++r) same += a.offset(5, r) == c.offset(5, r);
  CHECK(same < 2);
}

TEST_CASE("corpus errors name the file") {
  CHECK_THROWS_WITH(read_text_file("/nonexistent/corpus.txt"), Catch::Contains("/nonexistent/corpus.txt"));
  std::vector<int> t(10);
  CHECK_THROWS_WITH(BatchSampler(t, 2, 16, false, 0), Catch::Contains("too short"));
}

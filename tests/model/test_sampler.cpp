// Sampler vs llama2.c: RNG values from an independent (Python) transcription of run.c's xorshift,
// and hand-computed outcomes of argmax / multinomial / top-p on small distributions.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "engine/sampler.h"

using namespace tpcli::engine;

TEST_CASE("xorshift matches run.c's random_u32 / random_f32", "[sampler]") {
  // Computed with Python big integers from run.c's formulas, seed 42.
  uint64_t state = 42;
  const uint32_t expected[] = {1456360119u, 3359763283u, 3393612768u, 4054632243u, 3283045847u};
  for (uint32_t e : expected) CHECK(random_u32(state) == e);
  CHECK(state == 6045135835962859838ull);
  state = 42;
  CHECK(random_f32(state) == Approx(0.3390852212905884).epsilon(0));
  CHECK(random_f32(state) == 0.7822558283805847f);
}

TEST_CASE("argmax takes the first maximum", "[sampler]") {
  const std::vector<float> p{0.1f, 0.4f, 0.4f, 0.1f};
  CHECK(sample_argmax(p) == 1);
  CHECK(sample_argmax(std::vector<float>{-3.0f}) == 0);
}

TEST_CASE("multinomial sampling inverts the CDF", "[sampler]") {
  const std::vector<float> p{0.25f, 0.5f, 0.25f};
  CHECK(sample_mult(p, 0.0f) == 0);
  CHECK(sample_mult(p, 0.24f) == 0);
  CHECK(sample_mult(p, 0.25f) == 1);
  CHECK(sample_mult(p, 0.74f) == 1);
  CHECK(sample_mult(p, 0.76f) == 2);
  CHECK(sample_mult(p, 0.9999f) == 2);
  CHECK(sample_mult(std::vector<float>{0.3f, 0.3f}, 0.99f) == 1);  // rounding: last index
}

TEST_CASE("top-p keeps the smallest prefix exceeding p, in descending order", "[sampler]") {
  std::vector<ProbIndex> scratch;
  // Sorted: idx 3 (0.5), idx 1 (0.3), idx 0 (0.15), idx 2 (0.05). p = 0.7: cumulative 0.5, 0.8 > 0.7
  // -> nucleus {3, 1}, total 0.8. coin * 0.8 < 0.5 -> 3, else 1.
  const std::vector<float> p{0.15f, 0.3f, 0.05f, 0.5f};
  CHECK(sample_topp(p, 0.7f, 0.0f, scratch) == 3);
  CHECK(sample_topp(p, 0.7f, 0.62f, scratch) == 3);  // 0.496 < 0.5
  CHECK(sample_topp(p, 0.7f, 0.63f, scratch) == 1);  // 0.504
  CHECK(sample_topp(p, 0.7f, 0.999f, scratch) == 1);
  // The cutoff (1 - p) / (n - 1) = 0.05 drops 0.02 before sorting. Nothing then exceeds p = 0.9, so
  // the kept pair (total 0.8) is the nucleus and index 2 can never come out (without the cutoff,
  // coin 0.999 would land on it).
  const std::vector<float> short_sum{0.4f, 0.4f, 0.02f};
  CHECK(sample_topp(short_sum, 0.9f, 0.999f, scratch) == 1);
  CHECK(sample_topp(short_sum, 0.9f, 0.2f, scratch) == 0);
  // Ties keep index order (stable sort, as glibc's qsort merge sort does).
  const std::vector<float> tie{0.25f, 0.25f, 0.25f, 0.25f};
  CHECK(sample_topp(tie, 0.3f, 0.1f, scratch) == 0);
  CHECK(sample_topp(tie, 0.3f, 0.9f, scratch) == 1);
}

TEST_CASE("Sampler: temperature 0 is argmax and draws no randomness - otherwise softmax then one coin", "[sampler]") {
  std::vector<float> logits{1.0f, 3.0f, 2.0f};
  Sampler greedy(3, 0.0f, 0.9f, 42);
  CHECK(greedy.sample(logits) == 1);
  CHECK(greedy.state() == 42);
  CHECK(logits[1] == 3.0f);  // untouched

  // temperature 1, p = 1 (multinomial): coin 0.339085 for seed 42. softmax(1,3,2) = .090, .665, .245
  Sampler plain(3, 1.0f, 1.0f, 42);
  std::vector<float> l2{1.0f, 3.0f, 2.0f};
  CHECK(plain.sample(l2) == 1);  // 0.339 falls in [0.090, 0.755)
  CHECK(l2[0] == Approx(std::exp(-2.0) / (std::exp(-2.0) + 1 + std::exp(-1.0))));
  CHECK(plain.state() != 42);

  // High temperature flattens: softmax(l / 100) ~ uniform; coin 0.339 -> index 1 (in [1/3, 2/3)).
  Sampler hot(3, 100.0f, 0.0f, 42);
  std::vector<float> l3{1.0f, 3.0f, 2.0f};
  CHECK(hot.sample(l3) == 1);
  CHECK(l3[0] == Approx(1.0 / 3).epsilon(0.02));
}

TEST_CASE("softmax follows run.c and sums to one", "[sampler]") {
  std::vector<float> x{1000.0f, 1000.0f, 999.0f};
  softmax(x);
  const double e = std::exp(-1.0);
  CHECK(x[0] == Approx(1.0 / (2 + e)));
  CHECK(x[2] == Approx(e / (2 + e)));
}

// engine/: top_k, min_p, the penalties and logit_bias, each against a reference computed here from
// the raw logits (the formulas of OpenAI's, vLLM's and HF's documentation, written out), in the
// order sampling_params.h fixes; at their defaults the sampler is run.c's, bit for bit; the one
// parser serve and infer --batch share names the field it refuses.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/sampler.h"
#include "engine/sampling_params.h"

using namespace tpcli::engine;
using nlohmann::json;

namespace {

std::vector<float> random_logits(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> l(static_cast<size_t>(n));
  for (float& v : l) v = normal(rng);
  return l;
}

std::vector<double> softmax_reference(const std::vector<float>& logits, double temperature) {
  double most = -INFINITY;
  for (float v : logits) most = std::max(most, v / temperature);
  std::vector<double> p;
  double sum = 0;
  for (float v : logits) sum += p.emplace_back(std::exp(v / temperature - most));
  for (double& x : p) x /= sum;
  return p;
}

// The tokens top_k and min_p keep, by definition: fewer than k tokens are likelier (ties: a lower
// id is likelier), and p >= min_p * max p.
std::set<int> survivors_reference(const std::vector<double>& p, int top_k, double min_p) {
  const double most = *std::ranges::max_element(p);
  std::set<int> keep;
  for (size_t i = 0; i < p.size(); ++i) {
    int likelier = 0;
    for (size_t j = 0; j < p.size(); ++j) likelier += p[j] > p[i] || (p[j] == p[i] && j < i);
    if ((top_k == 0 || likelier < top_k) && p[i] >= min_p * most) keep.insert(static_cast<int>(i));
  }
  return keep;
}

}  // namespace

TEST_CASE("sampling params: logit_bias, then repetition over prompt and output, then frequency and presence over the output",
          "[sampler]") {
  const std::vector<float> raw{2.0f, -1.0f, 0.5f, 3.0f, -2.0f, 0.0f, 1.0f};
  const std::vector<int> prompt{1, 2, 2};
  const std::vector<int> generated{3, 4, 3, 3, 6};
  SamplingParams p;
  p.logit_bias = {{0, 5.0f}, {4, -1.5f}, {5, 0.25f}};
  p.repetition_penalty = 1.5f;
  p.presence_penalty = 0.75f;
  p.frequency_penalty = -0.5f;

  // The reference, written from the documented formulas.
  std::vector<float> want = raw;
  for (const auto& [id, bias] : p.logit_bias) want[static_cast<size_t>(id)] += bias;
  std::map<int, int> count;
  for (int t : generated) ++count[t];
  std::set<int> seen(prompt.begin(), prompt.end());
  seen.insert(generated.begin(), generated.end());
  for (int t : seen) {
    float& v = want[static_cast<size_t>(t)];
    v = v > 0 ? v / 1.5f : v * 1.5f;
  }
  for (const auto& [t, n] : count) want[static_cast<size_t>(t)] -= -0.5f * static_cast<float>(n) + 0.75f;

  std::vector<float> got = raw;
  std::vector<int> scratch;
  apply_bias_and_penalties(p, got, prompt, generated, scratch);
  for (size_t i = 0; i < raw.size(); ++i) {
    INFO("token " << i);
    CHECK(got[i] == Approx(want[i]).epsilon(1e-6));
  }
  CHECK(got[0] == 7.0f);           // biased only: never seen
  CHECK(got[2] == 0.5f / 1.5f);    // in the prompt only: repetition, no presence or frequency
  CHECK(got[5] == 0.25f);          // biased, never seen

  // Each alone changes only what it names.
  SamplingParams only_presence;
  only_presence.presence_penalty = 2.0f;
  got = raw;
  apply_bias_and_penalties(only_presence, got, prompt, generated, scratch);
  for (size_t i = 0; i < raw.size(); ++i) CHECK(got[i] == (count.count(static_cast<int>(i)) ? raw[i] - 2.0f : raw[i]));
}

TEST_CASE("sampling params: top_k and min_p keep the tokens their definitions keep, renormalised", "[sampler]") {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::vector<float> probabilities = random_logits(50, seed);
    softmax(probabilities);
    std::vector<double> p(probabilities.begin(), probabilities.end());
    for (const int top_k : {0, 1, 5, 49, 50, 1000})
      for (const float min_p : {0.0f, 0.05f, 0.3f, 1.0f}) {
        INFO("seed " << seed << " top_k " << top_k << " min_p " << min_p);
        std::vector<ProbIndex> kept;
        keep_top_k_min_p(probabilities, top_k, min_p, kept);
        std::set<int> got;
        double sum = 0;
        for (const ProbIndex& c : kept) got.insert(c.index), sum += c.prob;
        CHECK(got == survivors_reference(p, top_k, min_p));
        CHECK(sum == Approx(1.0).epsilon(1e-5));
        for (size_t i = 1; i < kept.size(); ++i) CHECK(kept[i - 1].prob >= kept[i].prob);
        double kept_mass = 0;
        for (int i : got) kept_mass += p[static_cast<size_t>(i)];
        for (const ProbIndex& c : kept) CHECK(c.prob == Approx(p[static_cast<size_t>(c.index)] / kept_mass).epsilon(1e-5));
      }
  }
  // Ties at the k-th place: the lower id stays.
  std::vector<ProbIndex> kept;
  keep_top_k_min_p(std::vector<float>{0.2f, 0.3f, 0.3f, 0.2f}, 2, 0.0f, kept);
  REQUIRE(kept.size() == 2);
  CHECK(kept[0].index == 1);
  CHECK(kept[1].index == 2);
  keep_top_k_min_p(std::vector<float>{0.2f, 0.3f, 0.3f, 0.2f}, 3, 0.0f, kept);
  CHECK(kept[2].index == 0);
}

TEST_CASE("sampling params: the sampler draws run.c's coin over the survivors, after temperature, then top-p", "[sampler]") {
  for (uint32_t seed = 1; seed <= 30; ++seed) {
    const std::vector<float> raw = random_logits(40, seed);
    const float temperature = 0.7f, topp = seed % 2 ? 0.8f : 1.0f;
    SamplingParams params;
    params.top_k = 7;
    params.min_p = 0.02f;
    params.logit_bias = {{static_cast<int>(seed % 40), 3.0f}};
    params.frequency_penalty = 0.5f;
    const std::vector<int> prompt{1, 2}, generated{5, 5, 9};

    // Reference: the biased, penalised logits; softmax at the temperature; the survivors likeliest
    // first; run.c's nucleus; the first coin of the seed's stream.
    std::vector<float> logits = raw;
    logits[seed % 40] += 3.0f;
    logits[5] -= 1.0f;
    logits[9] -= 0.5f;
    const std::vector<double> p = softmax_reference(logits, temperature);
    const std::set<int> keep = survivors_reference(p, 7, 0.02);
    std::vector<int> order(keep.begin(), keep.end());
    std::ranges::stable_sort(order, [&](int a, int b) { return p[static_cast<size_t>(a)] > p[static_cast<size_t>(b)]; });
    double mass = 0;
    for (int t : order) mass += p[static_cast<size_t>(t)];
    size_t last = order.size() - 1;
    double cumulative = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      cumulative += p[static_cast<size_t>(order[i])] / mass;
      if (topp < 1 && cumulative > topp) {
        last = i;
        break;
      }
    }
    uint64_t state = 1000 + seed;
    const double r = random_f32(state) * cumulative;
    int want = order[last];
    double cdf = 0;
    for (size_t i = 0; i <= last; ++i)
      if (r < (cdf += p[static_cast<size_t>(order[i])] / mass)) {
        want = order[i];
        break;
      }

    Sampler sampler(40, temperature, topp, 1000 + seed, params);
    std::vector<float> row = raw;
    INFO("seed " << seed);
    CHECK(sampler.sample(row, prompt, generated) == want);
    CHECK(keep.count(want));
    CHECK(sampler.state() == state);
  }
}

TEST_CASE("sampling params: at their defaults the sampler is run.c's, bit for bit, whatever the tokens so far", "[sampler]") {
  for (uint32_t seed = 1; seed <= 50; ++seed) {
    const float temperature = seed % 3 == 0 ? 0.0f : 0.9f, topp = seed % 2 ? 0.9f : 1.0f;
    Sampler plain(64, temperature, topp, seed), with_params(64, temperature, topp, seed, SamplingParams{});
    for (int step = 0; step < 4; ++step) {
      std::vector<float> a = random_logits(64, seed * 10 + static_cast<uint32_t>(step)), b = a;
      CHECK(plain.sample(a) == with_params.sample(b, std::vector<int>{1, 2, 3}, std::vector<int>{4, 4}));
      CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
      CHECK(plain.state() == with_params.state());
    }
  }
}

TEST_CASE("sampling params: greedy picks the argmax of the biased, penalised logits, which top_k and min_p cannot change",
          "[sampler]") {
  const std::vector<float> raw{1.0f, 4.0f, 3.5f, 0.0f};
  SamplingParams p;
  p.presence_penalty = 1.0f;  // token 1 was generated: 3.0 < 3.5
  Sampler greedy(4, 0.0f, 0.9f, 7, p);
  std::vector<float> row = raw;
  CHECK(greedy.sample(row, std::vector<int>{0}, std::vector<int>{1}) == 2);
  CHECK(greedy.state() == 7);
  p.logit_bias = {{3, 100.0f}};
  p.top_k = 1;
  p.min_p = 0.5f;
  Sampler biased(4, 0.0f, 0.9f, 7, p);
  row = raw;
  CHECK(biased.sample(row, std::vector<int>{0}, std::vector<int>{1}) == 3);
  // A bias of -100 on every token but one leaves that one to any temperature.
  SamplingParams only_two;
  for (int t : {0, 1, 3}) only_two.logit_bias.emplace_back(t, -100.0f);
  Sampler hot(4, 1.5f, 1.0f, 7, only_two);
  for (int i = 0; i < 20; ++i) {
    row = raw;
    CHECK(hot.sample(row, std::vector<int>{}, std::vector<int>{}) == 2);
  }
}

TEST_CASE("sampling params: one parser takes the defaults given, and names the field it refuses", "[sampler]") {
  SamplingParams defaults;
  defaults.top_k = 20;
  defaults.repetition_penalty = 1.1f;
  const SamplingParams p = read_sampling_params(json::parse(R"({"min_p": 0.1, "logit_bias": {"3": -5, "003": 1}})"), 10, defaults);
  CHECK(p.top_k == 20);
  CHECK(p.repetition_penalty == 1.1f);
  CHECK(p.min_p == 0.1f);
  REQUIRE(p.logit_bias.size() == 1);  // "3" and "003" are one token
  CHECK(p.logit_bias[0].first == 3);
  CHECK(read_sampling_params(json::parse(R"({"top_k": -1})"), 10, defaults).top_k == 0);
  CHECK(read_sampling_params(json::parse(R"({"top_k": null})"), 10, defaults).top_k == 20);

  const std::vector<std::pair<std::string, std::string>> bad = {
      {"top_k", R"({"top_k": -2})"},        {"min_p", R"({"min_p": 2})"},
      {"presence_penalty", R"({"presence_penalty": "1"})"}, {"frequency_penalty", R"({"frequency_penalty": 9})"},
      {"repetition_penalty", R"({"repetition_penalty": 0})"}, {"logit_bias", R"({"logit_bias": {"10": 1}})"},
      {"logit_bias", R"({"logit_bias": {"": 1}})"},
  };
  for (const auto& [field, body] : bad) {
    INFO(body);
    try {
      read_sampling_params(json::parse(body), 10);
      FAIL("accepted");
    } catch (const SamplingParamError& e) {
      CHECK(e.field() == field);
    }
  }
  SamplingParams wrong;
  wrong.min_p = NAN;
  CHECK_THROWS_AS(Sampler(10, 1.0f, 0.9f, 1, wrong), SamplingParamError);
  wrong = {};
  wrong.logit_bias = {{10, 1.0f}};
  CHECK_THROWS_AS(Sampler(10, 1.0f, 0.9f, 1, wrong), SamplingParamError);
}

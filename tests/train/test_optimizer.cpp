// AdamW, clipping and the schedule against values worked out independently (double precision,
// from the torch.optim.AdamW formulas written the textbook way: m_hat / (sqrt(v_hat) + eps)).
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "train/optimizer.h"

using namespace tpcli::train;

TEST_CASE("AdamW: two steps of a three-element parameter match the hand-computed values") {
  std::vector<float> p = {1.0f, -2.0f, 0.5f};
  std::vector<float> g(3);
  AdamW adam({.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1}, {3});
  std::vector<Slot> slots = {{p, g, true, 1.0, {}}};
  // Step 1: g = (0.5, -1, 0). p = p(1 - lr wd) - lr * m_hat / (sqrt(v_hat) + eps), lr = 0.1.
  g = {0.5f, -1.0f, 0.0f};
  adam.step(slots, 0.1);
  CHECK(p[0] == Approx(0.8900000020).epsilon(1e-6));
  CHECK(p[1] == Approx(-1.8800000010).epsilon(1e-6));
  CHECK(p[2] == Approx(0.4950000000).epsilon(1e-6));
  // Step 2: g = (-0.25, 0.3, 2).
  g = {-0.25f, 0.3f, 2.0f};
  adam.step(slots, 0.1);
  CHECK(p[0] == Approx(0.8544662987).epsilon(1e-6));
  CHECK(p[1] == Approx(-1.8184151424).epsilon(1e-6));
  CHECK(p[2] == Approx(0.4156363182).epsilon(1e-6));
  CHECK(adam.steps() == 2);
}

TEST_CASE("AdamW: no weight decay on slots without decay (norm gains)") {
  std::vector<float> p = {1.0f}, g = {0.0f};
  AdamW adam({.weight_decay = 0.5}, {1});
  std::vector<Slot> slots = {{p, g, false, 1.0, {}}};
  adam.step(slots, 0.1);
  CHECK(p[0] == 1.0f);  // zero gradient, no decay: unchanged
  slots[0].decay = true;
  adam.step(slots, 0.1);
  CHECK(p[0] == Approx(0.95).epsilon(1e-7));
}

TEST_CASE("global norm clipping follows clip_grad_norm_ and counts weighted slots") {
  std::vector<float> a = {3.0f, 0.0f}, ga = {3.0f, 0.0f}, b = {0.0f}, gb = {4.0f};
  std::vector<Slot> slots = {{a, ga, true, 1.0, {}}, {b, gb, false, 0.5, {}}};
  // 9 * 1 + 16 * 0.5 = 17
  CHECK(local_grad_sq(slots) == Approx(17.0));
  double scale = clip_grads(slots, 5.0, 1.0);
  CHECK(scale == Approx(1.0 / (5.0 + 1e-6)));
  CHECK(ga[0] == Approx(3.0 / 5.0).epsilon(1e-6));
  CHECK(gb[0] == Approx(4.0 / 5.0).epsilon(1e-6));
  CHECK(clip_grads(slots, 0.5, 1.0) == 1.0);   // below the threshold: untouched
  CHECK(clip_grads(slots, 50.0, 0.0) == 1.0);  // 0 = off
  CHECK(ga[0] == Approx(3.0 / 5.0).epsilon(1e-6));
}

TEST_CASE("lr schedule: warm-up then cosine to min_lr or constant") {
  LrSchedule s{.lr = 1e-3, .min_lr = 1e-4, .warmup_steps = 10, .total_steps = 110, .decay = Decay::Cosine};
  CHECK(s.at(0) == Approx(1e-3 / 11));
  CHECK(s.at(9) == Approx(1e-3 * 10 / 11));
  CHECK(s.at(10) == Approx(1e-3));
  CHECK(s.at(60) == Approx(1e-4 + 0.5 * 9e-4));  // halfway: cos(pi/2) = 0
  CHECK(s.at(110) == Approx(1e-4));
  CHECK(s.at(500) == Approx(1e-4));
  s.decay = Decay::Constant;
  CHECK(s.at(60) == Approx(1e-3));
  CHECK_THROWS_WITH(parse_decay("linear"), Catch::Contains("train.decay"));
}

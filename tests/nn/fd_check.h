// Central finite differences for the layer tests.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

namespace tpcli::nn::testing {

inline std::vector<float> random_vector(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// sum_i out[i] * w[i], in double (the scalar the tests differentiate).
inline double dot(const std::vector<float>& out, const std::vector<float>& w) {
  double s = 0.0;
  for (size_t i = 0; i < out.size(); ++i) s += double(out[i]) * double(w[i]);
  return s;
}

// (L(x + eps) - L(x - eps)) / 2 eps, moving the one value x (left as it was).
inline double central_difference(float& x, const std::function<double()>& loss, float eps = 1e-2f) {
  const float saved = x;
  x = saved + eps;
  const double up = loss();
  x = saved - eps;
  const double down = loss();
  x = saved;
  return (up - down) / (2.0 * eps);
}

// Checks analytic[i] against (L(x + eps e_i) - L(x - eps e_i)) / 2 eps for every i of x.
// Tolerance: |a - n| <= atol + rtol * max(|a|, |n|).
inline void check_gradient(std::vector<float>& x, const std::vector<float>& analytic, const std::function<double()>& loss,
                           float eps = 1e-2f, double atol = 2e-3, double rtol = 2e-2) {
  REQUIRE(x.size() == analytic.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double numeric = central_difference(x[i], loss, eps);
    INFO("element " << i << ": analytic " << analytic[i] << ", numeric " << numeric);
    CHECK(std::abs(analytic[i] - numeric) <= atol + rtol * std::max(std::abs(double(analytic[i])), std::abs(numeric)));
  }
}

}  // namespace tpcli::nn::testing

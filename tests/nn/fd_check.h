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

// Checks analytic[i] against (L(x + eps e_i) - L(x - eps e_i)) / 2 eps for every i of x.
// Tolerance: |a - n| <= atol + rtol * max(|a|, |n|).
inline void check_gradient(std::vector<float>& x, const std::vector<float>& analytic, const std::function<double()>& loss,
                           float eps = 1e-2f, double atol = 2e-3, double rtol = 2e-2) {
  REQUIRE(x.size() == analytic.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float saved = x[i];
    x[i] = saved + eps;
    const double up = loss();
    x[i] = saved - eps;
    const double down = loss();
    x[i] = saved;
    const double numeric = (up - down) / (2.0 * eps);
    INFO("element " << i << ": analytic " << analytic[i] << ", numeric " << numeric);
    CHECK(std::abs(analytic[i] - numeric) <= atol + rtol * std::max(std::abs(double(analytic[i])), std::abs(numeric)));
  }
}

}  // namespace tpcli::nn::testing

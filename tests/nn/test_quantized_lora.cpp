// nn/quantized_lora.h: the sharded LoRA updates against out + scale * x @ (B @ A)^T computed unsharded in
// double, on 1..4 devices: LoraAllToSharded with two adapted parts of three (B's rows split, A
// whole), LoraShardedToAll with A's columns split (unevenly) and in lanes; and the lanes' sum, with
// whole subtrees per device, the same bits on 1, 2 and 4 devices.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

#include "distributed/runtime.h"
#include "fd_check.h"
#include "nn/quantized_lora.h"

using namespace tpcli;
using nn::testing::random_vector;

namespace {

// out0[N, OUT] + scale * x[N, IN] @ (B[OUT, r] @ A[r, IN])^T in double.
std::vector<double> reference(const std::vector<float>& out0, const std::vector<float>& x, const std::vector<float>& a,
                              const std::vector<float>& b, float scale, int64_t N, int64_t IN, int64_t OUT, int64_t r) {
  std::vector<double> out(out0.begin(), out0.end());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OUT; ++o) {
      double s = 0;
      for (int64_t k = 0; k < r; ++k)
        for (int64_t i = 0; i < IN; ++i) s += double(b[size_t(o * r + k)]) * a[size_t(k * IN + i)] * x[size_t(n * IN + i)];
      out[size_t(n * OUT + o)] += scale * s;
    }
  return out;
}

std::vector<float> columns(const std::vector<float>& m, int64_t rows, int64_t cols, dist::Range c) {
  std::vector<float> out;
  for (int64_t i = 0; i < rows; ++i) out.insert(out.end(), m.begin() + i * cols + c.offset, m.begin() + i * cols + c.offset + c.count);
  return out;
}

}  // namespace

TEST_CASE("quantized lora: the all-to-sharded update adds scale * x A^T B_local^T to its parts' columns, with no communication",
          "[nn][lora]") {
  std::mt19937 rng(71);
  const int64_t N = 3, IN = 12, r = 2, OUT[3] = {8, 4, 4};  // q k v; k is not adapted
  const float scale = 1.5f;
  const auto x = random_vector(N * IN, rng), aq = random_vector(r * IN, rng), bq = random_vector(OUT[0] * r, rng),
             av = random_vector(r * IN, rng), bv = random_vector(OUT[2] * r, rng);
  for (int T = 1; T <= 4; ++T) {
    std::vector<std::vector<float>> got(T), base(T);
    dist::run_on_mesh(dist::Mesh::line(T), [&](dist::Device& dev) {
      const int d = dev.axis("model").rank();
      const dist::Range q = dist::even_split(OUT[0], T, d), k = dist::even_split(OUT[1], T, d), v = dist::even_split(OUT[2], T, d);
      const int64_t ld = q.count + k.count + v.count;
      std::mt19937 mine(100 + d);
      std::vector<float> out = random_vector(N * ld, mine);  // the base's output
      base[d] = out;
      const nn::LoraAllToSharded lora(
          {{tensor::Tensor({r, IN}, aq), tensor::Tensor({q.count, r}, std::span<const float>(bq).subspan(q.offset * r, q.count * r)), 0},
           {tensor::Tensor({r, IN}, av), tensor::Tensor({v.count, r}, std::span<const float>(bv).subspan(v.offset * r, v.count * r)),
            q.count + k.count}},
          scale);
      lora.forward_add(out.data(), ld, x.data(), N);
      got[d] = out;
    });
    for (int d = 0; d < T; ++d) {
      INFO(T << " devices, device " << d);
      const dist::Range q = dist::even_split(OUT[0], T, d), k = dist::even_split(OUT[1], T, d), v = dist::even_split(OUT[2], T, d);
      const int64_t ld = q.count + k.count + v.count;
      const auto ref_q = reference(std::vector<float>(N * OUT[0], 0.0f), x, aq, bq, scale, N, IN, OUT[0], r);
      const auto ref_v = reference(std::vector<float>(N * OUT[2], 0.0f), x, av, bv, scale, N, IN, OUT[2], r);
      double worst = 0;
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t j = 0; j < q.count; ++j)
          worst = std::max(worst, std::abs(got[d][n * ld + j] - base[d][n * ld + j] - ref_q[n * OUT[0] + q.offset + j]));
        for (int64_t j = 0; j < k.count; ++j) worst = std::max(worst, double(std::abs(got[d][n * ld + q.count + j] - base[d][n * ld + q.count + j])));
        for (int64_t j = 0; j < v.count; ++j) {
          const int64_t c = q.count + k.count + j;
          worst = std::max(worst, std::abs(got[d][n * ld + c] - base[d][n * ld + c] - ref_v[n * OUT[2] + v.offset + j]));
        }
      }
      CHECK(worst < 1e-5);
    }
  }
}

TEST_CASE("quantized lora: the sharded-to-all update sums x_local A_local^T over the group, in lanes, then applies B on every device",
          "[nn][lora]") {
  std::mt19937 rng(72);
  const int64_t N = 3, IN = 32, OUT = 6, r = 3, LANES = 8;  // lanes of 4 columns
  const float scale = 0.5f;
  const auto x = random_vector(N * IN, rng), a = random_vector(r * IN, rng), b = random_vector(OUT * r, rng),
             out0 = random_vector(N * OUT, rng);
  const auto ref = reference(out0, x, a, b, scale, N, IN, OUT, r);
  std::vector<float> one;
  for (int T = 1; T <= 4; ++T) {
    std::vector<std::vector<float>> got(T);
    dist::run_on_mesh(dist::Mesh::line(T), [&](dist::Device& dev) {
      dist::Group& g = dev.axis("model");
      const dist::Range lanes = dist::even_split(LANES, T, g.rank()), cols{lanes.offset * 4, lanes.count * 4};
      nn::LoraShardedToAll lora(tensor::Tensor({r, cols.count}, columns(a, r, IN, cols)), tensor::Tensor({OUT, r}, b),
                                static_cast<int>(lanes.count), scale, g);
      std::vector<float> out = out0;
      lora.forward_add(out.data(), columns(x, N, IN, cols).data(), N);
      got[g.rank()] = out;
    });
    for (int d = 0; d < T; ++d) {
      INFO(T << " devices, device " << d);
      double worst = 0;
      for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::abs(got[d][i] - ref[i]));
      CHECK(worst < 1e-5);
      CHECK(got[d] == got[0]);  // mirrored
    }
    if (T == 1) one = got[0];
    if (T == 2 || T == 4) CHECK(std::memcmp(got[0].data(), one.data(), one.size() * sizeof(float)) == 0);  // whole subtrees
  }
}

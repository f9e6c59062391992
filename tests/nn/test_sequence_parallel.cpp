// The backwards of the collective matmuls (nn/sequence_parallel.h) against the plain Linear
// backward on the full matrices, and their chain against central differences.
#include <catch2/catch.hpp>

#include <mutex>
#include <random>
#include <vector>

#include "distributed/runtime.h"
#include "fd_check.h"
#include "nn/collective_matmul.h"
#include "nn/sequence_parallel.h"

using namespace tpcli;
using nn::testing::random_vector;

namespace {

// Rows [r.offset, +r.count) x columns [c.offset, +c.count) of a row-major [rows, cols] matrix.
std::vector<float> block(const std::vector<float>& m, int64_t cols, dist::Range r, dist::Range c) {
  std::vector<float> out;
  for (int64_t i = r.offset; i < r.offset + r.count; ++i)
    for (int64_t j = c.offset; j < c.offset + c.count; ++j) out.push_back(m[static_cast<size_t>(i * cols + j)]);
  return out;
}

void check_close(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) CHECK(got[i] == Approx(want[i]).epsilon(1e-5).margin(1e-5));
}

}  // namespace

TEST_CASE("collective matmul backwards equal the plain backward on 1..4 devices, even and uneven rows",
          "[nn][sequence_parallel]") {
  const int64_t N = GENERATE(7, 16), IN = 10, OUT = 6;
  std::mt19937 rng(211);
  const auto w = random_vector(OUT * IN, rng), x = random_vector(N * IN, rng), dy = random_vector(N * OUT, rng);
  nn::Linear full(tensor::Tensor({OUT, IN}, w));
  std::vector<float> dx(N * IN, 0.0f);
  full.backward(dx.data(), dy.data(), x.data(), N);  // reference: dx [N, IN], dW [OUT, IN]
  const std::vector<float> dw(full.grad().data(), full.grad().data() + OUT * IN);
  for (int T = 1; T <= 4; ++T) {
    std::mutex mu;
    dist::run_on_mesh(dist::Mesh::line(T), [&](dist::Device& dev) {
      dist::Group& g = dev.axis("model");
      const int r = g.rank();
      const auto rows = dist::even_split(N, T, r), outs = dist::even_split(OUT, T, r), ins = dist::even_split(IN, T, r);
      const dist::Range all_rows{0, N}, all_in{0, IN}, all_out{0, OUT};
      // all_gather_matmul: inp = my rows of x, dout = my output columns of dy over all rows.
      auto a = std::get<nn::AllToShardedLinear>(nn::shard_linear(full, nn::Sharding::AllToSharded, g));
      const auto x_mine = block(x, IN, rows, all_in), dy_cols = block(dy, OUT, all_rows, outs);
      std::vector<float> dx_mine(rows.count * IN, 1.0f);  // starts at 1: the backward accumulates
      nn::all_gather_matmul_backward(dx_mine.data(), dy_cols.data(), x_mine.data(), N, a, g);
      // matmul_reduce_scatter: inp = my input columns of x over all rows, dout = my rows of dy.
      auto b = std::get<nn::ShardedToAllLinear>(nn::shard_linear(full, nn::Sharding::ShardedToAll, g));
      const auto x_cols = block(x, IN, all_rows, ins), dy_mine = block(dy, OUT, rows, all_out);
      std::vector<float> dx_cols(N * ins.count, 0.0f);
      nn::matmul_reduce_scatter_backward(dx_cols.data(), dy_mine.data(), x_cols.data(), N, b, g);
      std::lock_guard lock(mu);
      INFO(T << " devices, device " << r << ", N = " << N);
      auto want_dx_mine = block(dx, IN, rows, all_in);
      for (auto& v : want_dx_mine) v += 1.0f;
      check_close(dx_mine, want_dx_mine);
      const float* ga = a.part(0).grad().data();
      check_close(std::vector<float>(ga, ga + outs.count * IN), block(dw, IN, outs, all_in));
      check_close(dx_cols, block(dx, IN, all_rows, ins));
      const float* gb = b.local().grad().data();
      check_close(std::vector<float>(gb, gb + OUT * ins.count), block(dw, IN, all_out, ins));
    });
  }
}

TEST_CASE("all_gather_matmul then matmul_reduce_scatter: input gradient matches central differences on 2 devices",
          "[nn][sequence_parallel]") {
  // y[NL, C] = matmul_reduce_scatter(all_gather_matmul(x[NL, C]) with W1 [H, C]) with W2 [C, H]: one
  // sequence-parallel MLP without the nonlinearity. Loss: sum over devices of y . probe.
  const int64_t N = 5, C = 3, H = 4;  // N = 5: uneven rows (3 and 2)
  std::mt19937 rng(223);
  const auto w1 = random_vector(H * C, rng), w2 = random_vector(C * H, rng), probe = random_vector(N * C, rng);
  auto x = random_vector(N * C, rng);
  const nn::Linear l1(tensor::Tensor({H, C}, w1)), l2(tensor::Tensor({C, H}, w2));
  std::vector<float> dx(N * C, 0.0f);
  auto run = [&](bool backward) {
    double loss = 0;
    std::mutex mu;
    dist::run_on_mesh(dist::Mesh::line(2), [&](dist::Device& dev) {
      dist::Group& g = dev.axis("model");
      const auto rows = dist::even_split(N, 2, g.rank());
      auto a = std::get<nn::AllToShardedLinear>(nn::shard_linear(l1, nn::Sharding::AllToSharded, g));
      auto b = std::get<nn::ShardedToAllLinear>(nn::shard_linear(l2, nn::Sharding::ShardedToAll, g));
      const float* x_mine = x.data() + rows.offset * C;
      std::vector<float> h(N * a.out_features()), y(rows.count * C);  // [N, H_local], [NL, C]
      nn::all_gather_matmul(h.data(), x_mine, N, a, g);
      nn::matmul_reduce_scatter(y.data(), h.data(), N, b, g);
      std::vector<float> dh(h.size(), 0.0f), dx_mine(rows.count * C, 0.0f);
      if (backward) {
        const float* dy = probe.data() + rows.offset * C;
        nn::matmul_reduce_scatter_backward(dh.data(), dy, h.data(), N, b, g);
        nn::all_gather_matmul_backward(dx_mine.data(), dh.data(), x_mine, N, a, g);
      }
      std::lock_guard lock(mu);
      for (int64_t i = 0; i < rows.count * C; ++i) loss += double(y[i]) * probe[rows.offset * C + i];
      std::copy(dx_mine.begin(), dx_mine.end(), dx.begin() + rows.offset * C);
    });
    return loss;
  };
  run(true);
  const auto analytic = dx;
  nn::testing::check_gradient(x, analytic, [&] { return run(false); });
}

// The BLIS door vs naive double-precision loops: gemm with every transpose and odd sizes, gemm's
// column blocks against the whole product byte for byte, matvec,
// matmul_wt (both the gemm and the decode path), and per-thread BLIS thread counts.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "tensor/blas.h"

using namespace tpcli::tensor;

namespace {

std::vector<float> random_floats(std::mt19937& rng, size_t n) {
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// C[m,n] = alpha op(A) op(B) + beta C in double; A stored [m,k] or [k,m] with row stride lda.
std::vector<double> naive_gemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha,
                               const std::vector<float>& a, int64_t lda, const std::vector<float>& b, int64_t ldb,
                               float beta, const std::vector<float>& c, int64_t ldc) {
  std::vector<double> out(c.begin(), c.end());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double av = ta == Trans::No ? a[static_cast<size_t>(i * lda + p)] : a[static_cast<size_t>(p * lda + i)];
        const double bv = tb == Trans::No ? b[static_cast<size_t>(p * ldb + j)] : b[static_cast<size_t>(j * ldb + p)];
        s += av * bv;
      }
      const size_t ci = static_cast<size_t>(i * ldc + j);
      out[ci] = alpha * s + (beta == 0.0f ? 0.0 : beta * static_cast<double>(c[ci]));
    }
  return out;
}

void check_close(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    REQUIRE(std::fabs(got[i] - want[i]) <= tol * (1.0 + std::fabs(want[i])));
  }
}

}  // namespace

TEST_CASE("blas: gemm with every transpose combination, odd sizes and padded strides") {
  std::mt19937 rng(42);
  const int64_t sizes[][3] = {{1, 1, 1}, {7, 5, 3}, {33, 17, 65}, {64, 64, 64}, {130, 3, 259}, {5, 200, 1}};
  for (const auto& s : sizes) {
    const int64_t m = s[0], n = s[1], k = s[2];
    for (Trans ta : {Trans::No, Trans::Yes})
      for (Trans tb : {Trans::No, Trans::Yes})
        for (float beta : {0.0f, 0.5f}) {
          INFO("m=" << m << " n=" << n << " k=" << k << " ta=" << (ta == Trans::Yes) << " tb=" << (tb == Trans::Yes)
                    << " beta=" << beta);
          const int64_t lda = (ta == Trans::No ? k : m) + 3, ldb = (tb == Trans::No ? n : k) + 1, ldc = n + 2;
          const auto a = random_floats(rng, static_cast<size_t>((ta == Trans::No ? m : k) * lda));
          const auto b = random_floats(rng, static_cast<size_t>((tb == Trans::No ? k : n) * ldb));
          auto c = random_floats(rng, static_cast<size_t>(m * ldc));
          const auto want = naive_gemm(ta, tb, m, n, k, 1.5f, a, lda, b, ldb, beta, c, ldc);
          gemm(ta, tb, m, n, k, 1.5f, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
          check_close(c, want, 1e-5 * static_cast<double>(k));
        }
  }
}

TEST_CASE("blas: gemm gives a block of C's columns exactly the bytes of the whole product (a sharded linear's)") {
  // A classifier of 67 words on 11 prompt rows, its words split unevenly over 2, 4 and 8 devices:
  // BLIS's small-matrix kernels (zen3's sup, were they on) give some of these blocks other bytes.
  std::mt19937 rng(7);
  const int64_t m = 11, n = 67, k = 256;
  const auto x = random_floats(rng, static_cast<size_t>(m * k)), w = random_floats(rng, static_cast<size_t>(n * k));
  std::vector<float> whole(static_cast<size_t>(m * n));
  gemm(Trans::No, Trans::Yes, m, n, k, 1.0f, x.data(), k, w.data(), k, 0.0f, whole.data(), n);
  for (int64_t parts : {2, 4, 8}) {
    for (int64_t p = 0, col = 0; p < parts; ++p) {
      const int64_t cols = n / parts + (p < n % parts ? 1 : 0);
      INFO(parts << " parts, part " << p << ", columns " << col << "+" << cols);
      std::vector<float> shard(static_cast<size_t>(m * cols));
      gemm(Trans::No, Trans::Yes, m, cols, k, 1.0f, x.data(), k, w.data() + col * k, k, 0.0f, shard.data(), cols);
      for (int64_t i = 0; i < m; ++i)
        REQUIRE(std::memcmp(shard.data() + i * cols, whole.data() + i * n + col, cols * sizeof(float)) == 0);
      col += cols;
    }
  }
}

TEST_CASE("blas: gemm with k = 0 scales C by beta - beta = 0 overwrites NaN") {
  std::vector<float> c{1.0f, 2.0f, NAN, 4.0f};
  std::vector<float> a(1), b(1);
  gemm(Trans::No, Trans::No, 2, 2, 0, 1.0f, a.data(), 1, b.data(), 2, 0.5f, c.data(), 2);
  CHECK(c[0] == 0.5f);
  CHECK(c[1] == 1.0f);
  gemm(Trans::No, Trans::No, 2, 2, 0, 1.0f, a.data(), 1, b.data(), 2, 0.0f, c.data(), 2);
  CHECK(c == std::vector<float>(4, 0.0f));
  std::vector<float> a2{1, 2}, b2{3, 4}, c2{NAN, NAN, NAN, NAN};
  gemm(Trans::No, Trans::No, 2, 2, 1, 1.0f, a2.data(), 1, b2.data(), 2, 0.0f, c2.data(), 2);
  const std::vector<float> want{3, 4, 6, 8};
  CHECK(c2 == want);
  CHECK_THROWS(gemm(Trans::No, Trans::No, -1, 2, 1, 1.0f, a2.data(), 1, b2.data(), 2, 0.0f, c2.data(), 2));
}

TEST_CASE("blas: matvec and matmul_wt vs naive loops (decode and prefill shapes)") {
  std::mt19937 rng(7);
  const int64_t shapes[][2] = {{1, 1}, {3, 5}, {4, 16}, {5, 17}, {67, 131}, {256, 512}, {1000, 33}};
  for (const auto& s : shapes) {
    const int64_t n = s[0], k = s[1];
    INFO("n=" << n << " k=" << k);
    const auto w = random_floats(rng, static_cast<size_t>(n * k));
    for (int64_t m : {1, 3}) {
      const auto x = random_floats(rng, static_cast<size_t>(m * k));
      auto out = random_floats(rng, static_cast<size_t>(m * n));
      const auto before = out;
      // out[m,n] = x[m,k] @ w[n,k]^T  ==  gemm(No, Yes) with B = w
      const auto want = naive_gemm(Trans::No, Trans::Yes, m, n, k, 1.0f, x, k, w, k, 0.0f, out, n);
      matmul_wt(out.data(), x.data(), w.data(), m, n, k);
      check_close(out, want, 1e-5 * static_cast<double>(k));
      out = before;
      const auto want_acc = naive_gemm(Trans::No, Trans::Yes, m, n, k, 1.0f, x, k, w, k, 1.0f, out, n);
      matmul_wt(out.data(), x.data(), w.data(), m, n, k, /*accumulate=*/true);
      check_close(out, want_acc, 1e-5 * static_cast<double>(k));
      if (m == 1) {
        std::vector<float> mv(static_cast<size_t>(n), NAN);
        matvec(mv.data(), w.data(), x.data(), n, k);
        check_close(mv, want, 1e-5 * static_cast<double>(k));
      }
    }
  }
}

TEST_CASE("blas: multi-threaded matvec and gemm give the single-thread results") {
  std::mt19937 rng(9);
  const int64_t n = 1030, k = 515;  // large enough for the threaded matvec path
  const auto w = random_floats(rng, static_cast<size_t>(n * k));
  const auto x = random_floats(rng, static_cast<size_t>(k));
  std::vector<float> one(static_cast<size_t>(n)), two(static_cast<size_t>(n));
  set_blas_threads(1);
  matvec(one.data(), w.data(), x.data(), n, k);
  set_blas_threads(2);
  matvec(two.data(), w.data(), x.data(), n, k);
  CHECK(one == two);  // same kernel per row, rows only dealt out differently
  const auto a = random_floats(rng, static_cast<size_t>(200 * k));
  std::vector<float> c1(static_cast<size_t>(200 * n)), c2(c1.size());
  set_blas_threads(1);
  matmul_wt(c1.data(), a.data(), w.data(), 200, n, k);
  set_blas_threads(2);
  matmul_wt(c2.data(), a.data(), w.data(), 200, n, k);
  set_blas_threads(1);
  for (size_t i = 0; i < c1.size(); ++i) REQUIRE(std::fabs(c1[i] - c2[i]) <= 1e-4f * (1.0f + std::fabs(c1[i])));
}

TEST_CASE("blas: threaded gemm in blocks of rows or of columns, transposed and strided, vs naive loops") {
  std::mt19937 rng(10);
  // Taller than wide (blocks of rows), then wider than tall (blocks of columns); 3 threads, so
  // uneven blocks; op(A) transposed, padded leading dimensions, beta accumulating into C.
  for (const auto& [m, n, k] : std::vector<std::array<int64_t, 3>>{{1100, 300, 260}, {300, 1100, 260}}) {
    INFO(m << " x " << n << " x " << k);
    const int64_t lda = m + 3, ldb = k + 5, ldc = n + 7;  // A stored [k, m], B stored [n, k]
    const auto a = random_floats(rng, static_cast<size_t>(k * lda));
    const auto b = random_floats(rng, static_cast<size_t>(n * ldb));
    auto c = random_floats(rng, static_cast<size_t>(m * ldc));
    const auto want = naive_gemm(Trans::Yes, Trans::Yes, m, n, k, 0.5f, a, lda, b, ldb, 2.0f, c, ldc);
    set_blas_threads(3);
    gemm(Trans::Yes, Trans::Yes, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 2.0f, c.data(), ldc);
    set_blas_threads(1);
    check_close(c, want, 1e-4);
  }
}

TEST_CASE("blas: thread counts are per calling thread") {
  set_blas_threads(3);
  int other = 0;
  std::thread t([&] { other = blas_threads(); });
  t.join();
  CHECK(blas_threads() == 3);
  CHECK(other == 1);
  set_blas_threads(1);
  CHECK_THROWS_WITH(set_blas_threads(0), Catch::Contains("0"));
  CHECK(available_cores() >= 1);
}

// tpcli::perf — gemm rates the benches compare their throughput with (see gemm_rate.h).
#include "perf/gemm_rate.h"

#include <algorithm>
#include <barrier>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "tensor/blas.h"

namespace tpcli::perf {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

double sgemm_peak_gflops() {
  const int n = 1024;
  std::vector<float> a(static_cast<size_t>(n) * n), b(a.size()), c(a.size());
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& x : a) x = u(rng);
  for (auto& x : b) x = u(rng);
  const int saved = tensor::blas_threads();
  tensor::set_blas_threads(1);
  double best = 1e30;
  for (int rep = 0; rep < 4; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    tensor::gemm(tensor::Trans::No, tensor::Trans::Yes, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) best = std::min(best, s);  // the first call warms BLIS up
  }
  tensor::set_blas_threads(saved);
  return 2.0 * n * n * n / best / 1e9;
}

double measure_gemm_gflops(int P, int C, int FL, int threads, int devices) {
  std::vector<double> best(static_cast<size_t>(devices), 1e30);
  std::barrier sync(devices);
  std::vector<std::thread> pool;
  for (int d = 0; d < devices; ++d)
    pool.emplace_back([&, d] {
      tensor::set_blas_threads(threads);
      std::vector<float> a(static_cast<size_t>(P) * C, 0.5f), w(static_cast<size_t>(FL) * C, 0.25f);
      std::vector<float> out(static_cast<size_t>(P) * FL);
      for (int rep = 0; rep < 12; ++rep) {
        sync.arrive_and_wait();
        const auto t0 = Clock::now();
        tensor::matmul_wt(out.data(), a.data(), w.data(), P, FL, C);
        if (rep > 0) best[static_cast<size_t>(d)] = std::min(best[static_cast<size_t>(d)], seconds_since(t0));
      }
    });
  for (auto& t : pool) t.join();
  return 2.0 * P * C * FL / *std::max_element(best.begin(), best.end()) / 1e9;
}

}  // namespace tpcli::perf

// tpcli bench matmul — BLIS sgemm and the decode matvec against a naive loop, in one run.
//
// Square C[n,n] = A[n,n] @ B[n,n] for each --sizes n, with 1 and all cores; the decode shape
// out[1,N] = x[1,K] @ W[N,K]^T (memory-bound: reported also as weight GB/s) through BLIS gemm
// with m = 1, through tensor::matvec, and through a naive dot-product loop; then the batched decode
// product (B vectors per weight pass, batch-invariant) in f32, 8-bit and 4-bit; then the backward
// through a frozen packed weight (QLoRA: dinp[N, IN] = dout[N, OUT] @ W) at training shapes, the
// packed transposed product against sgemm with the same matrix dequantized, in the same run.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "cli/commands.h"
#include "tensor/blas.h"
#include "tensor/packed_matrix.h"

namespace tpcli::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct BenchMatmulOptions {
  std::vector<int64_t> sizes{512, 1024, 2048};
  std::vector<int> threads;  // empty: 1 and all cores
  int64_t decode_n = 4096, decode_k = 4096;
  std::vector<int64_t> batches{1, 4, 16, 64, 256};
  int64_t backward_n = 512;  // rows (tokens) of the backward product
  int reps = 5;
};

// Median seconds of fn over reps calls, after one warm-up call.
double time_median(int reps, const std::function<void()>& fn) {
  fn();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::vector<float> random_floats(std::mt19937& rng, int64_t n) {
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

// The textbook loop in its cache-friendly i-k-j order (the compiler vectorises the j loop), over the
// first `rows` rows of C.
void naive_gemm(float* c, const float* a, const float* b, int64_t rows, int64_t n) {
  for (int64_t i = 0; i < rows; ++i) {
    float* ci = c + i * n;
    std::fill(ci, ci + n, 0.0f);
    for (int64_t p = 0; p < n; ++p) {
      const float aip = a[i * n + p];
      const float* bp = b + p * n;
      for (int64_t j = 0; j < n; ++j) ci[j] += aip * bp[j];
    }
  }
}

void naive_matvec(float* out, const float* w, const float* x, int64_t n, int64_t k) {
  for (int64_t i = 0; i < n; ++i) {
    float s = 0.0f;
    for (int64_t p = 0; p < k; ++p) s += w[i * k + p] * x[p];
    out[i] = s;
  }
}

// The batched decode product (batch-invariant: each vector's bits are its matvec's alone) against
// B separate matvecs and, in f32, against BLIS gemm with m = B (the fastest product that does not
// keep a vector's summation order), at one thread: aggregate GFLOP/s over the B vectors.
void bench_batched_decode(const BenchMatmulOptions& o, std::mt19937& rng) {
  const int64_t N = o.decode_n, K = o.decode_k;
  const auto w = random_floats(rng, N * K);
  tensor::set_blas_threads(1);
  std::printf("\n%-20s %4s %14s %14s %10s %14s %10s\n", ("batched decode " + std::to_string(K) + "x" + std::to_string(N)).c_str(),
              "B", "B matvecs", "matvec_batch", "ratio", "gemm m=B", "batch/gemm");
  for (const tensor::WeightFormat f : {tensor::WeightFormat::f32(), tensor::WeightFormat::affine(8, 64), tensor::WeightFormat::affine(4, 64)}) {
    const tensor::PackedMatrix m = tensor::PackedMatrix::from_f32(w.data(), N, K, f);
    for (int64_t B : o.batches) {
      const auto x = random_floats(rng, B * K);
      std::vector<float> out(static_cast<size_t>(B * N));
      const double flops = 2.0 * static_cast<double>(B) * N * K;
      const double apart = time_median(o.reps, [&] {
        for (int64_t v = 0; v < B; ++v) m.matvec(out.data() + v * N, x.data() + v * K);
      });
      const double together = time_median(o.reps, [&] { m.matvec_batch(out.data(), 0, x.data(), B, 0, N); });
      std::printf("%-20s %4lld %9.1f GF/s %9.1f GF/s %9.2fx", f.name().c_str(), static_cast<long long>(B), flops / apart / 1e9,
                  flops / together / 1e9, apart / together);
      if (f.kind == tensor::WeightKind::F32) {
        const double gemm = time_median(o.reps, [&] {
          tensor::gemm(tensor::Trans::No, tensor::Trans::Yes, B, N, K, 1.0f, x.data(), K, w.data(), K, 0.0f, out.data(), N);
        });
        std::printf(" %9.1f GF/s %9.2fx", flops / gemm / 1e9, gemm / together);
      }
      std::printf("\n");
    }
  }
}

// The alternative tiling, kept here to measure against: row tiles of W (a few hundred KB each)
// dequantized and contracted one at a time, dinp accumulating over the tiles (k = tile rows per gemm).
void transposed_product_row_tiles(float* dinp, const float* dout, const tensor::PackedMatrix& m, int64_t N) {
  const int64_t R = m.rows(), K = m.cols();
  const int64_t TILE = std::max<int64_t>(16, (int64_t{1} << 16) / std::max<int64_t>(K, 1));
  thread_local std::vector<float> tile;  // [TILE, K]
  tile.resize(static_cast<size_t>(TILE * K));
  for (int64_t t0 = 0; t0 < R; t0 += TILE) {
    const int64_t rows = std::min(TILE, R - t0);
    for (int64_t i = 0; i < rows; ++i) m.dequantize_row(tile.data() + i * K, t0 + i);
    tensor::gemm(tensor::Trans::No, tensor::Trans::No, N, K, rows, 1.0f, dout + t0, R, tile.data(), K, t0 == 0 ? 0.0f : 1.0f,
                 dinp, K);
  }
}

// QLoRA's backward through the frozen base at training shapes, at each thread count (1: as a
// device of a full mesh runs it): PackedMatrix::transposed_product (column blocks), the row-tile
// alternative, and sgemm with the whole matrix dequantized beforehand (the f32 copy the packed
// product avoids; not timed).
void bench_packed_backward(const BenchMatmulOptions& o, const std::vector<int>& threads, std::mt19937& rng) {
  const int64_t N = o.backward_n;
  std::printf("\n%-34s %8s %14s %14s %14s %10s\n", ("backward dinp[" + std::to_string(N) + ",IN] = dout @ W").c_str(),
              "threads", "packed", "row tiles", "sgemm f32 W", "packed/sgemm");
  const std::pair<int64_t, int64_t> shapes[] = {{288, 288}, {768, 288}, {288, 768}};  // {OUT, IN}
  for (const auto& [OUT, IN] : shapes) {
    const auto w = random_floats(rng, OUT * IN), dout = random_floats(rng, N * OUT);
    std::vector<float> dinp(static_cast<size_t>(N * IN));
    const double flops = 2.0 * static_cast<double>(N) * OUT * IN;
    // groups of 32: 288 (the bench model's width) is no multiple of 64
    for (const tensor::WeightFormat f : {tensor::WeightFormat::bf16(), tensor::WeightFormat::affine(8, 32),
                                         tensor::WeightFormat::affine(4, 32), tensor::WeightFormat::mxfp8()}) {
      const tensor::PackedMatrix m = tensor::PackedMatrix::from_f32(w.data(), OUT, IN, f);
      const tensor::Tensor d = m.dequantize();
      const std::string label = "OUT=" + std::to_string(OUT) + " IN=" + std::to_string(IN) + " " + f.name();
      for (int t : threads) {
        tensor::set_blas_threads(t);
        const double packed = time_median(o.reps, [&] { m.transposed_product(dinp.data(), dout.data(), N, 0.0f); });
        const double tiles = time_median(o.reps, [&] { transposed_product_row_tiles(dinp.data(), dout.data(), m, N); });
        const double sgemm = time_median(o.reps, [&] {
          tensor::gemm(tensor::Trans::No, tensor::Trans::No, N, IN, OUT, 1.0f, dout.data(), OUT, d.data(), IN, 0.0f,
                       dinp.data(), IN);
        });
        std::printf("%-34s %8d %9.1f GF/s %9.1f GF/s %9.1f GF/s %9.2fx\n", label.c_str(), t, flops / packed / 1e9,
                    flops / tiles / 1e9, flops / sgemm / 1e9, sgemm / packed);
      }
    }
  }
}

void run_bench_matmul(const BenchMatmulOptions& o) {
  std::vector<int> threads = o.threads;
  if (threads.empty()) threads = {1, tensor::available_cores()};
  threads.erase(std::unique(threads.begin(), threads.end()), threads.end());
  for (int t : threads)
    if (t < 1) throw UsageError("bench matmul: --threads " + std::to_string(t) + " < 1");
  for (int64_t n : o.sizes)
    if (n < 1 || n > 16384) throw UsageError("bench matmul: size " + std::to_string(n) + " not in [1, 16384]");
  if (o.reps < 1) throw UsageError("bench matmul: --reps must be >= 1");
  if (o.backward_n < 1) throw UsageError("bench matmul: --backward-n " + std::to_string(o.backward_n) + " < 1");
  const int saved = tensor::blas_threads();
  std::mt19937 rng(1);
  std::printf("tpcli bench matmul: BLIS kernels '%s', %d cores, median of %d\n\n", tensor::blas_kernels(),
              tensor::available_cores(), o.reps);
  std::printf("%-28s %8s %12s %10s\n", "C[n,n] = A @ B", "threads", "median_ms", "GFLOP/s");
  for (int64_t n : o.sizes) {
    const auto a = random_floats(rng, n * n), b = random_floats(rng, n * n);
    std::vector<float> c(static_cast<size_t>(n * n));
    const double flops = 2.0 * static_cast<double>(n) * n * n;
    for (int t : threads) {
      tensor::set_blas_threads(t);
      const double s = time_median(o.reps, [&] {
        tensor::gemm(tensor::Trans::No, tensor::Trans::No, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
      });
      std::printf("%-28s %8d %12.3f %10.1f\n", ("BLIS sgemm n=" + std::to_string(n)).c_str(), t, s * 1e3, flops / s / 1e9);
    }
    // The naive loop on enough rows for ~0.25 GFLOP, so large n stays quick; rate is per row anyway.
    const int64_t rows = std::clamp<int64_t>((int64_t{1} << 27) / (n * n), 1, n);
    const double s = time_median(std::min(o.reps, 3), [&] { naive_gemm(c.data(), a.data(), b.data(), rows, n); });
    const std::string label = "naive loop n=" + std::to_string(n) + (rows < n ? " (" + std::to_string(rows) + " rows)" : "");
    std::printf("%-28s %8d %12.3f %10.1f\n", label.c_str(), 1, s * 1e3,
                2.0 * static_cast<double>(rows) * n * n / s / 1e9);
  }

  const int64_t N = o.decode_n, K = o.decode_k;
  const auto w = random_floats(rng, N * K), x = random_floats(rng, K);
  std::vector<float> out(static_cast<size_t>(N));
  const double flops = 2.0 * static_cast<double>(N) * K, bytes = 4.0 * static_cast<double>(N) * K;
  std::printf("\n%-28s %8s %12s %10s %10s\n", ("decode 1x" + std::to_string(K) + "x" + std::to_string(N)).c_str(), "threads",
              "median_ms", "GFLOP/s", "weight_GB/s");
  auto report = [&](const char* name, int t, double s) {
    std::printf("%-28s %8d %12.3f %10.1f %10.1f\n", name, t, s * 1e3, flops / s / 1e9, bytes / s / 1e9);
  };
  for (int t : threads) {
    tensor::set_blas_threads(t);
    report("BLIS sgemm m=1", t, time_median(o.reps, [&] {
      tensor::gemm(tensor::Trans::No, tensor::Trans::Yes, 1, N, K, 1.0f, x.data(), K, w.data(), K, 0.0f, out.data(), N);
    }));
    report("tensor::matvec", t, time_median(o.reps, [&] { tensor::matvec(out.data(), w.data(), x.data(), N, K); }));
  }
  report("naive dot loop", 1, time_median(o.reps, [&] { naive_matvec(out.data(), w.data(), x.data(), N, K); }));
  bench_batched_decode(o, rng);
  bench_packed_backward(o, threads, rng);
  tensor::set_blas_threads(saved);
}

void setup_bench_matmul(CLI::App& sub) {
  auto o = std::make_shared<BenchMatmulOptions>();
  sub.add_option("--sizes", o->sizes, "Square sizes n")->delimiter(',')->capture_default_str();
  sub.add_option("--threads", o->threads, "BLIS thread counts (default: 1 and all cores)")->delimiter(',');
  sub.add_option("--decode-n", o->decode_n, "Decode shape: output features N")->capture_default_str();
  sub.add_option("--decode-k", o->decode_k, "Decode shape: input features K")->capture_default_str();
  sub.add_option("--batches", o->batches, "Batched product: vectors per product (decode steps, prompt chunks)")->delimiter(',')->capture_default_str();
  sub.add_option("--backward-n", o->backward_n, "Backward through packed weights: rows N")->capture_default_str();
  sub.add_option("--reps", o->reps, "Timed repetitions (median reported)")->capture_default_str();
  sub.callback([o] { run_bench_matmul(*o); });
}

const bool registered =
    register_bench({"matmul", "BLIS sgemm and the decode matvec vs a naive loop, packed backward vs sgemm", setup_bench_matmul});

}  // namespace

}  // namespace tpcli::cli

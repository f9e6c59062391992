// tpcli::tensor — the one door to BLIS (the only file that includes blis.h).
//
// m, n, k: rows of op(A) and C, columns of op(B) and C, the shared (summed) dimension.
// Row-major matrices are handed to BLIS as (row stride, column stride) pairs, so a transpose is a
// swap of strides and never a copy. Each calling thread carries its own BLIS thread count in a
// thread-local rntm_t, so device threads never oversubscribe the cores between them.
#include "tensor/blas.h"

#include <blis.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tensor/packed_kernels.h"


namespace tpcli::tensor {

namespace {

thread_local int t_blas_threads = 1;

#if defined(__x86_64__)
// AMD family 0x19 (Zen 3 and Zen 4; Zen 4 is the one with AVX-512), from cpuid leaf 1.
bool amd_family_19h() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__builtin_cpu_is("amd") || !__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  const unsigned base = (eax >> 8) & 0xF, extended = (eax >> 20) & 0xFF;
  return (base == 0xF ? base + extended : base) == 0x19;
}

// The kernel set for a CPU with avx512f. Intel's cores run 512-bit FMAs at full width: the skx
// kernels (on its own BLIS picks its haswell kernels there, 256-bit vectors on a 512-bit machine).
// Zen 4 splits each 512-bit operation into two 256-bit halves: there BLIS's zen3 kernels (256-bit,
// blocked for AMD's caches) run training's products faster than skx, the thin attention ones
// (k or n = head size) most.
arch_t avx512_arch() { return amd_family_19h() ? BLIS_ARCH_ZEN3 : BLIS_ARCH_SKX; }
#endif

// BLIS reads BLIS_ARCH_TYPE once, when it initialises: set it before that when the CPU has avx512f
// (avx512_arch; BENCHMARKS.md has the measured gaps). A value the user set in the environment wins.
void init_blis() {
  static std::once_flag once;
  std::call_once(once, [] {
#if defined(__x86_64__)
    if (std::getenv("BLIS_ARCH_TYPE") == nullptr && __builtin_cpu_supports("avx512f"))
      setenv("BLIS_ARCH_TYPE", std::to_string(static_cast<int>(avx512_arch())).c_str(), 0);
#endif
    bli_init();
  });
}

void check_dims(const char* op, int64_t m, int64_t n, int64_t k) {
  if (m < 0 || n < 0 || k < 0)
    throw std::invalid_argument(std::string("blas.") + op + ": negative size m=" + std::to_string(m) +
                                " n=" + std::to_string(n) + " k=" + std::to_string(k));
}

// C[m,n] *= beta (beta == 0 overwrites, so NaNs in C do not survive).
void scale(float* c, int64_t ldc, int64_t m, int64_t n, float beta) {
  for (int64_t i = 0; i < m; ++i) {
    float* row = c + i * ldc;
    if (beta == 0.0f) std::fill(row, row + n, 0.0f);
    else for (int64_t j = 0; j < n; ++j) row[j] *= beta;
  }
}

// out[n] (+)= weight[n,k] @ x[k]: the f32 matvec kernel of the instruction set in use
// (tensor/packed_kernels.h), on this thread's BLAS threads.
void matvec_impl(float* out, const float* weight, const float* x, int64_t n, int64_t k, bool acc) {
  const kernels::View view{WeightFormat::f32(), k, k * int64_t{sizeof(float)}, reinterpret_cast<const uint8_t*>(weight)};
  const kernels::MatvecKernel kernel = kernels::kernel_for(WeightFormat::f32(), detected_isa());
  if (!acc) {
    kernels::run_rows(kernel, out, view, x, nullptr, 0, n);
    return;
  }
  thread_local std::vector<float> product;  // [n]
  product.resize(static_cast<size_t>(n));
  kernels::run_rows(kernel, product.data(), view, x, nullptr, 0, n);
  for (int64_t i = 0; i < n; ++i) out[i] += product[static_cast<size_t>(i)];
}

}  // namespace

// Small products run on one thread: a BLIS fork-join costs tens of microseconds on a quiet
// machine and whole scheduler slices on a busy one, more than a small gemm takes (BENCHMARKS.md,
// Kernel design notes, has what it cost a training step).
constexpr int64_t MIN_FLOPS_PER_EXTRA_THREAD = int64_t{1} << 26;

static int gemm_threads(int64_t m, int64_t n, int64_t k) {
  const int64_t flops = 2 * m * n * k;
  return flops >= MIN_FLOPS_PER_EXTRA_THREAD * (t_blas_threads - 1) ? t_blas_threads : 1;
}

// One single-threaded BLIS call: C[m,n] = alpha * A[m,k] @ B[k,n] + beta * C, general strides.
// BLIS's blocked path only, never its small-matrix (sup) kernels, which the zen3 set has: the
// blocked path sums every element of C over k in the same order whatever m and n, so a block of
// C's columns (a device's shard of a linear, a thread's block below) gets exactly the bytes the
// whole product gives it; the sup kernels pick their order from the shape (tests/tensor/test_blas.cpp).
static void sgemm_one_thread(int64_t m, int64_t n, int64_t k, float alpha, const float* a, inc_t rsa, inc_t csa,
                             const float* b, inc_t rsb, inc_t csb, float beta, float* c, int64_t ldc) {
  rntm_t rntm = BLIS_RNTM_INITIALIZER;
  bli_rntm_init(&rntm);
  bli_rntm_set_num_threads(1, &rntm);
  bli_rntm_disable_l3_sup(&rntm);
  bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, m, n, k, &alpha, const_cast<float*>(a), rsa, csa,
               const_cast<float*>(b), rsb, csb, &beta, c, ldc, 1, nullptr, &rntm);
}

void gemm(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  check_dims("gemm", m, n, k);
  if (m == 0 || n == 0) return;
  if (k == 0 || alpha == 0.0f) {
    scale(c, ldc, m, n, beta);
    return;
  }
  init_blis();
  // op(A)[i,p]: stored [m,k] -> strides (lda, 1); stored [k,m] -> strides (1, lda). Same for B.
  const inc_t rsa = trans_a == Trans::No ? lda : 1, csa = trans_a == Trans::No ? 1 : lda;
  const inc_t rsb = trans_b == Trans::No ? ldb : 1, csb = trans_b == Trans::No ? 1 : ldb;
  const int threads = gemm_threads(m, n, k);
  if (threads == 1) {
    sgemm_one_thread(m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, c, ldc);
    return;
  }
  // Several threads: independent blocks of C (columns, or rows when C is taller than wide), one
  // single-threaded BLIS call each. BLIS's own threads meet at spinning barriers inside every
  // call; when the machine has more runnable threads than cores, one descheduled partner stalls
  // the others for whole scheduler slices, at every barrier of every call. These blocks meet
  // once, at the end.
  const bool by_columns = n >= m;
  const int64_t len = by_columns ? n : m;
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t per = ((len + T - 1) / T + 15) / 16 * 16;  // whole 16-float blocks
    const int64_t lo = std::min<int64_t>(len, t * per), hi = std::min<int64_t>(len, lo + per);
    if (lo < hi) {
      if (by_columns)
        sgemm_one_thread(m, hi - lo, k, alpha, a, rsa, csa, b + lo * csb, rsb, csb, beta, c + lo, ldc);
      else
        sgemm_one_thread(hi - lo, n, k, alpha, a + lo * rsa, rsa, csa, b, rsb, csb, beta, c + lo * ldc, ldc);
    }
  }
}

void matmul_wt(float* out, const float* inp, const float* weight, int64_t m, int64_t n, int64_t k, bool accumulate) {
  check_dims("matmul_wt", m, n, k);
  if (m == 1) {  // decode: memory-bound, BLIS is slow and uneven here
    matvec_impl(out, weight, inp, n, k, accumulate);
    return;
  }
  if (decode_rows()) {  // each row as if alone (DecodeRows)
    if (accumulate)
      for (int64_t r = 0; r < m; ++r) matvec_impl(out + r * n, weight, inp + r * k, n, k, true);
    else
      matvec_batch(out, n, weight, inp, m, n, k);
    return;
  }
  gemm(Trans::No, Trans::Yes, m, n, k, 1.0f, inp, k, weight, k, accumulate ? 1.0f : 0.0f, out, n);
}

void matvec(float* out, const float* weight, const float* x, int64_t n, int64_t k) {
  check_dims("matvec", 1, n, k);
  matvec_impl(out, weight, x, n, k, false);
}

void matvec_batch(float* out, int64_t ld_out, const float* weight, const float* x, int64_t B, int64_t n, int64_t k) {
  check_dims("matvec_batch", B, n, k);
  const kernels::View view{WeightFormat::f32(), k, k * int64_t{sizeof(float)}, reinterpret_cast<const uint8_t*>(weight)};
  const kernels::MatvecKernel kernel = kernels::kernel_for(WeightFormat::f32(), detected_isa());
  kernels::run_rows_batch(kernel, out, ld_out ? ld_out : n, view, x, k, nullptr, 0, B, 0, n);
}

namespace {
thread_local int t_decode_rows = 0;
}  // namespace

DecodeRows::DecodeRows() { ++t_decode_rows; }
DecodeRows::~DecodeRows() { --t_decode_rows; }
bool decode_rows() { return t_decode_rows > 0; }

void set_blas_threads(int n) {
  if (n < 1) throw std::invalid_argument("blas: thread count " + std::to_string(n) + " < 1");
  t_blas_threads = n;
}

int blas_threads() { return t_blas_threads; }

const char* blas_kernels() {
  init_blis();
  return bli_arch_string(bli_arch_query_id());
}

double physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
}

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace tpcli::tensor

// tpcli::perf — the read bandwidth decode is judged against (see read_bandwidth.h).
#include "perf/read_bandwidth.h"

#include <algorithm>
#include <barrier>
#include <chrono>
#include <thread>
#include <vector>

#include "perf/stats.h"
#include "tensor/aligned_storage.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tpcli::perf {

namespace {

using Clock = std::chrono::steady_clock;

// Sum of STREAMS buffers of n floats each, read side by side with SIMD loads into independent
// accumulators, so the loop is bound by memory reads, not by the add latency or the decoder.
#if defined(__x86_64__)
__attribute__((target("avx512f"))) float read_streams_avx512(const float* const* s, size_t n) {
  __m512 a[STREAMS] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  __m512 b[STREAMS] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (size_t i = 0; i + 32 <= n; i += 32)
    for (int j = 0; j < STREAMS; ++j) {
      a[j] = _mm512_add_ps(a[j], _mm512_load_ps(s[j] + i));
      b[j] = _mm512_add_ps(b[j], _mm512_load_ps(s[j] + i + 16));
    }
  float out = 0;
  for (int j = 0; j < STREAMS; ++j) out += _mm512_reduce_add_ps(_mm512_add_ps(a[j], b[j]));
  return out;
}
__attribute__((target("avx"))) float read_streams_avx(const float* const* s, size_t n) {
  __m256 a[STREAMS] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  __m256 b[STREAMS] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  for (size_t i = 0; i + 16 <= n; i += 16)
    for (int j = 0; j < STREAMS; ++j) {
      a[j] = _mm256_add_ps(a[j], _mm256_load_ps(s[j] + i));
      b[j] = _mm256_add_ps(b[j], _mm256_load_ps(s[j] + i + 8));
    }
  alignas(32) float lanes[8];
  float out = 0;
  for (int j = 0; j < STREAMS; ++j) {
    _mm256_store_ps(lanes, _mm256_add_ps(a[j], b[j]));
    for (float v : lanes) out += v;
  }
  return out;
}
#endif

float read_streams(const float* const* s, size_t n) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) return read_streams_avx512(s, n);
  if (__builtin_cpu_supports("avx")) return read_streams_avx(s, n);
#endif
  float acc[STREAMS][8] = {};
  for (size_t i = 0; i + 8 <= n; i += 8)
    for (int j = 0; j < STREAMS; ++j)
      for (int k = 0; k < 8; ++k) acc[j][k] += s[j][i + k];
  float out = 0;
  for (auto& row : acc)
    for (float v : row) out += v;
  return out;
}

}  // namespace

Bandwidth measure_read_bandwidth(int threads, size_t total_bytes) {
  const size_t per_stream = total_bytes / static_cast<size_t>(threads * STREAMS) / sizeof(float) / 32 * 32;
  const size_t per_thread = per_stream * STREAMS;
  constexpr int PASSES = 10;
  std::vector<std::vector<double>> times(static_cast<size_t>(threads), std::vector<double>(PASSES));
  std::barrier sync(threads);
  volatile float sink = 0;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      // [STREAMS, per_stream], first touched here; allocated as the weights are (tensor/aligned_storage.h:
      // 64-byte aligned, on huge pages), so the roofline gets the same pages as the decode it judges
      std::vector<float, tensor::AlignedAllocator<float>> buffer(per_thread, 1.0f);
      float* base = buffer.data();
      const float* streams[STREAMS];
      for (int j = 0; j < STREAMS; ++j) streams[j] = base + j * per_stream;
      for (int p = 0; p < PASSES; ++p) {
        sync.arrive_and_wait();
        const auto t0 = Clock::now();
        const float s = read_streams(streams, per_stream);
        times[static_cast<size_t>(t)][static_cast<size_t>(p)] = std::chrono::duration<double>(Clock::now() - t0).count();
        if (s == -1.0f) sink = s;  // keep the sum alive
      }
    });
  for (auto& th : pool) th.join();
  (void)sink;
  std::vector<double> bandwidths;  // [PASSES - 1]; pass 0 warms up
  for (int p = 1; p < PASSES; ++p) {
    double slowest = 0;
    for (int t = 0; t < threads; ++t) slowest = std::max(slowest, times[static_cast<size_t>(t)][static_cast<size_t>(p)]);
    bandwidths.push_back(static_cast<double>(per_thread * sizeof(float)) * threads / slowest);
  }
  return {median(bandwidths), *std::max_element(bandwidths.begin(), bandwidths.end())};
}

}  // namespace tpcli::perf

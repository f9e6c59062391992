// tpcli bench decode --model PATH [--devices N | --mesh model=N] [--threads T] [--tokens K]
// Decode tokens/s next to the memory-bandwidth roofline measured in the same run at the same
// thread count: roofline tok/s = read bandwidth / (weight + KV bytes read per token).
//
// Decode reads every weight once per token (the embedding only as the classifier when shared, one
// row otherwise) plus the KV cache up to the position; the unsharded figure is used, so KV heads
// replicated over devices count as overhead, not as roofline.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/model_file.h"
#include "dist/runtime.h"
#include "model/llama.h"
#include "model/sampler.h"
#include "tensor/blas.h"

namespace tpcli::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct BenchFlags {
  std::string model;
  int threads = 0;   // per device; 0 = cores / devices (at least 1)
  int tokens = 32;   // timed decode steps
  int warmup = 4;    // untimed steps first
  int bandwidth_mb = 512;
};

// Sum of a buffer with 16 independent accumulators: vectorizes without reassociating, so the loop
// is bound by memory reads, not by the add latency.
float read_all(const float* x, size_t n) {
  float acc[16] = {};
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += x[i + j];
  float s = 0;
  for (; i < n; ++i) s += x[i];
  for (float a : acc) s += a;
  return s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

struct Bandwidth {
  double median = 0, best = 0;  // bytes/s
};

// Read bandwidth of `threads` threads, each streaming its own buffer (first touched by itself),
// over passes started together. Median and best are both reported, and compared with the median
// and best decode step: like with like, so the ratio stays fair on a machine shared with other work.
Bandwidth measure_read_bandwidth(int threads, size_t total_bytes) {
  const size_t per_thread = total_bytes / static_cast<size_t>(threads) / sizeof(float);
  constexpr int PASSES = 10;
  std::vector<std::vector<double>> times(static_cast<size_t>(threads), std::vector<double>(PASSES));
  std::barrier sync(threads);
  volatile float sink = 0;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      std::vector<float> buffer(per_thread, 1.0f);  // [per_thread], first touched here
      for (int p = 0; p < PASSES; ++p) {
        sync.arrive_and_wait();
        const auto t0 = Clock::now();
        const float s = read_all(buffer.data(), buffer.size());
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

void run_bench(const BenchFlags& f, const RunFlags& run_flags) {
  const dist::Mesh mesh = mesh_from_flags(run_flags);
  OpenedModel opened = open_model(f.model, mesh);
  const model::LlamaConfig& c = opened.weights->config();
  if (f.tokens < 1 || f.warmup < 0 || f.warmup + f.tokens > c.seq_len)
    throw UsageError("--warmup + --tokens must fit in seq_len = " + std::to_string(c.seq_len));
  const int cores = tensor::available_cores();
  const int devices = mesh.size();
  const int threads = f.threads > 0 ? f.threads : std::max(1, cores / devices);
  const int roofline_threads = std::min(devices * threads, cores);

  // Bytes one decode step reads (unsharded): weights, then the KV cache averaged over the positions.
  const int64_t C = c.dim, V = c.vocab_size;
  const double weight_bytes = static_cast<double>(c.parameter_count() - (c.shared_classifier ? 0 : V * C) + C) * 4;
  double kv_bytes = 0;
  for (int pos = f.warmup; pos < f.warmup + f.tokens; ++pos)
    kv_bytes += 2.0 * c.n_layers * (pos + 1) * c.kv_dim() * 4;
  kv_bytes /= f.tokens;

  std::fprintf(stderr, "measuring read bandwidth with %d thread(s)...\n", roofline_threads);
  const Bandwidth bandwidth = measure_read_bandwidth(roofline_threads, static_cast<size_t>(f.bandwidth_mb) << 20);
  const double roofline = bandwidth.median / (weight_bytes + kv_bytes);
  const double best_roofline = bandwidth.best / (weight_bytes + kv_bytes);

  // [devices][tokens] wall time of each timed step (devices run in lockstep through collectives)
  std::vector<std::vector<double>> step_seconds(static_cast<size_t>(devices), std::vector<double>(f.tokens));
  std::vector<int64_t> param_bytes(static_cast<size_t>(devices)), kv_cache_bytes(static_cast<size_t>(devices));
  std::vector<uint64_t> moved(static_cast<size_t>(devices));
  dist::RunOptions options;
  options.blas_threads = threads;
  dist::run_on_mesh(
      mesh,
      [&](dist::Device& dev) {
        model::Llama llama(*opened.weights, dev.axis("model"));
        int token = 1;
        for (int pos = 0; pos < f.warmup; ++pos) token = model::sample_argmax(llama.forward(token, pos));
        dev.world().barrier();
        const uint64_t moved0 = dev.stats().bytes_sent + dev.stats().bytes_received;
        const auto d = static_cast<size_t>(dev.rank());
        for (int i = 0; i < f.tokens; ++i) {
          const auto t0 = Clock::now();
          token = model::sample_argmax(llama.forward(token, f.warmup + i));
          step_seconds[d][static_cast<size_t>(i)] = std::chrono::duration<double>(Clock::now() - t0).count();
        }
        dev.world().barrier();
        moved[d] = dev.stats().bytes_sent + dev.stats().bytes_received - moved0;
        param_bytes[d] = llama.parameter_bytes();
        kv_cache_bytes[d] = llama.kv_cache_bytes();
      },
      options);

  std::vector<double> steps(static_cast<size_t>(f.tokens), 0.0);  // [tokens] slowest device's step
  double total = 0;
  for (int i = 0; i < f.tokens; ++i) {
    for (int d = 0; d < devices; ++d)
      steps[static_cast<size_t>(i)] = std::max(steps[static_cast<size_t>(i)], step_seconds[static_cast<size_t>(d)][static_cast<size_t>(i)]);
    total += steps[static_cast<size_t>(i)];
  }
  const double tok_s = 1.0 / median(steps);
  const double best_tok_s = 1.0 / *std::min_element(steps.begin(), steps.end());
  std::printf("model        %s: dim %d, %d layers, %d heads (%d kv), vocab %d, %.1f M parameters\n", f.model.c_str(),
              c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, c.parameter_count() / 1e6);
  std::printf("mesh         %s: %d device(s) x %d thread(s) on %d core(s)\n", mesh.to_string().c_str(), devices, threads,
              cores);
  std::printf("bytes/token  %.1f MB weights + %.2f MB KV cache (positions %d..%d)\n", weight_bytes / 1e6, kv_bytes / 1e6,
              f.warmup, f.warmup + f.tokens - 1);
  std::printf("bandwidth    %.2f GB/s read with %d thread(s) (median; best %.2f) -> roofline %.2f tok/s (best %.2f)\n",
              bandwidth.median / 1e9, roofline_threads, bandwidth.best / 1e9, roofline, best_roofline);
  std::printf("decode       %.2f tok/s (median step %.2f ms; best %.2f tok/s; mean %.2f tok/s)\n", tok_s, 1e3 / tok_s,
              best_tok_s, f.tokens / total);
  std::printf("roofline     %.1f%% (median vs median), %.1f%% (best vs best)\n", 100.0 * tok_s / roofline,
              100.0 * best_tok_s / best_roofline);
  for (int d = 0; d < devices; ++d)
    std::printf("device %-5d parameters %.1f MB, KV cache %.1f MB, moved %.1f KB/token\n", d,
                param_bytes[static_cast<size_t>(d)] / 1e6, kv_cache_bytes[static_cast<size_t>(d)] / 1e6,
                moved[static_cast<size_t>(d)] / 1e3 / f.tokens);
}

void setup_bench_decode(CLI::App& sub) {
  auto flags = std::make_shared<BenchFlags>();
  auto run_flags = add_run_flags(sub, FLAG_DEVICES | FLAG_MESH);
  sub.add_option("--model", flags->model, "checkpoint: llama2.c .bin or tpcli .safetensors")->required();
  sub.add_option("--threads", flags->threads, "compute threads per device (default: cores / devices, at least 1)");
  sub.add_option("--tokens", flags->tokens, "timed decode steps")->capture_default_str();
  sub.add_option("--warmup", flags->warmup, "untimed decode steps first")->capture_default_str();
  sub.add_option("--bandwidth-mb", flags->bandwidth_mb, "buffer for the bandwidth measurement")->capture_default_str();
  sub.callback([flags, run_flags] { run_bench(*flags, *run_flags); });
}

const bool registered =
    register_bench({"decode", "Decode tokens/s next to the memory-bandwidth roofline", setup_bench_decode});

}  // namespace

}  // namespace tpcli::cli

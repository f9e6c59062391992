// tpcli bench prefill --model PATH [--devices N | --mesh model=N] [--threads T] [--tokens P] [--repeats R]
// A prompt of P tokens through the model two ways, in one run on the same devices: token by token
// (forward() per position, as generation fed prompts before the batched prefill) and as one batch
// (prefill()). Prints both rates, their ratio, and the batched pass's GFLOP/s next to BLIS sgemm
// measured here at the shape of the model's largest product with the same threads per device.
//
// Dimension legend: P prompt tokens, C dim, F hidden_dim, V vocab, L layers.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <memory>
#include <random>
#include <vector>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/model_file.h"
#include "distributed/runtime.h"
#include "model/llama.h"
#include "model/shard_plan.h"
#include "perf/gemm_rate.h"
#include "perf/stats.h"
#include "tensor/blas.h"

namespace tpcli::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct BenchFlags {
  std::string model;
  int threads = 0;  // per device; 0 = cores / devices (at least 1)
  int tokens = 128;
  int repeats = 5;
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// CPU seconds used by every thread of this process so far. On a machine shared with other work a
// device thread waits for a core; CPU time does not count that wait (spinning in collectives counts).
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// FLOPs of one batched pass over P tokens on the whole mesh (unsharded count): every matrix of the
// blocks once per token, attention's two products over the causal triangle, the classifier once.
double prefill_flops(const model::LlamaConfig& c, int P) {
  const double C = c.dim, KV = c.kv_dim(), F = c.hidden_dim, L = c.n_layers;
  const double block_matrices = C * C + 2 * KV * C + C * C + 3 * F * C;
  const double attention = 2.0 * 2.0 * C * (double(P) * (P + 1) / 2);  // scores and values, per layer
  return L * (2.0 * P * block_matrices + attention) + 2.0 * c.vocab_size * C;
}

struct Timings {
  std::vector<double> token_by_token, batched;  // [repeats] seconds, slowest device
  std::vector<double> token_by_token_cpu, batched_cpu;  // [repeats] CPU seconds of the whole process
  double max_logit_diff = 0;                    // last position: batched vs token by token
  std::vector<int64_t> parameter_bytes, kv_cache_bytes;  // [devices]
};

Timings time_prefill(const model::WeightSource& weights, const dist::Mesh& mesh, const std::vector<int>& prompt,
                     int repeats, int threads) {
  const int devices = mesh.size(), P = static_cast<int>(prompt.size());
  Timings t;
  std::vector<std::vector<double>> one(static_cast<size_t>(devices)), batch(static_cast<size_t>(devices));
  t.parameter_bytes.resize(static_cast<size_t>(devices));
  t.kv_cache_bytes.resize(static_cast<size_t>(devices));
  const model::Placement placement(weights, mesh);
  dist::RunOptions options;
  options.blas_threads = threads;
  dist::run_on_mesh(
      mesh,
      [&](dist::Device& dev) {
        model::Llama llama = model::Llama::on_huge_pages(weights, placement, dev);
        const auto d = static_cast<size_t>(dev.rank());
        std::vector<float> last;  // [V] token-by-token logits at P-1
        for (int rep = 0; rep <= repeats; ++rep) {  // rep 0 warms up
          dev.world().barrier();
          double cpu0 = process_cpu_seconds();
          auto t0 = Clock::now();
          std::span<const float> logits;
          for (int pos = 0; pos < P; ++pos) logits = llama.forward(prompt[static_cast<size_t>(pos)], pos);
          const double s1 = seconds_since(t0);
          last.assign(logits.begin(), logits.end());
          dev.world().barrier();
          double cpu1 = process_cpu_seconds();
          t0 = Clock::now();
          logits = llama.prefill(prompt, 0);
          const double s2 = seconds_since(t0);
          dev.world().barrier();
          const double cpu2 = process_cpu_seconds();
          if (rep == 0) continue;
          one[d].push_back(s1);
          batch[d].push_back(s2);
          if (d == 0) {
            t.token_by_token_cpu.push_back(cpu1 - cpu0);
            t.batched_cpu.push_back(cpu2 - cpu1);
          }
          if (d == 0)
            for (size_t i = 0; i < last.size(); ++i)
              t.max_logit_diff = std::max(t.max_logit_diff, static_cast<double>(std::abs(last[i] - logits[i])));
        }
        t.parameter_bytes[d] = llama.parameter_bytes();
        t.kv_cache_bytes[d] = llama.kv_cache_bytes();
      },
      options);
  for (int r = 0; r < repeats; ++r) {
    double a = 0, b = 0;
    for (int d = 0; d < devices; ++d) {
      a = std::max(a, one[static_cast<size_t>(d)][static_cast<size_t>(r)]);
      b = std::max(b, batch[static_cast<size_t>(d)][static_cast<size_t>(r)]);
    }
    t.token_by_token.push_back(a);
    t.batched.push_back(b);
  }
  return t;
}

void run_bench(const BenchFlags& f, const RunFlags& run_flags) {
  const dist::Mesh mesh = mesh_from_flags(run_flags);
  OpenedModel opened = open_model(f.model);
  place_model(opened, f.model, mesh);  // a model the tensor axis cannot split is an error before measuring
  const model::LlamaConfig& c = opened.weights->config();
  if (f.tokens < 2 || f.tokens > c.seq_len)
    throw UsageError("--tokens " + std::to_string(f.tokens) + " must be in [2, seq_len = " + std::to_string(c.seq_len) +
                     "]");
  if (f.repeats < 1) throw UsageError("--repeats " + std::to_string(f.repeats) + " must be >= 1");
  const int cores = tensor::available_cores(), devices = mesh.size();
  const int threads = f.threads > 0 ? f.threads : std::max(1, cores / devices);

  std::mt19937 rng(1);
  std::uniform_int_distribution<int> pick(0, c.vocab_size - 1);
  std::vector<int> prompt(static_cast<size_t>(f.tokens));  // [P] random token ids
  for (int& t : prompt) t = pick(rng);

  const model::ShardPlan plan = model::plan_shards(c, devices, 0);
  std::fprintf(stderr, "measuring BLIS sgemm at [%d, %d] x [%d, %d]^T...\n", f.tokens, c.dim,
               static_cast<int>(plan.ffn.count), c.dim);
  const double gemm_gflops = perf::measure_gemm_gflops(f.tokens, c.dim, static_cast<int>(plan.ffn.count), threads, devices);
  std::fprintf(stderr, "timing %d repeats of a %d-token prompt...\n", f.repeats, f.tokens);
  const Timings t = time_prefill(*opened.weights, mesh, prompt, f.repeats, threads);

  const double one = f.tokens / perf::median(t.token_by_token), batched = f.tokens / perf::median(t.batched);
  const double best_one = f.tokens / *std::min_element(t.token_by_token.begin(), t.token_by_token.end());
  const double best_batched = f.tokens / *std::min_element(t.batched.begin(), t.batched.end());
  const double per_device_gflops = prefill_flops(c, f.tokens) / perf::median(t.batched) / devices / 1e9;
  // Rates had every compute thread had a core to itself: CPU seconds over the threads in use.
  const double busy_threads = static_cast<double>(devices) * threads;
  const double one_cpu = f.tokens / (perf::median(t.token_by_token_cpu) / busy_threads);
  const double batched_cpu = f.tokens / (perf::median(t.batched_cpu) / busy_threads);
  std::printf("model           %s: dim %d, %d layers, %d heads (%d kv), vocab %d, %.1f M parameters\n",
              f.model.c_str(), c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, c.parameter_count() / 1e6);
  std::printf("mesh            %s: %d device(s) x %d thread(s) on %d core(s), BLIS kernels %s\n",
              mesh.to_string().c_str(), devices, threads, cores, tensor::blas_kernels());
  std::printf("prompt          %d random tokens, %d repeats (median; best in brackets)\n", f.tokens, f.repeats);
  std::printf("token by token  %8.1f tok/s  [%.1f]   by CPU time %.1f tok/s\n", one, best_one, one_cpu);
  std::printf("batched         %8.1f tok/s  [%.1f]   by CPU time %.1f tok/s   %.2fx token by token (%.2fx by CPU time)\n",
              batched, best_batched, batched_cpu, batched / one, batched_cpu / one_cpu);
  std::printf("                (by CPU time: the process's CPU seconds / (devices x threads); what the wall rate\n"
              "                 would be with a core per thread, when the machine is shared)\n");
  const double cpu_gflops = prefill_flops(c, f.tokens) * batched_cpu / f.tokens / devices / 1e9;
  std::printf("compute         %.1f GFLOP/s per device in the batched pass (by CPU time %.1f = %.0f%% of BLIS sgemm\n"
              "                here: %.1f GFLOP/s at [%d, %d] x [%d, %d]^T, best of 11)\n",
              per_device_gflops, cpu_gflops, 100.0 * cpu_gflops / gemm_gflops, gemm_gflops, f.tokens, c.dim,
              static_cast<int>(plan.ffn.count), c.dim);
  std::printf("agreement       last position's logits: max |batched - token by token| = %.2e\n", t.max_logit_diff);
  for (int d = 0; d < devices; ++d)
    std::printf("device %-8d parameters %.1f MB, KV cache %.1f MB\n", d, t.parameter_bytes[static_cast<size_t>(d)] / 1e6,
                t.kv_cache_bytes[static_cast<size_t>(d)] / 1e6);
}

void setup_bench_prefill(CLI::App& sub) {
  auto flags = std::make_shared<BenchFlags>();
  auto run_flags = add_run_flags(sub, FLAG_DEVICES | FLAG_MESH);
  sub.add_option("--model", flags->model, "checkpoint: llama2.c .bin or tpcli .safetensors")->required();
  sub.add_option("--threads", flags->threads, "compute threads per device (default: cores / devices, at least 1)");
  sub.add_option("--tokens", flags->tokens, "prompt length")->capture_default_str();
  sub.add_option("--repeats", flags->repeats, "timed repeats of each way")->capture_default_str();
  sub.callback([flags, run_flags] { run_bench(*flags, *run_flags); });
}

const bool registered = register_bench(
    {"prefill", "A prompt token by token vs in one batch (tok/s, and GFLOP/s vs BLIS sgemm)", setup_bench_prefill});

}  // namespace

}  // namespace tpcli::cli

// tpcli bench moe — the mixture-of-experts layer, expert-parallel over a line of devices:
//   1. step time (forward + backward) of the MoE against a dense SwiGLU of equal active FLOPs
//      (hidden = K * FE, no communication), and the bytes the MoE moves per device per step;
//   2. the dispatch all_to_all as it is done (ragged all_to_all_v, no padding) against a padded
//      all_to_all of the same rows (every chunk padded to the largest), time and bytes.
// Each measured under balanced routing (a random router) and skewed routing (one popular expert).
//   3. inference: a random MoE model of those dims (model::Llama, f32) on three meshes of the D
//      devices, tensor-parallel only (model=D), expert-parallel only (expert=D) and both
//      (expert=D/2,model=2, D >= 4 and even): greedy decode tok/s, prefill tok/s, and the bytes
//      device 0 moves per decoded token. --inference runs this section alone.
//
// Dimension legend: D devices (the expert axis), N tokens per device, C dim, FE expert hidden,
// E experts, K top-k, L layers, NH heads, V vocab, P prefill tokens, T decoded tokens.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "distributed/runtime.h"
#include "model/llama.h"
#include "model/random_init.h"
#include "model/shard_plan.h"
#include "nn/feed_forward.h"
#include "nn/moe.h"
#include "tensor/blas.h"

namespace tpcli::cli {

namespace {

struct BenchMoeOptions {
  int devices = 4;        // D
  int64_t tokens = 1024;  // N per device
  int64_t dim = 256;      // C
  int64_t hidden = 512;   // FE
  int experts = 8;        // E
  int top_k = 2;          // K
  int reps = 5;
  float skew = 3.0f;      // router weight that pulls tokens to expert 0 in the skewed run
  // inference section
  bool inference_only = false;
  int layers = 4;          // L
  int heads = 8;           // NH (= NKV)
  int vocab = 4096;        // V
  int prefill_tokens = 64; // P
  int decode_tokens = 16;  // T timed, after 4 untimed
};

struct Measured {
  double moe_ms = 0, dense_ms = 0, ragged_ms = 0, padded_ms = 0;
  uint64_t moe_bytes = 0;  // device 0, forward + backward
  uint64_t ragged_bytes = 0, padded_bytes = 0;  // device 0, one dispatch
  std::vector<int64_t> tokens_per_expert;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

std::vector<float> random_vector(std::mt19937& rng, int64_t n, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

// Median over reps of the wall time of fn on device 0, every device running it between barriers.
template <class Fn>
double time_ms(dist::Group& world, int reps, std::vector<double>& out, Fn fn) {
  fn();  // warm-up
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    world.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    world.barrier();
    times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  out = times;
  return median(times);
}

Measured measure(const BenchMoeOptions& o, float skew) {
  const int64_t N = o.tokens, C = o.dim, FE = o.hidden, FD = o.hidden * o.top_k;
  const int E = o.experts, D = o.devices;
  nn::MoeSizes sizes{C, FE, E, o.top_k, 0.01f, std::nullopt};
  Measured result;
  dist::run_on_mesh(dist::Mesh::line(D, "data"), [&](dist::Device& dev) {
    dist::Group& g = dev.axis("data");
    const dist::Range mine = nn::local_experts(E, D, g.rank());
    std::mt19937 shared(7), own(static_cast<uint32_t>(100 + g.rank()));  // weights shared, tokens own
    std::vector<float> router = random_vector(shared, E * C, 0.05f);  // [E, C]
    const float scale = 1.0f / std::sqrt(static_cast<float>(C));
    std::vector<float> w1 = random_vector(own, mine.count * FE * C, scale);  // [EL, FE, C]
    std::vector<float> w2 = random_vector(own, mine.count * C * FE, scale);  // [EL, C, FE]
    std::vector<float> w3 = random_vector(own, mine.count * FE * C, scale);  // [EL, FE, C]
    std::vector<float> x = random_vector(own, N * C, 1.0f);                  // [N, C]
    if (skew != 0.0f) {
      for (int64_t t = 0; t < N; ++t) x[static_cast<size_t>(t * C)] = 1.0f + std::abs(x[static_cast<size_t>(t * C)]);
      router[0] = skew;
    }
    std::vector<float> out(x.size()), dx(x.size()), dout = random_vector(own, N * C, 1.0f);  // [N, C]
    std::vector<float> drouter(router.size()), dw1(w1.size()), dw2(w2.size()), dw3(w3.size());
    nn::MoeActivations acts;
    const nn::MoeWeights w{router, w1, w2, w3};
    std::vector<double> times;
    const double moe = time_ms(g, o.reps, times, [&] {
      nn::moe_forward(out, acts, x, w, sizes, N, g);
      nn::moe_backward(dx, {drouter, dw1, dw2, dw3}, dout, 1.0f, x, w, acts, sizes, g);
    });

    // dense SwiGLU with K * FE hidden rows: the FLOPs of the K experts each token visits
    tensor::Tensor d1({FD, C}, random_vector(own, FD * C, scale)), d3({FD, C}, random_vector(own, FD * C, scale));
    tensor::Tensor d2({C, FD}, random_vector(own, C * FD, scale));
    nn::SwiGluFeedForward dense(std::move(d1), std::move(d3), std::move(d2), dist::Group(), "dense.", {{0, FD}}, FD);
    dense.parameters();
    const double dense_ms = time_ms(g, o.reps, times, [&] {
      dense.forward(out.data(), x.data(), N);
      std::fill(dx.begin(), dx.end(), 0.0f);
      dense.backward(dx.data(), dout.data(), x.data(), N);
    });

    // the dispatch of the last forward: ragged as done, and padded to the largest chunk
    std::vector<int64_t> counts(acts.send_counts.size()), recv;
    for (size_t m = 0; m < counts.size(); ++m) counts[m] = acts.send_counts[m] * C;
    std::vector<float> rows(static_cast<size_t>(acts.stats.rows_sent * C), 1.0f);  // [A, C]
    const double ragged = time_ms(g, o.reps, times, [&] { g.all_to_all_v(rows, counts, recv); });
    int32_t largest = static_cast<int32_t>(*std::max_element(acts.send_counts.begin(), acts.send_counts.end()));
    g.all_max(std::span<int32_t>(&largest, 1));
    const int64_t chunk = static_cast<int64_t>(largest) * C;
    std::vector<float> padded_in(static_cast<size_t>(chunk * D)), padded_out(padded_in.size());  // [D, chunk]
    const double padded = time_ms(g, o.reps, times, [&] { g.all_to_all(padded_in, padded_out); });

    if (g.rank() == 0) {
      result.moe_ms = moe;
      result.dense_ms = dense_ms;
      result.ragged_ms = ragged;
      result.padded_ms = padded;
      result.moe_bytes = acts.stats.bytes_sent;
      for (size_t m = 1; m < counts.size(); ++m) result.ragged_bytes += 4 * static_cast<uint64_t>(counts[m]);
      result.padded_bytes = 4 * static_cast<uint64_t>(chunk) * static_cast<uint64_t>(D - 1);
      result.tokens_per_expert = acts.stats.tokens_per_expert;
    }
  });
  return result;
}

std::string mb(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MB", static_cast<double>(bytes) / 1e6);
  return buf;
}

// Sections 1 and 2: the MoE layer against a dense one, ragged against padded dispatch.
void run_layer(const BenchMoeOptions& o) {
  std::printf("tpcli bench moe: %d devices on the expert axis, %lld tokens/device, dim %lld, expert hidden %lld, "
              "%d experts, top-%d; median of %d reps\n",
              o.devices, static_cast<long long>(o.tokens), static_cast<long long>(o.dim),
              static_cast<long long>(o.hidden), o.experts, o.top_k, o.reps);
  std::printf("dense baseline: SwiGLU with hidden %lld (= top_k x expert hidden: equal active FLOPs), no communication\n\n",
              static_cast<long long>(o.hidden * o.top_k));
  std::printf("%-9s %12s %12s %7s %16s %22s %22s %16s\n", "routing", "MoE fwd+bwd", "dense", "ratio",
              "MoE bytes/dev", "a2a ragged (v)", "a2a padded", "tokens/expert");
  for (float skew : {0.0f, o.skew}) {
    const Measured m = measure(o, skew);
    const auto [lo, hi] = std::minmax_element(m.tokens_per_expert.begin(), m.tokens_per_expert.end());
    char ragged[64], padded[64], counts[48];
    std::snprintf(ragged, sizeof ragged, "%.3f ms %s", m.ragged_ms, mb(m.ragged_bytes).c_str());
    std::snprintf(padded, sizeof padded, "%.3f ms %s", m.padded_ms, mb(m.padded_bytes).c_str());
    std::snprintf(counts, sizeof counts, "%lld..%lld", static_cast<long long>(*lo), static_cast<long long>(*hi));
    std::printf("%-9s %9.2f ms %9.2f ms %6.2fx %16s %22s %22s %16s\n", skew == 0.0f ? "balanced" : "skewed", m.moe_ms,
                m.dense_ms, m.moe_ms / m.dense_ms, mb(m.moe_bytes).c_str(), ragged, padded, counts);
  }
  std::printf("\nMoE bytes/dev: what device 0 sends in one forward + backward (4 all_to_all_v, counts included).\n"
              "a2a columns: one dispatch of the same rows from device 0; padded = every chunk as large as the largest.\n");
}

// ---------------------------------------------------------------- 3. inference

struct InferenceRow {
  double decode_tok_s = 0, prefill_tok_s = 0;
  double bytes_per_token = 0;  // device 0, sent + received, per decoded token
};

constexpr int DECODE_WARMUP = 4;

// A MoE Llama of the bench's dims: every block's feed-forward E experts of FE, top-K renormalised.
model::LlamaConfig inference_config(const BenchMoeOptions& o) {
  model::LlamaConfig c;
  c.dim = static_cast<int>(o.dim);
  c.hidden_dim = static_cast<int>(o.hidden) * o.top_k;  // unused by MoE blocks
  c.n_layers = o.layers;
  c.n_heads = o.heads;
  c.n_kv_heads = o.heads;
  c.vocab_size = o.vocab;
  c.seq_len = o.prefill_tokens + DECODE_WARMUP + o.decode_tokens;
  c.n_experts = o.experts;
  c.top_k = o.top_k;
  c.expert_hidden_dim = static_cast<int>(o.hidden);
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("the inference model: ") + e.what() + " (set --dim, --heads)");
  }
  return c;
}

// Prefill of P random tokens (one untimed, then the median of reps), then greedy decode from
// position P: DECODE_WARMUP untimed steps, T timed, bytes counted over the timed ones.
InferenceRow measure_inference(const model::WeightSource& weights, const dist::Mesh& mesh, const BenchMoeOptions& o) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> token_of(0, o.vocab - 1);
  std::vector<int> prompt(static_cast<size_t>(o.prefill_tokens));  // [P]
  for (int& t : prompt) t = token_of(rng);
  InferenceRow row;
  dist::RunOptions options;
  options.blas_threads = std::max(1, tensor::available_cores() / mesh.size());
  const model::Placement placement(weights, mesh);
  dist::run_on_mesh(
      mesh,
      [&](dist::Device& dev) {
        model::Llama llama(weights, placement, dev);
        dist::Group& world = dev.world();
        std::vector<double> times;
        const double prefill_ms = time_ms(world, o.reps, times, [&] { llama.prefill(prompt, 0); });
        int token = prompt.back();
        for (int i = 0; i < DECODE_WARMUP; ++i) token = llama.forward_argmax(token, o.prefill_tokens + i);
        world.barrier();
        const uint64_t moved0 = dev.stats().bytes_sent + dev.stats().bytes_received;
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < o.decode_tokens; ++i) token = llama.forward_argmax(token, o.prefill_tokens + DECODE_WARMUP + i);
        world.barrier();
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const uint64_t moved = dev.stats().bytes_sent + dev.stats().bytes_received - moved0;
        if (dev.rank() == 0) {
          row.prefill_tok_s = o.prefill_tokens / (prefill_ms / 1e3);
          row.decode_tok_s = o.decode_tokens / seconds;
          row.bytes_per_token = static_cast<double>(moved) / o.decode_tokens;
        }
      },
      options);
  return row;
}

// The meshes of the D devices: tensor-parallel only, expert-parallel only, both; a mesh that does
// not fit comes with the reason instead.
struct InferenceMesh {
  std::string label;
  std::optional<dist::Mesh> mesh;
  std::string skipped;
};

std::vector<InferenceMesh> inference_meshes(const model::LlamaConfig& c, int D) {
  auto fit = [&](std::string label, std::vector<dist::MeshAxis> axes, int tensor_devices) {
    try {
      model::check_tensor_devices(c, tensor_devices);
    } catch (const std::invalid_argument& e) {
      return InferenceMesh{std::move(label), std::nullopt, e.what()};
    }
    return InferenceMesh{std::move(label), dist::Mesh(std::move(axes)), ""};
  };
  const model::AxisRoles roles;  // inference's axis names
  const std::string& tp = roles.tensor;
  const std::string& ep = roles.expert;
  std::vector<InferenceMesh> meshes;
  meshes.push_back(fit(tp + "=" + std::to_string(D), {{tp, D}}, D));
  meshes.push_back(fit(ep + "=" + std::to_string(D), {{ep, D}}, 1));
  if (D >= 4 && D % 2 == 0)
    meshes.push_back(fit(ep + "=" + std::to_string(D / 2) + "," + tp + "=2", {{ep, D / 2}, {tp, 2}}, 2));
  else
    meshes.push_back({ep + "=D/2," + tp + "=2", std::nullopt, "needs an even --devices >= 4"});
  return meshes;
}

void run_inference(const BenchMoeOptions& o) {
  const model::LlamaConfig c = inference_config(o);
  std::printf("inference: random MoE model (f32), %d layers, dim %d, %d heads, vocab %d, %d experts of hidden %d, "
              "top-%d; prefill of %d tokens (median of %d), greedy decode of %d tokens after %d warm-up\n",
              c.n_layers, c.dim, c.n_heads, c.vocab_size, c.n_experts, c.expert_hidden_dim, c.top_k, o.prefill_tokens,
              o.reps, o.decode_tokens, DECODE_WARMUP);
  const model::TensorWeights weights = model::random_weights(c, 1);
  std::printf("%-20s %14s %14s %18s\n", "mesh", "decode tok/s", "prefill tok/s", "bytes/token dev0");
  for (const InferenceMesh& m : inference_meshes(c, o.devices)) {
    if (!m.mesh) {
      std::printf("%-20s skipped: %s\n", m.label.c_str(), m.skipped.c_str());
      continue;
    }
    const InferenceRow row = measure_inference(weights, *m.mesh, o);
    char bytes[32];
    std::snprintf(bytes, sizeof bytes, "%.1f KB", row.bytes_per_token / 1e3);
    std::printf("%-20s %14.1f %14.1f %18s\n", m.label.c_str(), row.decode_tok_s, row.prefill_tok_s, bytes);
  }
  std::printf("\nbytes/token dev0: what device 0 sends plus receives per decoded token (every collective).\n");
}

void run(const BenchMoeOptions& o) {
  if (o.devices < 1 || o.tokens < 1 || o.dim < 1 || o.hidden < 1 || o.experts < 1 || o.top_k < 1 ||
      o.top_k > o.experts || o.reps < 1 || o.layers < 1 || o.heads < 1 || o.vocab < 1 || o.prefill_tokens < 1 ||
      o.decode_tokens < 1)
    throw UsageError("sizes must be >= 1 and --top-k <= --experts");
  if (!o.inference_only) {
    run_layer(o);
    std::printf("\n");
  }
  run_inference(o);
}

void setup_bench_moe(CLI::App& sub) {
  auto o = std::make_shared<BenchMoeOptions>();
  sub.add_option("--devices", o->devices, "devices on the expert axis")->capture_default_str();
  sub.add_option("--tokens", o->tokens, "tokens per device")->capture_default_str();
  sub.add_option("--dim", o->dim, "model dim C")->capture_default_str();
  sub.add_option("--hidden", o->hidden, "expert hidden dim FE")->capture_default_str();
  sub.add_option("--experts", o->experts, "experts E")->capture_default_str();
  sub.add_option("--top-k", o->top_k, "experts per token K")->capture_default_str();
  sub.add_option("--reps", o->reps, "timed repetitions (median reported)")->capture_default_str();
  sub.add_option("--skew", o->skew, "router pull towards expert 0 in the skewed run")->capture_default_str();
  sub.add_flag("--inference", o->inference_only, "run only the inference section (decode and prefill on three meshes)");
  sub.add_option("--layers", o->layers, "inference: transformer blocks L")->capture_default_str();
  sub.add_option("--heads", o->heads, "inference: attention heads NH (= KV heads)")->capture_default_str();
  sub.add_option("--vocab", o->vocab, "inference: vocabulary V")->capture_default_str();
  sub.add_option("--prefill-tokens", o->prefill_tokens, "inference: prompt tokens P")->capture_default_str();
  sub.add_option("--decode-tokens", o->decode_tokens, "inference: timed greedy decode steps T")->capture_default_str();
  sub.callback([o] { run(*o); });
}

const bool registered =
    register_bench({"moe", "MoE expert parallelism: step time and bytes vs dense; ragged vs padded all_to_all; "
                                  "decode and prefill tok/s over TP, EP and both",
                    setup_bench_moe});

}  // namespace

}  // namespace tpcli::cli

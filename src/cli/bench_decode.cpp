// tpcli bench decode --model PATH [--devices N | --mesh model=N] [--threads T] [--tokens K]
//                    [--formats f32,bf16,8,4,8i,4i,mxfp8] [--group-size G] [--kv-dtype f32|bf16|f16] [--from P]
// Decode tokens/s next to the memory-bandwidth roofline measured in the same run at the same
// thread count: roofline tok/s = read bandwidth / (weight + KV bytes read per token). One row per
// weight format: the f32 checkpoint as it is, then converted on load (bf16; affine 8-bit and
// 4-bit, group size G; mxfp8), each against its own bytes per token. 8i and 4i: the same affine
// weights with int8 activations (tensor::set_int8_activations; rows labelled "int8x"). --from P:
// the decode steps start at position P (a prompt of P tokens prefilled in one batch, untimed), so
// attention reads a long KV cache (--kv-dtype: its element type).
//
// Read bandwidth is measured as STREAM does: large buffers (far beyond the caches), several
// streams read at once by every thread (SIMD loads, independent accumulators), one thread per core
// in use; the median and best of several passes.
//
// Decode reads every weight once per token (the embedding only as the classifier when shared, one
// row otherwise) plus the KV cache up to the position; the unsharded figure is used, so KV heads
// replicated over devices count as overhead, not as roofline.
//
// Predicted (every row): device 0's bytes per token: each of its matrices as stored at the rate the
// model's matvec kernel streams that shape in that format (measured now, every device at once,
// from memory; perf/measure_rates.h measure_weight_rates), its KV cache at its share of the read bandwidth above, plus exponentials and its collectives (greedy decode) under
// --link, or the backend's copies (perf/cost_model.h); the line under each row gives the parts.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/model_file.h"
#include "cli/plan_report.h"
#include "distributed/runtime.h"
#include "engine/sampler.h"
#include "model/comm_plan.h"
#include "model/llama.h"
#include "model/packed_weights.h"
#include "perf/measure_rates.h"
#include "perf/read_bandwidth.h"
#include "perf/stats.h"
#include "tensor/blas.h"
#include "tensor/packed_matrix.h"

namespace tpcli::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct BenchFlags {
  std::string model;
  int threads = 0;   // per device; 0 = cores / devices (at least 1)
  int tokens = 32;   // timed decode steps
  int warmup = 4;    // untimed steps first
  int bandwidth_mb = 1024;
  std::string formats = "f32,bf16,8,4";
  int group_size = 64;
  std::string kv_dtype = "f32";
  int from = 0;      // positions prefilled before the warmup steps
};


struct DecodeTiming {
  double tok_s = 0, best_tok_s = 0, mean_tok_s = 0;
  std::vector<int64_t> param_bytes, kv_cache_bytes;  // [devices]
  std::vector<uint64_t> moved;                       // [devices] bytes per timed run
};

// Greedy decode of f.warmup untimed then f.tokens timed steps on every device; a step's time is the
// slowest device's (devices run in lockstep through collectives).
DecodeTiming time_decode(const model::WeightSource& weights, const dist::Mesh& mesh, const BenchFlags& f, int threads,
                         const dist::LinkSpec& links, nn::KvDtype kv_dtype) {
  const int devices = mesh.size();
  std::vector<std::vector<double>> step_seconds(static_cast<size_t>(devices), std::vector<double>(f.tokens));
  DecodeTiming out;
  out.param_bytes.resize(static_cast<size_t>(devices));
  out.kv_cache_bytes.resize(static_cast<size_t>(devices));
  out.moved.resize(static_cast<size_t>(devices));
  const model::Placement placement(weights, mesh);
  dist::RunOptions options;
  options.blas_threads = threads;
  options.links = links;
  dist::run_on_mesh(
      mesh,
      [&](dist::Device& dev) {
        model::Llama llama = model::Llama::on_huge_pages(weights, placement, dev, kv_dtype);
        int token = 1;
        if (f.from > 0) token = llama.prefill_argmax(std::vector<int>(static_cast<size_t>(f.from), 1), 0);
        for (int pos = f.from; pos < f.from + f.warmup; ++pos) token = llama.forward_argmax(token, pos);
        dev.world().barrier();
        const uint64_t moved0 = dev.stats().bytes_sent + dev.stats().bytes_received;
        const auto d = static_cast<size_t>(dev.rank());
        for (int i = 0; i < f.tokens; ++i) {
          const auto t0 = Clock::now();
          token = llama.forward_argmax(token, f.from + f.warmup + i);
          step_seconds[d][static_cast<size_t>(i)] = std::chrono::duration<double>(Clock::now() - t0).count();
        }
        dev.world().barrier();
        out.moved[d] = dev.stats().bytes_sent + dev.stats().bytes_received - moved0;
        out.param_bytes[d] = llama.parameter_bytes();
        out.kv_cache_bytes[d] = llama.kv_cache_bytes();
      },
      options);
  std::vector<double> steps(static_cast<size_t>(f.tokens), 0.0);  // [tokens] slowest device's step
  double total = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    for (const auto& dev : step_seconds) steps[i] = std::max(steps[i], dev[i]);
    total += steps[i];
  }
  out.tok_s = 1.0 / perf::median(steps);
  out.best_tok_s = 1.0 / *std::min_element(steps.begin(), steps.end());
  out.mean_tok_s = f.tokens / total;
  return out;
}

// Bytes one decode step reads (unsharded) in the weights' stored formats: every matrix once (a
// shared classifier is the embedding; otherwise the embedding costs one row).
double weight_bytes_per_token(const model::WeightSource& weights) {
  const model::LlamaConfig& c = weights.config();
  double bytes = static_cast<double>(model::shard_bytes(weights, model::plan_shards(c, 1, 0)));
  if (!c.shared_classifier) {
    const auto f = model::stored_format(weights, "tok_embeddings");
    bytes -= static_cast<double>(c.vocab_size - 1) * c.dim * f.bits / 8;
  }
  return bytes;
}

// Device 0's token at the mean timed position (model/comm_plan.h plan_decode_work: its weights as
// stored, the KV cache) with memory at device 0's share of the read bandwidth measured above, the
// exponentials at a rate measured now, plus its collectives (greedy decode; modelled links, or the
// backend's copies).
perf::Prediction predict_token(const model::WeightSource& weights, const dist::Mesh& mesh, const dist::LinkSpec& links,
                               const BenchFlags& f, int threads, double bandwidth) {
  const model::LlamaConfig& c = weights.config();
  const std::string tensor_axis = model::AxisRoles{}.tensor;
  const perf::PlanMesh pm{tensor_axis, "data", mesh.axis_size(tensor_axis), mesh.axis_size("data"), links};
  const model::ShardPlan plan = model::plan_shards(c, pm.tensor, 0);
  const auto work = model::plan_decode_work(c, plan, f.from + f.warmup + f.tokens / 2, model::decode_storage(weights));
  const auto comm = model::plan_decode_collectives(c, plan, true);
  perf::WorkRates rates = perf::measure_work_rates(work, comm, pm, threads);
  for (auto& [size, rate] : rates.bytes_per_s) rate = bandwidth / mesh.size();
  rates.weight_bytes_per_s = perf::measure_weight_rates(work, weights, mesh.size(), threads, model::shard_bytes(weights, plan));
  return perf::predict(work, comm, pm, rates);
}

void run_bench(const BenchFlags& f, const RunFlags& run_flags) {
  const nn::KvDtype kv_dtype = parse_kv_dtype(f.kv_dtype);
  const dist::Mesh mesh = mesh_from_flags(run_flags);
  OpenedModel opened = open_model(f.model);
  place_model(opened, f.model, mesh);  // a model the tensor axis cannot split is an error before measuring
  const model::LlamaConfig& c = opened.weights->config();
  if (f.tokens < 1 || f.warmup < 0 || f.from < 0 || int64_t{f.from} + f.warmup + f.tokens > c.seq_len)
    throw UsageError("--from + --warmup + --tokens must fit in seq_len = " + std::to_string(c.seq_len));
  const int cores = tensor::available_cores();
  const int devices = mesh.size();
  const int threads = f.threads > 0 ? f.threads : std::max(1, cores / devices);
  const int roofline_threads = std::min(devices * threads, cores);
  struct Row {
    std::string label;
    std::optional<tensor::WeightFormat> conversion;
    bool int8_activations;
  };
  std::vector<Row> formats;
  std::string list = f.formats + ",";
  for (size_t at = 0, comma; (comma = list.find(',', at)) != std::string::npos; at = comma + 1) {
    const std::string name = list.substr(at, comma - at);
    const bool int8x = name == "8i" || name == "4i";
    if (name == "f32") formats.push_back({"as stored", std::nullopt, false});
    else if (!name.empty()) {
      const auto format = parse_quantize_flag(int8x ? name.substr(0, 1) : name, f.group_size);
      formats.push_back({format->name() + (int8x ? " int8x" : ""), format, int8x});
    }
  }
  double kv_bytes = 0;  // the KV cache averaged over the timed positions
  for (int pos = f.from + f.warmup; pos < f.from + f.warmup + f.tokens; ++pos)
    kv_bytes += 2.0 * c.n_layers * (pos + 1) * c.kv_dim() * nn::kv_dtype_bytes(kv_dtype);
  kv_bytes /= f.tokens;

  std::fprintf(stderr, "measuring read bandwidth with %d thread(s), %d streams each...\n", roofline_threads, perf::STREAMS);
  const perf::Bandwidth bandwidth = perf::measure_read_bandwidth(roofline_threads, static_cast<size_t>(f.bandwidth_mb) << 20);
  std::printf("model        %s: dim %d, %d layers, %d heads (%d kv), vocab %d, %.1f M parameters\n", f.model.c_str(),
              c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, c.parameter_count() / 1e6);
  std::printf("mesh         %s: %d device(s) x %d thread(s) on %d core(s); kernels %s\n", mesh.to_string().c_str(),
              devices, threads, cores, tensor::isa_name(tensor::detected_isa()));
  std::printf("KV cache     %s, timed positions %d..%d\n", nn::kv_dtype_name(kv_dtype), f.from + f.warmup,
              f.from + f.warmup + f.tokens - 1);
  std::printf("bandwidth    %.2f GB/s read with %d thread(s) x %d streams (median; best %.2f)\n", bandwidth.median / 1e9,
              roofline_threads, perf::STREAMS, bandwidth.best / 1e9);
  const dist::LinkSpec links = links_from_flags(run_flags);
  std::printf("%-22s %10s %10s %12s %10s %10s %9s %12s %10s\n", "format", "MB/token", "tok/s", "(best)", "roofline", "% roof",
              "GB/s", "ms/token", "predicted");
  for (const auto& [label, conversion, int8x] : formats) {
    tensor::set_int8_activations(int8x);
    std::unique_ptr<model::WeightSource> converted;
    if (conversion) converted = std::make_unique<model::ConvertedWeights>(*opened.weights, *conversion);
    const model::WeightSource& weights = converted ? *converted : *opened.weights;
    const double bytes = weight_bytes_per_token(weights) + kv_bytes;
    const DecodeTiming t = time_decode(weights, mesh, f, threads, links, kv_dtype);
    const double roofline = bandwidth.median / bytes;
    std::optional<perf::Prediction> prediction;
    if (!c.is_moe()) prediction = predict_token(weights, mesh, links, f, threads, bandwidth.median);
    char predicted[48] = "-";  // MoE: not planned
    if (prediction)
      std::snprintf(predicted, sizeof predicted, "%.3f (%.2fx)", prediction->total() * 1e3, prediction->total() * t.tok_s);
    std::printf("%-22s %10.1f %10.2f %12.2f %10.2f %9.1f%% %9.2f %12.3f %10s\n", label.c_str(), bytes / 1e6, t.tok_s,
                t.best_tok_s, roofline, 100.0 * t.tok_s / roofline, t.tok_s * bytes / 1e9, 1e3 / t.tok_s, predicted);
    if (prediction) std::printf("  predicted: %s\n", describe(*prediction).c_str());
    std::fflush(stdout);
    for (int d = 0; d < devices; ++d)
      std::printf("  device %d: parameters %.1f MB, KV cache %.1f MB, moved %.1f KB/token\n", d,
                   t.param_bytes[static_cast<size_t>(d)] / 1e6, t.kv_cache_bytes[static_cast<size_t>(d)] / 1e6,
                   t.moved[static_cast<size_t>(d)] / 1e3 / f.tokens);
  }
}

void setup_bench_decode(CLI::App& sub) {
  auto flags = std::make_shared<BenchFlags>();
  auto run_flags = add_run_flags(sub, FLAG_DEVICES | FLAG_MESH | FLAG_LINK);
  sub.add_option("--model", flags->model, "checkpoint: llama2.c .bin or tpcli .safetensors")->required();
  sub.add_option("--threads", flags->threads, "compute threads per device (default: cores / devices, at least 1)");
  sub.add_option("--tokens", flags->tokens, "timed decode steps")->capture_default_str();
  sub.add_option("--warmup", flags->warmup, "untimed decode steps first")->capture_default_str();
  sub.add_option("--bandwidth-mb", flags->bandwidth_mb, "buffer for the bandwidth measurement")->capture_default_str();
  sub.add_option("--formats", flags->formats,
                 "weight formats, one row each: f32, bf16, f16, 8, 4, mxfp8; 8i, 4i: 8, 4 with int8 activations")
      ->capture_default_str();
  sub.add_option("--group-size", flags->group_size, "affine group size of the 8- and 4-bit rows")->capture_default_str();
  add_kv_dtype_flag(sub, flags->kv_dtype);
  sub.add_option("--from", flags->from, "decode from this position: a prompt of that many tokens prefilled first, untimed")
      ->capture_default_str();
  sub.callback([flags, run_flags] { run_bench(*flags, *run_flags); });
}

const bool registered =
    register_bench({"decode", "Decode tokens/s next to the memory-bandwidth roofline", setup_bench_decode});

}  // namespace

}  // namespace tpcli::cli

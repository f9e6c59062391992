// tpcli bench batch --model PATH [--devices N | --mesh model=N] [--threads T] [--formats f32,8,4]
//                   [--group-size G] [--int8-activations] [--kv-dtype f32|bf16|f16] --npp 128 --ntg 64
//                   --npl 1,2,4,8,16,32
// llama.cpp's llama-batched-bench for tpcli, with its column names, so the two tools' tables sit
// side by side: for each B of --npl, the batched engine (engine/batch_engine.h) prefills B prompts of
// --npp random tokens (one step over all B prompts) then decodes --ntg tokens of each together
// (one step per token: B rows per weight pass, each row bit for bit what it gives alone), greedy.
// PP, TG: tokens per
// sequence; N_KV = B (PP + TG); T_PP, T_TG: seconds of the two phases (slowest device); S_PP =
// B PP / T_PP, S_TG = B TG / T_TG, S = N_KV / T. One table per format, then the KV pool's bytes per
// device at the largest B; on D > 1 devices, the mesh's S_TG against D independent 1-device
// engines on B/D sequences each at the same time (the machine's own ceiling for D devices).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/model_file.h"
#include "distributed/runtime.h"
#include "engine/batch_engine.h"
#include "model/llama.h"
#include "model/packed_weights.h"
#include "tensor/blas.h"
#include "tensor/packed_matrix.h"

namespace tpcli::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct BatchFlags {
  std::string model;
  int threads = 0;  // per device; 0 = cores / devices (at least 1)
  std::string formats = "f32";
  int group_size = 64;
  bool int8_activations = false;  // tensor::set_int8_activations: the 8- and 4-bit tables
  int npp = 128, ntg = 64;
  std::vector<int> npl{1, 2, 4, 8, 16, 32};
  std::string kv_dtype = "f32";
};

struct PhaseSeconds {
  double prefill = 0, decode = 0;
  int64_t kv_bytes = 0;  // the KV pool's
};

// One row's two phases on every device; the slowest device's seconds.
// independent: every device runs an engine of its own on a lone model (all the weights) with B / D
// of the prompts, all at the same time: what the machine gives D separate 1-device runs.
PhaseSeconds time_batch(const model::WeightSource& weights, const dist::Mesh& mesh, const BatchFlags& f, int B, int threads,
                        bool independent = false) {
  std::mt19937 rng(static_cast<uint32_t>(B));
  std::uniform_int_distribution<int> pick(0, weights.config().vocab_size - 1);
  std::vector<std::vector<int>> prompts(static_cast<size_t>(B), std::vector<int>(static_cast<size_t>(f.npp)));
  for (auto& p : prompts)
    for (int& t : p) t = pick(rng);
  std::vector<PhaseSeconds> per_device(static_cast<size_t>(mesh.size()));
  const model::Placement placement(weights, mesh);
  dist::RunOptions options;
  options.blas_threads = threads;
  dist::run_on_mesh(
      mesh,
      [&](dist::Device& dev) {
        model::Llama llama = independent ? model::Llama(weights, dist::Group{})
                                         : model::Llama(weights, placement, dev);
        const dist::Range mine = independent ? dist::even_split(B, mesh.size(), dev.rank()) : dist::Range{0, B};
        engine::EngineOptions o;
        o.parallel = static_cast<int>(std::max<int64_t>(mine.count, 1));
        o.step_tokens = o.parallel * f.npp;  // every prompt in the first step
        o.kv_blocks = o.parallel * ((f.npp + f.ntg + o.block_size - 1) / o.block_size);
        o.kv_dtype = parse_kv_dtype(f.kv_dtype);
        engine::BatchEngine engine(llama, o);
        // the first token comes from the prefill's logits, then --ntg decode steps
        for (int64_t b = mine.offset; b < mine.offset + mine.count; ++b)
          engine.add({prompts[static_cast<size_t>(b)], f.ntg + 1, 0.0f, 0.9f, 1, {}});
        PhaseSeconds& s = per_device[static_cast<size_t>(dev.rank())];
        dev.world().barrier();
        auto t0 = Clock::now();
        engine.step();
        s.prefill = std::chrono::duration<double>(Clock::now() - t0).count();
        dev.world().barrier();
        t0 = Clock::now();
        while (engine.step()) {
        }
        s.decode = std::chrono::duration<double>(Clock::now() - t0).count();
        s.kv_bytes = engine.kv_pool_bytes();
      },
      options);
  PhaseSeconds slowest = per_device.front();
  for (const PhaseSeconds& s : per_device) {
    slowest.prefill = std::max(slowest.prefill, s.prefill);
    slowest.decode = std::max(slowest.decode, s.decode);
  }
  return slowest;
}

// The same decode against the machine's own ceiling: as many independent 1-device engines as the
// mesh has devices, each on its share of the sequences, at the same time.
void print_ceiling(const model::WeightSource& weights, const dist::Mesh& mesh, const BatchFlags& f, int threads) {
  const int D = mesh.size();
  std::printf("against %d independent 1-device engines, each on B/%d of the sequences at the same time:\n"
              "|    B | S_TG t/s mesh | S_TG t/s independent | mesh / independent |\n"
              "|------|---------------|----------------------|--------------------|\n", D, D);
  for (int B : f.npl) {
    if (B < D) continue;
    const PhaseSeconds m = time_batch(weights, mesh, f, B, threads), i = time_batch(weights, mesh, f, B, threads, true);
    const double tg_mesh = double(B) * f.ntg / m.decode, tg_independent = double(B) * f.ntg / i.decode;
    std::printf("| %4d | %13.2f | %20.2f | %18.2f |\n", B, tg_mesh, tg_independent, tg_mesh / tg_independent);
    std::fflush(stdout);
  }
}

// "f32 (as stored)", "affine 4-bit g64", "affine 4-bit g64 int8x" (int8 activations).
std::string table_name(const std::string& format_flag, const BatchFlags& f) {
  if (format_flag == "f32") return "f32 (as stored)";
  const tensor::WeightFormat format = *parse_quantize_flag(format_flag, f.group_size);
  const bool int8x = f.int8_activations && format.kind == tensor::WeightKind::Affine && (format.bits == 8 || format.bits == 4);
  return format.name() + (int8x ? " int8x" : "");
}

void run_bench_batch(const BatchFlags& f, const RunFlags& run_flags) {
  const nn::KvDtype kv_dtype = parse_kv_dtype(f.kv_dtype);
  const dist::Mesh mesh = mesh_from_flags(run_flags);
  OpenedModel opened = open_model(f.model);
  place_model(opened, f.model, mesh);  // a model the tensor axis cannot split is an error before any table
  tensor::set_int8_activations(f.int8_activations);
  const model::LlamaConfig& c = opened.weights->config();
  if (f.npp < 1 || f.ntg < 1 || f.npp + f.ntg > c.seq_len)
    throw UsageError("--npp " + std::to_string(f.npp) + " + --ntg " + std::to_string(f.ntg) + " must be >= 2 and fit seq_len = " +
                     std::to_string(c.seq_len));
  for (int B : f.npl)
    if (B < 1 || B > 1024) throw UsageError("--npl " + std::to_string(B) + ": batch sizes must be in [1, 1024]");
  const int devices = mesh.size(), threads = f.threads > 0 ? f.threads : std::max(1, tensor::available_cores() / devices);
  std::printf("model %s: dim %d, %d layers, vocab %d, %.1f M parameters; mesh %s, %d thread(s) per device; KV cache %s\n",
              f.model.c_str(), c.dim, c.n_layers, c.vocab_size, c.parameter_count() / 1e6, mesh.to_string().c_str(), threads,
              nn::kv_dtype_name(kv_dtype));
  std::string list = f.formats + ",";
  for (size_t at = 0, comma; (comma = list.find(',', at)) != std::string::npos; at = comma + 1) {
    const std::string name = list.substr(at, comma - at);
    if (name.empty()) continue;
    std::unique_ptr<model::WeightSource> converted;
    if (name != "f32") converted = std::make_unique<model::ConvertedWeights>(*opened.weights, *parse_quantize_flag(name, f.group_size));
    const model::WeightSource& weights = converted ? *converted : *opened.weights;
    std::printf("\n%s\n|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |\n"
                "|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|\n",
                table_name(name, f).c_str());
    int64_t kv_bytes = 0;
    for (int B : f.npl) {
      const PhaseSeconds s = time_batch(weights, mesh, f, B, threads);
      const double n_kv = double(B) * (f.npp + f.ntg), t = s.prefill + s.decode;
      std::printf("| %5d | %6d | %4d | %6.0f | %8.3f | %8.2f | %8.3f | %8.2f | %8.3f | %8.2f |\n", f.npp, f.ntg, B, n_kv,
                  s.prefill, double(B) * f.npp / s.prefill, s.decode, double(B) * f.ntg / s.decode, t, n_kv / t);
      std::fflush(stdout);
      kv_bytes = s.kv_bytes;
    }
    std::printf("KV pool per device at B = %d: %.1f MB\n", f.npl.back(), static_cast<double>(kv_bytes) / 1e6);
    if (devices > 1) print_ceiling(weights, mesh, f, threads);
  }
}

void setup_bench_batch(CLI::App& sub) {
  auto f = std::make_shared<BatchFlags>();
  auto run_flags = add_run_flags(sub, FLAG_DEVICES | FLAG_MESH);
  sub.add_option("--model", f->model, "checkpoint: llama2.c .bin, tpcli .safetensors or a Hugging Face directory")->required();
  sub.add_option("--threads", f->threads, "compute threads per device (default: cores / devices, at least 1)");
  sub.add_option("--formats", f->formats, "weight formats, one table each: f32, bf16, f16, 8, 4, mxfp8")->capture_default_str();
  sub.add_option("--group-size", f->group_size, "group size of the quantized formats")->capture_default_str();
  add_int8_activations_flag(sub, f->int8_activations);
  sub.add_option("--npp", f->npp, "prompt tokens per sequence")->capture_default_str();
  sub.add_option("--ntg", f->ntg, "generated tokens per sequence")->capture_default_str();
  sub.add_option("--npl", f->npl, "batch sizes (sequences at once)")->delimiter(',')->capture_default_str();
  add_kv_dtype_flag(sub, f->kv_dtype);
  sub.callback([f, run_flags] { run_bench_batch(*f, *run_flags); });
}

const bool registered = register_bench(
    {"batch", "B sequences prefilled and decoded together: llama-batched-bench's table", setup_bench_batch});

}  // namespace

}  // namespace tpcli::cli

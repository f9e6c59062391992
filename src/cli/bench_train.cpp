// tpcli bench train --config C [--meshes 1x1,1x2,2x1,2x1+shard] [--steps N] — training throughput
// of a run config on several meshes (data x model), as tokens/s and model FLOPs utilisation (MFU)
// against the BLIS sgemm peak measured in the same run. A mesh may carry options: "+shard"
// (train.shard_optimizer, ZeRO-1), "+recompute" (train.recompute), "+sp" (mesh.sequence_parallel),
// "+plain" (none of them), "+blocking" (train.overlap_buckets = false: the data-parallel buckets
// after backward, not during it), "+lora" (LoRA adapters of rank 8 on every linear of the same model,
// its base frozen: `--meshes 1x1,1x1+lora,1x1,1x1+lora` alternates full and LoRA steps), "+qlora8",
// "+qlora4", "+qlorabf16" (the same adapters on the same random base stored 8-bit or 4-bit affine
// with groups of 32, or bf16: QLoRA, model/trainable_llama.h).
//
// Model FLOPs per token (PaLM's appendix B): 6 * (matmul parameters, the classifier included, the
// embedding lookup not) + 12 * L * C * T for attention scores and values (forward + backward).
// Peak: single-thread sgemm GFLOP/s on 1024^3 (best of 3) times the cores the mesh uses
// (min(devices x BLIS threads per device, cores)). One BLIS thread per device by default, so the
// first mesh (1x1) is one core and the ratios are what more devices give (train's own default,
// cores / devices, would let 1x1 run its large gemms on every core).
// Predicted step time (perf/cost_model.h): device 0's work items (train/step_plan.h: every gemm at
// its shape, the passes over memory, the exponentials, AdamW) at rates measured just before with
// every device of the mesh running at once, plus its collectives (each call run on the mesh's
// groups under [mesh.links] / --link: the modelled time and the backend's own cost), less the
// gradient buckets that overlap the last backward. The line under each row gives the parts.
// Ceiling: after a mesh of N = DATA x MODEL > 1 devices, N independent 1x1 trainings of batch B/N
// each (the mesh's options and BLIS threads per device), started together on threads of this
// process, run the same steps; the line "vs N concurrent 1-device runs of batch B/N: R x" gives the
// mesh's tokens/s over their summed tokens/s. They share nothing but the host, so R is what the
// parallelism keeps of what this machine can do with N cores at once (memory bandwidth and caches
// shared, turbo lower): a ratio that does not change with the machine's two-process scaling. B
// must divide by N (checked for every mesh before anything runs).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <exception>
#include <sstream>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "config/model_config.h"
#include "cli/plan_report.h"
#include "config/train_setup.h"
#include "model/packed_weights.h"
#include "model/random_init.h"
#include "model/trainable_llama.h"
#include "perf/gemm_rate.h"
#include "perf/measure_rates.h"
#include "tensor/blas.h"
#include "train/loop.h"
#include "train/step_plan.h"

namespace tpcli::cli {

namespace {

// A random base for the config, stored in `format` (the f32 values kept alive beside it).
std::shared_ptr<const model::WeightSource> packed_random_base(const model::LlamaConfig& c, const tensor::WeightFormat& format) {
  struct Owned {
    model::TensorWeights f32;
    model::ConvertedWeights packed;
    Owned(const model::LlamaConfig& c, const tensor::WeightFormat& f) : f32(model::random_weights(c, 1)), packed(f32, f) {}
  };
  auto owned = std::make_shared<const Owned>(c, format);
  return std::shared_ptr<const model::WeightSource>(owned, &owned->packed);
}


struct BenchTrainOptions {
  std::string config;
  std::vector<std::string> meshes = {"1x1", "1x2", "2x1", "2x1+shard"};
  int steps = 10;   // timed
  int warmup = 2;   // untimed, first
  int blas_threads = 1;  // per device; 0 = train's automatic (cores / devices)
  std::vector<std::string> set;
};

double flops_per_token(const model::LlamaConfig& c, int T) {
  const double C = c.dim, L = c.n_layers, V = c.vocab_size;
  double matmul = static_cast<double>(c.parameter_count()) - V * C;  // no embedding lookup ...
  matmul += V * C;                                                   // ... but the classifier matmul
  for (int l = 0; l < c.n_layers; ++l) matmul -= 2 * C;              // norm gains are no matmul
  matmul -= C;
  return 6.0 * matmul + 12.0 * L * C * T;
}

// Device 0's step (train/step_plan.h) priced at rates measured now with every device at once on
// `threads` BLIS threads each, plus its collectives (modelled links, or the copies). Nullopt for a
// mesh without a plan (sequence parallel, MoE).
std::optional<perf::Prediction> predict_step(const config::RunConfig& cfg, const train::TrainOptions& t, int threads) {
  const config::MeshSection& ms = cfg.mesh;
  if ((ms.sequence_parallel && ms.axis_size(ms.tensor_axis) > 1) || t.model.is_moe() || t.lora) return std::nullopt;
  const perf::PlanMesh mesh{ms.tensor_axis, ms.data_axis, ms.axis_size(ms.tensor_axis), ms.axis_size(ms.data_axis), t.run.links};
  const train::MemoryLayout layout = train::memory_layout(t);
  const auto work = train::plan_step_work(t.model, layout, t.grad_accum);
  const auto comm = train::plan_step_collectives(t.model, layout, t.grad_accum);
  const perf::WorkRates rates = perf::measure_work_rates(work, comm, mesh, threads);
  return perf::predict(work, comm, mesh, rates, t.overlap_buckets, t.grad_accum);
}

// One --meshes entry: its shape and the config with its options applied.
struct BenchMesh {
  std::string name;  // as given, e.g. "2x1+shard"
  int data = 0, model = 0;
  config::RunConfig cfg;
  bool lora = false;
  std::optional<tensor::WeightFormat> packed;  // QLoRA: the base's format
  int devices() const { return data * model; }
};

BenchMesh parse_mesh(const config::RunConfig& base, const std::string& m) {
  BenchMesh b{m, 0, 0, base, false, std::nullopt};
  char x = 0;
  std::istringstream in(m.substr(0, m.find('+')));
  if (!(in >> b.data >> x >> b.model) || x != 'x' || b.data < 1 || b.model < 1 || !in.eof())
    throw UsageError("--meshes " + m + ": expected DATAxMODEL[+shard][+recompute][+sp], e.g. 2x1+shard");
  config::RunConfig& cfg = b.cfg;
  for (size_t at = m.find('+'); at != std::string::npos; at = m.find('+', at + 1)) {
    const std::string option = m.substr(at + 1, m.find('+', at + 1) - at - 1);
    if (option == "shard") cfg.train.shard_optimizer = true;
    else if (option == "recompute") cfg.train.recompute = true;
    else if (option == "sp") cfg.mesh.sequence_parallel = true;
    else if (option == "plain") cfg.train.shard_optimizer = cfg.train.recompute = cfg.mesh.sequence_parallel = false;
    else if (option == "blocking") cfg.train.overlap_buckets = false;
    else if (option == "lora") b.lora = true;
    else if (option == "qlora8") b.packed = tensor::WeightFormat::affine(8, 32);
    else if (option == "qlora4") b.packed = tensor::WeightFormat::affine(4, 32);
    else if (option == "qlorabf16") b.packed = tensor::WeightFormat::bf16();
    else
      throw UsageError("--meshes " + m + ": unknown option '+" + option +
                       "' (shard, recompute, sp, plain, blocking, lora, qlora8, qlora4, qlorabf16)");
  }
  config::set_mesh_axes(cfg, {{cfg.mesh.data_axis, b.data}, {cfg.mesh.tensor_axis, b.model}}, "--meshes " + m);
  return b;
}

// The ceiling's runs split the batch evenly; checked for every mesh before anything runs.
void check_ceiling_batch(const BenchMesh& b) {
  const int batch = b.cfg.train.batch_size;
  if (b.devices() > 1 && batch % b.devices() != 0)
    throw UsageError("--meshes " + b.name + ": train.batch_size = " + std::to_string(batch) + " does not split into " +
                     std::to_string(b.devices()) + " concurrent 1-device runs (the ceiling); use a batch divisible by " +
                     std::to_string(b.devices()));
}

// The mesh's training options, set for a benchmark: no files, no evaluation, `threads` BLIS threads
// per device.
train::TrainOptions bench_options(const BenchMesh& b, const BenchTrainOptions& o, int threads) {
  config::Prepared p = config::prepare_training(b.cfg, false);
  train::TrainOptions t = std::move(p.options);
  if (b.lora || b.packed) t.lora = model::LoraOptions{};  // on the config's (random) base: the cost is the same
  if (b.packed) t.init = packed_random_base(t.model, *b.packed);
  t.steps = o.warmup + o.steps;
  t.schedule.total_steps = t.steps;
  t.out_dir.clear();
  t.eval_batches = 0;
  t.sample_tokens = 0;
  t.progress = false;
  t.run.blas_threads = threads;
  t.run.links = b.cfg.mesh.links;  // [mesh.links] / --link: the measured run is modelled too
  return t;
}

double tokens_per_step(const train::TrainOptions& t) {
  return static_cast<double>(t.batch_size) * t.grad_accum * t.seq_len;
}

// Median step time of the timed steps (the warm-up ones left out).
double median_step_seconds(const train::TrainResult& result, const train::TrainOptions& t, int warmup) {
  std::vector<double> step_s;
  for (size_t i = static_cast<size_t>(warmup); i < result.records.size(); ++i)
    step_s.push_back(tokens_per_step(t) / result.records[i].tokens_per_s);
  std::sort(step_s.begin(), step_s.end());
  return step_s[step_s.size() / 2];
}

// The machine's ceiling for a mesh of N devices: N independent 1x1 trainings of batch B/N each
// (the mesh's options kept, `threads` BLIS threads each), each on its own thread of this process
// and started together, as the mesh's device threads are. Returns their summed tokens/s. No
// collective joins them, so the mesh can at best match it: the ratio is what sharing one host's
// memory bandwidth and caches leaves, apart from the parallelism's own cost. train::train keeps
// no global state (each call builds its own backend and mesh; BLIS threads are per thread), so
// threads are enough: no process of its own per run.
double concurrent_ceiling_tokens_per_s(const BenchMesh& b, const BenchTrainOptions& o, int threads) {
  BenchMesh one = b;
  one.cfg.train.batch_size = b.cfg.train.batch_size / b.devices();
  config::set_mesh_axes(one.cfg, {{one.cfg.mesh.data_axis, 1}, {one.cfg.mesh.tensor_axis, 1}}, "--meshes " + b.name);
  const train::TrainOptions t = bench_options(one, o, threads);
  std::vector<train::TrainResult> results(static_cast<size_t>(b.devices()));
  std::vector<std::exception_ptr> errors(results.size());
  std::vector<std::thread> runs;
  for (size_t i = 0; i < results.size(); ++i)
    runs.emplace_back([&, i] {
      try {
        results[i] = train::train(t);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    });
  for (std::thread& run : runs) run.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  double summed = 0;
  for (const train::TrainResult& r : results) summed += tokens_per_step(t) / median_step_seconds(r, t, o.warmup);
  return summed;
}

void run(const BenchTrainOptions& o, const RunFlags& flags) {
  config::RunConfig base = load_config(o.config, flags);
  if (base.mesh.backend != config::BackendKind::Threads)  // one mesh after another in this process
    throw config::ConfigError(base.where("mesh.backend") + ": bench train runs on the threads backend (for zmq, time "
                              "`tpcli launch -n P -- tpcli train CONFIG --backend zmq`; for mpi, `mpirun -n P tpcli "
                              "train CONFIG --backend mpi`)");
  std::vector<BenchMesh> meshes;
  for (const std::string& m : o.meshes) meshes.push_back(parse_mesh(base, m));
  for (const BenchMesh& b : meshes) check_ceiling_batch(b);
  const double peak1 = perf::sgemm_peak_gflops();
  const int cores = tensor::available_cores();
  std::printf("tpcli bench train: %s, %d warm-up + %d timed steps per mesh; sgemm peak %.1f GFLOP/s per core "
              "(1 thread, 1024^3), %d cores\n",
              o.config.c_str(), o.warmup, o.steps, peak1, cores);
  std::printf("%-16s %8s %8s %12s %12s %10s %8s %10s %10s %12s %10s\n", "mesh", "devices", "threads", "step ms",
              "tokens/s", "GFLOP/s", "MFU", "act MB", "optim MB", "predicted ms", "pred/meas");
  double base_tps = 0;
  for (const BenchMesh& b : meshes) {
    const int D = b.devices();
    const int threads = o.blas_threads > 0 ? o.blas_threads : std::max(1, cores / D);  // distributed/runtime.cpp's rule
    const train::TrainOptions t = bench_options(b, o, threads);
    const std::optional<perf::Prediction> predicted = predict_step(b.cfg, t, threads);
    const double median = median_step_seconds(train::train(t), t, o.warmup);
    const double tps = tokens_per_step(t) / median;
    const double gflops = tps * flops_per_token(t.model, t.seq_len) / 1e9;
    const double mfu = gflops / (peak1 * std::min(D * threads, cores));
    if (base_tps == 0) base_tps = tps;
    const train::DeviceBytes bytes = train::run_device_bytes(t);  // device 0 (train/memory.h)
    char prediction[48] = "           -          -";  // a mesh with no plan yet (sequence parallel)
    if (predicted)
      std::snprintf(prediction, sizeof prediction, "%12.1f %9.2fx", predicted->total() * 1e3, predicted->total() / median);
    std::printf("%-16s %8d %8d %12.1f %12.0f %10.2f %7.1f%% %10.2f %10.2f %s   (%.2fx the first mesh)\n", b.name.c_str(),
                D, threads, median * 1e3, tps, gflops, 100 * mfu, bytes.activations / 1e6, bytes.optimizer / 1e6,
                prediction, tps / base_tps);
    if (predicted) std::printf("  predicted: %s\n", describe(*predicted).c_str());
    std::fflush(stdout);
    if (D == 1) continue;
    const double ceiling = concurrent_ceiling_tokens_per_s(b, o, threads);
    std::printf("  vs %d concurrent 1-device runs of batch %d/%d: %.2fx (their summed tokens/s %.0f)\n", D,
                b.cfg.train.batch_size, D, tps / ceiling, ceiling);
    std::fflush(stdout);
  }
}

void setup_bench_train(CLI::App& sub) {
  auto o = std::make_shared<BenchTrainOptions>();
  auto flags = add_run_flags(sub, FLAG_SET | FLAG_LINK);
  sub.add_option("--config", o->config, "run config (TOML), e.g. configs/shakespeare-char.toml")->required();
  sub.add_option("--meshes", o->meshes, "meshes to compare, DATAxMODEL")->delimiter(',')->capture_default_str();
  sub.add_option("--steps", o->steps, "timed steps per mesh (median reported)")->capture_default_str();
  sub.add_option("--warmup", o->warmup, "untimed steps first")->capture_default_str();
  sub.add_option("--blas-threads", o->blas_threads, "BLIS threads per device (0 = cores / devices, train's default)")
      ->capture_default_str();
  sub.callback([o, flags] { run(*o, *flags); });
}

const bool registered =
    register_bench({"train", "Training tokens/s and MFU vs sgemm peak on several meshes", setup_bench_train});

}  // namespace

}  // namespace tpcli::cli

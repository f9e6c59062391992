// tpcli bench busy [--model PATH] [--hogs N] [--devices 1,2,4,8] [--tokens K] [--runs R]
//                  [--train-config C] [--train-meshes 1x1,8x1] [--zmq-processes 1,2,4]
//                  [--parts decode,train,zmq]
// Many devices on a busy machine: the same work idle and with N CPU-bound processes of the bench's
// own beside it (what a laptop, a CI runner or a shared box does to a run), side by side.
//
//   decode   K greedy decode steps of a model on D thread devices: the whole run_on_mesh (thread
//            start, sharding, decode, join), so every wait of the thread backend is in it
//   train    a few steps of a run config on DATAxMODEL meshes (8x1: eight data-parallel devices)
//   zmq      the decode on P local processes over ZeroMQ (rank 0 times it between two barriers)
//
// Each cell is the median of R runs. The slowdown is loaded / idle; "vs 1 device" divides it by
// the 1-device (or first) row's slowdown: devices that wait well stay near 1x, waits that hand the
// core to the hogs over and over grow with the device count. Idle and loaded runs of one row are
// measured back to back, so other work on the machine touches both alike; the load average before
// and after is printed because it cannot be controlled.
#include <CLI/CLI.hpp>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/model_file.h"
#include "config/model_config.h"
#include "config/run_config.h"
#include "config/train_setup.h"
#include "distributed/launch/launcher.h"
#include "distributed/runtime.h"
#include "distributed/zmq/zmq_backend.h"
#include "engine/sampler.h"
#include "model/llama.h"
#include "model/random_init.h"
#include "model/shard_plan.h"
#include "tensor/blas.h"
#include "train/loop.h"

namespace tpcli::cli {

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* DEFAULT_MODEL = "../shared/data/stories260K.bin";
constexpr const char* FALLBACK_MODEL_CONFIG = "models/stories260K.toml";  // random weights of its shape

struct BusyFlags {
  std::string model;  // "" = DEFAULT_MODEL, else random weights of FALLBACK_MODEL_CONFIG
  int hogs = 2;
  std::vector<int> devices{1, 2, 4, 8};
  int tokens = 256;
  int runs = 3;
  std::string train_config = "configs/tiny.toml";
  std::vector<std::string> train_meshes{"1x1", "8x1"};
  int train_steps = 5;
  std::vector<int> zmq_processes{1, 2, 4};
  std::vector<std::string> parts{"decode", "train", "zmq"};
  bool worker = false;  // hidden: one rank of the zmq decode
};

// N processes that spin until this object dies (or the bench does: PR_SET_PDEATHSIG). Processes,
// not threads, so that they compete for cores exactly as somebody else's compile would.
class CpuHogs {
 public:
  explicit CpuHogs(int n) {
    const pid_t parent = ::getpid();
    for (int i = 0; i < n; ++i) {
      const pid_t pid = ::fork();
      if (pid < 0) throw std::runtime_error("bench busy: cannot fork a busy process");
      if (pid == 0) spin_forever(parent);
      pids_.push_back(pid);
    }
  }
  ~CpuHogs() {
    for (pid_t pid : pids_) ::kill(pid, SIGKILL);
    for (pid_t pid : pids_) ::waitpid(pid, nullptr, 0);
  }
  CpuHogs(const CpuHogs&) = delete;
  CpuHogs& operator=(const CpuHogs&) = delete;

 private:
  [[noreturn]] static void spin_forever(pid_t parent) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(0);  // the bench died before prctl took effect
    volatile uint64_t spins = 0;
    for (;;) spins = spins + 1;
  }
  std::vector<pid_t> pids_;
};

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string one, five, fifteen;
  f >> one >> five >> fifteen;
  return one + " " + five + " " + fifteen;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Median seconds of `runs` calls of `timed_run` (which returns the seconds it measured itself).
double median_of(int runs, const std::function<double()>& timed_run) {
  std::vector<double> seconds;
  for (int i = 0; i < runs; ++i) seconds.push_back(timed_run());
  return median(seconds);
}

double seconds_of(const std::function<void()>& work) {
  const auto t0 = Clock::now();
  work();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The model to decode: the file named, else the default file, else random weights of its shape.
std::unique_ptr<model::WeightSource> load_bench_model(const std::string& path, std::string& described) {
  const std::string file = path.empty() ? DEFAULT_MODEL : path;
  if (!path.empty() || std::filesystem::exists(file)) {
    described = file;
    return std::move(open_model(file).weights);
  }
  if (!std::filesystem::exists(FALLBACK_MODEL_CONFIG))
    throw UsageError(std::string("--model: ") + DEFAULT_MODEL + " and " + FALLBACK_MODEL_CONFIG +
                     " are both missing: name a checkpoint (e.g. one made by `tpcli init`)");
  described = std::string("random weights of ") + FALLBACK_MODEL_CONFIG + " (" + DEFAULT_MODEL + " is missing)";
  return std::make_unique<model::TensorWeights>(
      model::random_weights(config::model_from_config(config::load_model_config(FALLBACK_MODEL_CONFIG)), 1));
}

// Greedy decode of `tokens` positions from BOS on this device's shards.
void decode(const model::WeightSource& weights, const model::Placement& placement, dist::Device& dev, int tokens) {
  model::Llama llama = model::Llama::on_huge_pages(weights, placement, dev);
  int token = 1;  // BOS
  for (int pos = 0; pos < tokens; ++pos) token = engine::sample_argmax(llama.forward(token, pos));
}

double decode_on_threads(const model::WeightSource& weights, int devices, int tokens) {
  return seconds_of([&] {
    const model::Placement placement(weights, dist::Mesh::line(devices, model::AxisRoles{}.tensor));
    dist::run_on_mesh(placement.mesh(), [&](dist::Device& dev) { decode(weights, placement, dev, tokens); });
  });
}

// The hidden worker: one rank of a zmq decode; rank 0 prints the seconds between two barriers.
void run_worker(const BusyFlags& f) {
  std::string described;
  const auto weights = load_bench_model(f.model, described);
  const dist::ZmqConfig config = dist::ZmqConfig::from_env();
  dist::RunOptions options;
  dist::use_zmq_backend(options, config);
  const model::Placement placement(*weights, dist::Mesh::line(config.world_size * config.devices_per_process, model::AxisRoles{}.tensor));
  const dist::Mesh& mesh = placement.mesh();
  dist::run_on_mesh(
      mesh,
      [&](dist::Device& dev) {
        dev.world().barrier();
        const auto t0 = Clock::now();
        decode(*weights, placement, dev, f.tokens);
        dev.world().barrier();
        if (dev.rank() == 0) std::printf("%.9g\n", std::chrono::duration<double>(Clock::now() - t0).count());
      },
      options);
}

double decode_on_processes(const BusyFlags& f, int processes) {
  dist::LaunchOptions launch;
  launch.processes = processes;
  FILE* out = std::tmpfile();
  if (!out) throw std::runtime_error("bench busy: cannot create a temporary file");
  launch.out_fd = fileno(out);
  std::vector<std::string> command{"tpcli", "bench", "busy", "--worker", "--tokens", std::to_string(f.tokens)};
  if (!f.model.empty()) command.insert(command.end(), {"--model", f.model});
  const int code = dist::launch(launch, command);
  std::rewind(out);
  double seconds = 0;
  const bool read = std::fscanf(out, "%lf", &seconds) == 1;
  std::fclose(out);
  if (code != 0 || !read)
    throw std::runtime_error("bench busy: the zmq ranks failed (exit code " + std::to_string(code) + ")");
  return seconds;
}

// Seconds of `steps` training steps of `config_path` on a DATAxMODEL mesh (no files, no evaluation).
double train_on_threads(const std::string& config_path, const std::string& mesh, int steps) {
  int D = 0, TP = 0;
  char x = 0;
  std::istringstream in(mesh);
  if (!(in >> D >> x >> TP) || x != 'x' || D < 1 || TP < 1)
    throw UsageError("--train-meshes " + mesh + ": expected DATAxMODEL, e.g. 8x1");
  config::RunConfig cfg = config::load_run_config(config_path, {});
  config::set_mesh_axes(cfg, {{cfg.mesh.data_axis, D}, {cfg.mesh.tensor_axis, TP}}, "--train-meshes " + mesh);
  config::Prepared p = config::prepare_training(cfg, false);
  train::TrainOptions& t = p.options;
  t.steps = steps;
  t.schedule.total_steps = steps;
  t.out_dir.clear();
  t.eval_batches = 0;
  t.sample_tokens = 0;
  t.progress = false;
  return seconds_of([&] { train::train(t); });
}

// Prints one row: idle and loaded medians side by side. base_slowdown: the first row's (0 = this is it).
double measure_row(const char* what, const std::string& label, int hogs, int runs, double base_slowdown,
                   const std::function<double()>& timed_run) {
  timed_run();  // warm-up: first touches of memory, BLIS start-up
  const double idle = median_of(runs, timed_run);
  double loaded = 0;
  {
    CpuHogs busy(hogs);
    loaded = median_of(runs, timed_run);
  }
  const double slowdown = loaded / idle;
  std::printf("%-7s %-14s %10.3f %10.3f %9.2fx %11.2fx\n", what, label.c_str(), idle, loaded, slowdown,
              slowdown / (base_slowdown > 0 ? base_slowdown : slowdown));
  std::fflush(stdout);
  return slowdown;
}

void print_header(const char* columns) {
  std::printf("\n%-7s %-14s %10s %10s %10s %12s\n", "", columns, "idle s", "loaded s", "slowdown", "vs first");
}

void check_flags(const BusyFlags& f, const model::LlamaConfig& config) {
  if (f.hogs < 1 || f.runs < 1 || f.tokens < 1 || f.train_steps < 1)
    throw UsageError("--hogs, --runs, --tokens and --train-steps must be >= 1");
  if (f.tokens > config.seq_len)
    throw UsageError("--tokens " + std::to_string(f.tokens) + " exceeds the model's seq_len " +
                     std::to_string(config.seq_len));
  for (int D : f.devices) {
    try {
      model::check_tensor_devices(config, D);
    } catch (const std::invalid_argument& e) {
      throw UsageError("--devices " + std::to_string(D) + ": " + e.what());
    }
  }
}

// One table: a row per setting, "vs first" relative to the first row's slowdown.
template <class Setting>
void measure_table(const BusyFlags& f, const char* what, const std::string& columns, const std::vector<Setting>& settings,
                   const std::function<std::string(const Setting&)>& label,
                   const std::function<double(const Setting&)>& timed_run) {
  print_header(columns.c_str());
  double first = 0;
  for (const Setting& s : settings) {
    const double slowdown = measure_row(what, label(s), f.hogs, f.runs, first, [&] { return timed_run(s); });
    if (first == 0) first = slowdown;
  }
}

void run_bench(const BusyFlags& f) {
  if (f.worker) return run_worker(f);
  std::string described;
  const auto weights = load_bench_model(f.model, described);
  check_flags(f, weights->config());
  std::printf("tpcli bench busy: idle vs %d busy process(es) of its own, %d core(s), median of %d run(s)\n", f.hogs,
              tensor::available_cores(), f.runs);
  std::printf("load average before: %s\n", load_average().c_str());
  std::printf("decode: %d greedy steps of %s\n", f.tokens, described.c_str());
  const auto wanted = [&](const char* part) { return std::find(f.parts.begin(), f.parts.end(), part) != f.parts.end(); };
  if (wanted("decode"))
    measure_table<int>(
        f, "decode", "threads", f.devices, [](const int& D) { return std::to_string(D) + " device(s)"; },
        [&](const int& D) { return decode_on_threads(*weights, D, f.tokens); });
  if (wanted("train")) {
    const std::string config_name = std::filesystem::path(f.train_config).filename().string();
    measure_table<std::string>(
        f, "train", "train " + std::to_string(f.train_steps) + " steps", f.train_meshes,
        [&](const std::string& m) { return m + " " + config_name; },
        [&](const std::string& m) { return train_on_threads(f.train_config, m, f.train_steps); });
  }
  if (wanted("zmq") && !dist::zmq_available())
    std::printf("\nzmq decode: skipped, this tpcli was built without ZeroMQ (TPCLI_ZMQ=OFF)\n");
  else if (wanted("zmq"))
    measure_table<int>(
        f, "zmq", "zmq decode", f.zmq_processes, [](const int& P) { return std::to_string(P) + " process(es)"; },
        [&](const int& P) { return decode_on_processes(f, P); });
  std::printf("\nload average after: %s\n", load_average().c_str());
}

void setup_bench_busy(CLI::App& sub) {
  auto f = std::make_shared<BusyFlags>();
  sub.add_option("--model", f->model,
                 std::string("checkpoint to decode (default ") + DEFAULT_MODEL + ", else random weights of " +
                     FALLBACK_MODEL_CONFIG + ")");
  sub.add_option("--hogs", f->hogs, "CPU-bound processes started beside the loaded runs")->capture_default_str();
  sub.add_option("--devices", f->devices, "thread device counts for the decode")->delimiter(',')->capture_default_str();
  sub.add_option("--tokens", f->tokens, "decode steps per run")->capture_default_str();
  sub.add_option("--runs", f->runs, "runs per cell (median reported)")->capture_default_str();
  sub.add_option("--train-config", f->train_config, "run config for the training rows")->capture_default_str();
  sub.add_option("--train-meshes", f->train_meshes, "DATAxMODEL meshes to train on")
      ->delimiter(',')
      ->capture_default_str();
  sub.add_option("--train-steps", f->train_steps, "training steps per run")->capture_default_str();
  sub.add_option("--zmq-processes", f->zmq_processes, "local process counts for the zmq decode")
      ->delimiter(',')
      ->capture_default_str();
  sub.add_option("--parts", f->parts, "what to measure")
      ->delimiter(',')
      ->check(CLI::IsMember({"decode", "train", "zmq"}))
      ->capture_default_str();
  sub.add_flag("--worker", f->worker, "internal: one rank of the zmq decode")->group("");
  sub.callback([f] { run_bench(*f); });
}

const bool registered = register_bench(
    {"busy", "Decode, training and zmq runs idle vs beside CPU-bound processes: slowdown per device count",
     setup_bench_busy});

}  // namespace

}  // namespace tpcli::cli

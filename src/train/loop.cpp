#include "train/loop.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <stdexcept>

#include "dist/runtime.h"
#include "dist/trace.h"
#include "model/atomic_file.h"
#include "model/llama.h"
#include "model/random_init.h"
#include "model/safetensors.h"
#include "model/shard_plan.h"
#include "train/checkpoint.h"
#include "train/sample.h"

namespace tpcli::train {

using Clock = std::chrono::steady_clock;

static bool is_expert_param(const model::ParamSpec& spec) { return spec.name.find(".experts.") != std::string::npos; }
static bool is_kv_param(const model::ParamSpec& spec) {
  const auto& n = spec.name;
  return n.size() > 3 && (n.ends_with(".wk") || n.ends_with(".wv"));
}

// ---- options ----

void check_options(const TrainOptions& o) {
  auto fail = [](const std::string& message) { throw std::invalid_argument(message); };
  const dist::Mesh& mesh = o.mesh;
  const int D = mesh.axis_size(o.data_axis), TP = mesh.axis_size(o.tensor_axis);
  const std::string expert_axis = o.expert_axis.empty() ? o.data_axis : o.expert_axis;
  for (const auto& axis : mesh.axes())
    if (axis.name != o.data_axis && axis.name != o.tensor_axis && axis.name != expert_axis)
      fail("mesh axis '" + axis.name + "' (size " + std::to_string(axis.size) + ") is neither the data axis '" +
           o.data_axis + "' nor the tensor axis '" + o.tensor_axis + "'");
  o.model.validate();
  model::check_tensor_devices(o.model, TP);
  if (o.batch_size < 1) fail("train.batch_size = " + std::to_string(o.batch_size) + " must be >= 1");
  if (o.batch_size % D != 0)
    fail("mesh axis " + o.data_axis + " = " + std::to_string(D) + " does not divide train.batch_size = " +
         std::to_string(o.batch_size));
  if (o.seq_len < 1 || o.seq_len > o.model.seq_len)
    fail("train.seq_len = " + std::to_string(o.seq_len) + " must be in [1, model seq_len = " +
         std::to_string(o.model.seq_len) + "]");
  if (o.steps < 1) fail("train.steps = " + std::to_string(o.steps) + " must be >= 1");
  if (!o.corpus || !o.tokenizer) fail("training needs a corpus and its tokenizer (data.path)");
  if (o.tokenizer->vocab_size() > o.model.vocab_size)
    fail("the tokenizer has " + std::to_string(o.tokenizer->vocab_size()) + " tokens but model vocab_size = " +
         std::to_string(o.model.vocab_size));
  // One window is seq_len + 1 tokens (train/data.h).
  if (static_cast<int64_t>(o.corpus->train.size()) < int64_t{o.seq_len} + 1)
    fail("the training split holds " + std::to_string(o.corpus->train.size()) + " tokens: too few for seq_len = " +
         std::to_string(o.seq_len) + " (needs seq_len + 1; lower train.seq_len or use a longer corpus)");
  if (o.eval_batches > 0 && static_cast<int64_t>(o.corpus->val.size()) < int64_t{o.seq_len} + 1)
    fail("the validation split holds " + std::to_string(o.corpus->val.size()) + " tokens: too few for seq_len = " +
         std::to_string(o.seq_len) + " (set train.eval_batches = 0 or use a longer corpus)");
  if (o.init && !(o.init->config().dim == o.model.dim && o.init->config().n_layers == o.model.n_layers &&
                  o.init->config().vocab_size == o.model.vocab_size))
    fail("model.init_from has a different shape than the [model] section");
  if (o.resume && o.out_dir.empty()) fail("--resume needs train.out_dir");
}

bool is_writer_process(const TrainOptions& o) {
  return o.local_ranks.empty() || std::find(o.local_ranks.begin(), o.local_ranks.end(), 0) != o.local_ranks.end();
}

// ---- pieces of a step ----

double data_parallel_gradients(model::Llama& llama, const ParallelAxes& axes, std::span<const int> inputs,
                               std::span<const int> targets, int rows, int seq_len) {
  llama.zero_grad();
  float loss = llama.forward_backward(inputs, targets, rows, seq_len);
  for (auto& p : llama.parameters()) {
    std::span<float> g = p.grad->span();
    if (is_expert_param(*p.spec)) {
      // nn/moe.h: an expert's owner already sums every member's tokens; 1/G makes it the mean.
      const float scale = 1.0f / static_cast<float>(axes.expert_group_size);
      for (float& x : g) x *= scale;
      if (!axes.experts_on_data_axis) axes.data->mean(g);
    } else {
      axes.data->mean(g);
    }
  }
  axes.data->mean(std::span<float>(&loss, 1));
  return loss;
}

std::vector<Slot> make_slots(model::Llama& llama, const model::LlamaConfig& config, const ParallelAxes& axes,
                             int tensor_rank) {
  const auto plans = model::plan_all_shards(config, axes.tensor_size);
  const model::ShardPlan& mine = plans[static_cast<size_t>(tensor_rank)];
  std::vector<Slot> slots;
  for (auto& p : llama.parameters()) {
    Slot s;
    s.value = p.value->span();
    s.grad = p.grad->span();
    s.decay = p.spec->weight_decay;
    const bool expert = is_expert_param(*p.spec);
    // Devices holding this very gradient: data ranks (after pmean), unless experts live there ...
    const double data_copies = expert && axes.experts_on_data_axis ? 1.0 : axes.data_size;
    // ... times tensor devices, for replicated parameters.
    const double tensor_copies = p.spec->split == model::Split::Replicated ? axes.tensor_size : 1.0;
    s.norm_weight = 1.0 / (data_copies * tensor_copies);
    if (is_kv_param(*p.spec) && mine.kv_replicated) {
      // A KV head used by several devices' query heads is held (and its gradient summed) by each.
      for (int64_t h = mine.kv_heads.offset; h < mine.kv_heads.offset + mine.kv_heads.count; ++h) {
        int holders = 0;
        for (const auto& plan : plans) holders += plan.kv_heads.offset <= h && h < plan.kv_heads.offset + plan.kv_heads.count;
        s.row_norm_weights.push_back(1.0 / (data_copies * holders));
      }
    }
    slots.push_back(std::move(s));
  }
  return slots;
}

// ---- output ----

static std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  auto s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(s / 3600), static_cast<long long>(s / 60 % 60));
  else if (s >= 60)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  else
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(s));
  return buf;
}

static std::string json_number(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.7g", x);
  return buf;
}

static std::string metrics_line(const StepRecord& r) {
  std::string line = "{\"step\": " + std::to_string(r.step) + ", \"loss\": " + json_number(r.loss) +
                     ", \"lr\": " + json_number(r.lr) + ", \"grad_norm\": " + json_number(r.grad_norm) +
                     ", \"tokens_per_s\": " + json_number(r.tokens_per_s);
  if (r.val_loss) line += ", \"val_loss\": " + json_number(*r.val_loss);
  if (!r.expert_tokens.empty()) {  // MoE: per-block expert loads and the traffic of device 0
    line += ", \"expert_tokens\": [";
    for (size_t l = 0; l < r.expert_tokens.size(); ++l) {
      line += l ? ", [" : "[";
      for (size_t e = 0; e < r.expert_tokens[l].size(); ++e) line += (e ? ", " : "") + std::to_string(r.expert_tokens[l][e]);
      line += "]";
    }
    line += "], \"moe_bytes_sent\": " + std::to_string(r.moe_bytes_sent) + ", \"moe_dropped\": " + std::to_string(r.moe_dropped);
  }
  return line + "}\n";
}

// ---- checkpoints ----

// Every parameter's full tensor, for the moments: the moment buffers take the place of the values
// while the model gathers its "weights" (collective over the tensor group), so the sharding
// arithmetic stays in one place (the model).
static model::TensorWeights gather_as_weights(model::Llama& llama, std::vector<tensor::Tensor>& shards) {
  auto params = llama.parameters();
  for (size_t i = 0; i < params.size(); ++i) std::swap(*params[i].value, shards[i]);
  model::TensorWeights full = [&] {
    try {
      return llama.gather_weights();
    } catch (...) {
      for (size_t i = 0; i < params.size(); ++i) std::swap(*params[i].value, shards[i]);
      throw;
    }
  }();
  for (size_t i = 0; i < params.size(); ++i) std::swap(*params[i].value, shards[i]);
  return full;
}

model::TensorWeights gather_gradients(model::Llama& llama) {
  std::vector<tensor::Tensor> grads;
  for (auto& p : llama.parameters()) grads.push_back(*p.grad);
  return gather_as_weights(llama, grads);
}

static void require_finite(std::span<const float> values, const std::string& path, int64_t step,
                           const std::string& name) {
  for (float x : values)
    if (!std::isfinite(x))
      throw std::runtime_error(path + ": not written at step " + std::to_string(step) + ": tensor " + name +
                               " holds non-finite values (the previous checkpoint is kept)");
}

struct SaveInfo {
  std::string path;
  int64_t step = 0;
  const TrainOptions* options = nullptr;
};

// Collective over the tensor group (gathers); every device calls it, world rank 0 writes.
static void save_checkpoint(model::Llama& llama, AdamW& adam, const SaveInfo& info, bool writer) {
  model::TensorWeights weights = llama.gather_weights();
  model::TensorWeights m = gather_as_weights(llama, adam.exp_avg());
  model::TensorWeights v = gather_as_weights(llama, adam.exp_avg_sq());
  if (!writer) return;
  const TrainOptions& o = *info.options;
  const auto specs = model::llama_parameters(o.model);
  // Never replace a good checkpoint with a bad one (the step's guard should have stopped first).
  for (const auto& spec : specs)
    for (const auto* source : {&weights, &m, &v})
      require_finite(source->get(spec.name), info.path, info.step,
                     source == &weights ? spec.name : (source == &m ? EXP_AVG_PREFIX : EXP_AVG_SQ_PREFIX) + spec.name);
  std::vector<model::TensorView> tensors;
  std::vector<std::string> names;  // keeps the moment names alive
  names.reserve(specs.size() * 2);
  for (const auto& spec : specs) tensors.push_back({spec.name, spec.shape, weights.get(spec.name)});
  for (const auto& spec : specs) {
    names.push_back(EXP_AVG_PREFIX + spec.name);
    tensors.push_back({names.back(), spec.shape, m.get(spec.name)});
    names.push_back(EXP_AVG_SQ_PREFIX + spec.name);
    tensors.push_back({names.back(), spec.shape, v.get(spec.name)});
  }
  Metadata meta;
  meta["format"] = "tpcli";
  model::config_to_metadata(o.model, meta);
  tokenizer_to_metadata(*o.tokenizer, meta);
  meta["train.step"] = std::to_string(info.step);
  meta["train.seed"] = std::to_string(o.seed);
  meta["train.mesh"] = o.mesh.to_string();
  if (!o.metadata_note.empty()) meta["train.config"] = o.metadata_note;
  model::write_safetensors(info.path, tensors, meta);
}

// The moments stored in a checkpoint, sliced into this device's shards: a model built from them
// (same config, same tensor group) holds exactly the local slices.
static void load_moments(const model::SafetensorsFile& file, const model::LlamaConfig& config, dist::Group& tensor_group,
                         dist::Group& expert_group, const char* prefix, std::vector<tensor::Tensor>& out) {
  model::TensorWeights source(config);
  for (const auto& spec : model::llama_parameters(config)) {
    const std::string name = prefix + spec.name;
    if (!file.has(name)) throw std::runtime_error(file.path() + ": no optimizer state '" + name + "' to resume from");
    auto data = file.tensor(name).data;
    source.set(spec.name, tensor::Tensor(spec.shape, std::vector<float>(data.begin(), data.end())));
  }
  model::Llama shards(source, tensor_group, expert_group);
  auto params = shards.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].value->numel() != out[i].numel())
      throw std::logic_error("resume: optimizer shard size mismatch for " + params[i].spec->name);
    std::copy(params[i].value->data(), params[i].value->data() + out[i].numel(), out[i].data());
  }
}

// "train.step" of a checkpoint: a step count in [0, MAX_STEPS], else a one-line error naming it.
static int64_t resume_step(const model::SafetensorsFile& file) {
  constexpr int64_t MAX_STEPS = int64_t{1} << 40;
  auto it = file.metadata().find("train.step");
  if (it == file.metadata().end()) throw std::runtime_error(file.path() + ": no train.step in the metadata");
  const std::string& text = it->second;
  int64_t step = -1;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), step);
  if (ec != std::errc() || end != text.data() + text.size() || step < 0 || step > MAX_STEPS)
    throw std::runtime_error(file.path() + ": metadata train.step = '" + text + "' is not a step count (an integer in [0, " +
                             std::to_string(MAX_STEPS) + "])");
  return step;
}

// The model a checkpoint holds must be the one the config describes, or its tensors cannot be sliced.
static void require_same_model(const model::SafetensorsFile& file, const model::LlamaConfig& wanted) {
  model::Metadata have, want;
  model::config_to_metadata(file.config(), have);
  model::config_to_metadata(wanted, want);
  for (const auto& [key, value] : want) {
    auto it = have.find(key);
    const std::string held = it == have.end() ? "(unset)" : it->second;
    if (held != value)
      throw std::runtime_error(file.path() + ": --resume: the checkpoint holds a model with " + key + " = " + held +
                               " but the config asks for " + value +
                               " (resume with the same [model] settings, or train into a new train.out_dir)");
  }
}

// metrics.jsonl keeps one line per step: a resumed run drops the lines after the checkpoint's
// step (written before a kill, and about to be written again).
static void truncate_metrics(const std::filesystem::path& metrics, int64_t last_step) {
  std::ifstream in(metrics);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    const auto key = line.find("\"step\": ");
    int64_t step = -1;
    if (key != std::string::npos) std::from_chars(line.data() + key + 8, line.data() + line.size(), step);
    if (step >= 0 && step <= last_step) kept += line + "\n";
  }
  in.close();
  model::write_atomically(metrics.string(), [&](std::ostream& out) { out << kept; });
}

// Before the update: the weights and the last checkpoint are still good. `kept`: the checkpoint
// on disk ("" = none).
[[noreturn]] static void throw_diverged(int64_t step, double loss, double norm, const std::string& kept) {
  char text[160];
  std::snprintf(text, sizeof text, "training diverged at step %lld: loss %g, gradient norm %g",
                static_cast<long long>(step), loss, norm);
  throw std::runtime_error(std::string(text) + " (stopped before the update; " +
                           (kept.empty() ? std::string("no checkpoint was written") : kept + " is kept") +
                           "; lower train.lr or raise train.warmup_steps)");
}

// ---- the loop ----

namespace {

struct Progress {
  bool tty = isatty(STDERR_FILENO) != 0;
  bool open_line = false;
  void line(const std::string& text) {
    if (tty) {
      std::fprintf(stderr, "\r\033[K%s", text.c_str());
      open_line = true;
    } else {
      std::fprintf(stderr, "%s\n", text.c_str());
    }
    std::fflush(stderr);
  }
  // A line that stays (a validation result): on a terminal, end the live line.
  void keep(const std::string& text) {
    line(text);
    if (tty) std::fputc('\n', stderr);
    open_line = false;
  }
  void message(const std::string& text) {
    if (open_line) std::fputc('\n', stderr);
    open_line = false;
    std::fprintf(stderr, "%s\n", text.c_str());
    std::fflush(stderr);
  }
};

}  // namespace

TrainResult train(const TrainOptions& o) {
  check_options(o);
  const int D = o.mesh.axis_size(o.data_axis), TP = o.mesh.axis_size(o.tensor_axis);
  const std::string expert_axis = o.expert_axis.empty() ? o.data_axis : o.expert_axis;
  const int B = o.batch_size, T = o.seq_len;

  // Where the weights come from: the checkpoint we resume, init_from, or random.
  std::shared_ptr<const model::WeightSource> source = o.init;
  std::shared_ptr<model::SafetensorsFile> resume_file;
  int64_t start_step = 0;
  if (o.resume) {
    const std::string path = latest_checkpoint(o.out_dir);
    if (!std::filesystem::exists(path)) throw std::runtime_error(path + ": no checkpoint to resume from");
    resume_file = std::make_shared<model::SafetensorsFile>(path);
    start_step = resume_step(*resume_file);
    require_same_model(*resume_file, o.model);
    source = resume_file;
  }
  if (!source) source = std::make_shared<model::TensorWeights>(model::random_weights(o.model, o.seed));

  // Device 0 alone writes the run's files (over ZeroMQ the other processes share its out_dir, and
  // resume reads it there), once the backend has started: processes that fail to meet write nothing.
  std::ofstream metrics;
  Progress progress;
  auto open_metrics = [&] {
    if (o.out_dir.empty()) return;
    std::filesystem::create_directories(o.out_dir);
    const std::string checkpoint = latest_checkpoint(o.out_dir);
    if (model::remove_stale_temporary(checkpoint))
      progress.message("removed " + model::temporary_path(checkpoint) + ", left by a save that was killed");
    const auto metrics_path = std::filesystem::path(o.out_dir) / "metrics.jsonl";
    if (o.resume) truncate_metrics(metrics_path, start_step);
    metrics.open(metrics_path, o.resume ? std::ios::app : std::ios::trunc);
    if (!metrics) throw std::runtime_error(o.out_dir + "/metrics.jsonl: cannot open for writing");
  };

  BatchSampler train_batches(o.corpus->train, B, T, o.shuffle, o.seed);
  std::optional<BatchSampler> val_batches;
  if (o.eval_batches > 0) val_batches.emplace(o.corpus->val, B, T, false, o.seed);

  TrainResult result;
  result.start_step = start_step;
  result.end_step = start_step;
  std::mutex result_mutex;
  const auto t0 = Clock::now();

  dist::RunOptions run_options;
  run_options.seed = o.seed;
  run_options.blas_threads = o.blas_threads;
  run_options.make_backend = o.make_backend;
  run_options.local_ranks = o.local_ranks;
  run_options.trace = o.trace;
  dist::run_on_mesh(o.mesh, [&](dist::Device& dev) {
    dist::Group& data = dev.axis(o.data_axis);
    dist::Group& tp = dev.axis(o.tensor_axis);
    dist::Group& world = dev.world();
    const bool writer = dev.rank() == 0;
    if (writer) open_metrics();
    ParallelAxes axes{&data, &world, D, TP, o.mesh.axis_size(expert_axis), expert_axis == o.data_axis};
    if (resume_file && !o.local_ranks.empty()) {
      // Over ZeroMQ every process read the checkpoint on its own: they must resume the same step.
      float steps[2] = {static_cast<float>(start_step), -static_cast<float>(start_step)};  // max, -min
      world.all_max(std::span<float>(steps, 2));
      if (steps[0] != -steps[1])
        throw std::runtime_error(latest_checkpoint(o.out_dir) + ": the processes resume from different steps (" +
                                 std::to_string(static_cast<int64_t>(-steps[1])) + " to " +
                                 std::to_string(static_cast<int64_t>(steps[0])) +
                                 "): every process must read the same checkpoint (one shared out_dir)");
    }

    dist::Group& experts = dev.axis(expert_axis);  // MoE: the experts are dealt out over it (nn/moe.h)
    model::Llama llama(*source, tp, experts);
    std::vector<Slot> slots = make_slots(llama, o.model, axes, tp.rank());
    std::vector<int64_t> sizes;
    for (const Slot& s : slots) sizes.push_back(static_cast<int64_t>(s.value.size()));
    AdamW adam(o.adamw, sizes);
    {
      auto params = llama.parameters();  // moments take the parameters' local shapes (for gathers)
      for (size_t i = 0; i < params.size(); ++i) {
        adam.exp_avg()[i].reshape(params[i].value->shape());
        adam.exp_avg_sq()[i].reshape(params[i].value->shape());
      }
    }
    if (resume_file) {
      load_moments(*resume_file, o.model, tp, experts, EXP_AVG_PREFIX, adam.exp_avg());
      load_moments(*resume_file, o.model, tp, experts, EXP_AVG_SQ_PREFIX, adam.exp_avg_sq());
      adam.set_steps(start_step);
    }

    const RowRange rows = data_rows(B, D, data.rank());
    const int local_rows = rows.end - rows.begin;
    std::vector<int> inputs(static_cast<size_t>(local_rows * T)), targets(inputs.size());  // (B_local, T)

    auto evaluate = [&]() {
      dist::TraceSpan span(dev.trace(), dev.rank(), "evaluate");
      double sum = 0;
      for (int k = 0; k < o.eval_batches; ++k) {
        val_batches->fill(k, rows.begin, rows.end, inputs, targets);
        sum += llama.loss(inputs, targets, local_rows, T);
      }
      auto mean = static_cast<float>(sum / o.eval_batches);
      data.mean(std::span<float>(&mean, 1));
      return static_cast<double>(mean);
    };
    std::string kept_checkpoint;  // what a diverged run leaves on disk
    if (resume_file) kept_checkpoint = resume_file->path() + " (step " + std::to_string(start_step) + ")";
    auto save = [&](int64_t step) {
      if (o.out_dir.empty()) return;
      dist::TraceSpan span(dev.trace(), dev.rank(), "checkpoint");
      const std::string path = latest_checkpoint(o.out_dir);
      save_checkpoint(llama, adam, {path, step, &o}, writer);
      kept_checkpoint = path + " (step " + std::to_string(step) + ")";
      if (writer) {
        std::lock_guard lock(result_mutex);
        result.checkpoint = path;
      }
    };

    auto run_start = Clock::now();
    auto last = run_start;
    int64_t step = start_step;
    bool saved_at_end = false;
    for (; step < o.steps; ++step) {
      float stop = o.stop && o.stop->load() ? 1.0f : 0.0f;
      world.all_max(std::span<float>(&stop, 1));  // every device stops at the same step
      if (stop > 0) {
        result.interrupted = true;
        break;
      }
      train_batches.fill(step, rows.begin, rows.end, inputs, targets);
      std::optional<dist::TraceSpan> span(std::in_place, dev.trace(), dev.rank(), "gradients");
      const double loss = data_parallel_gradients(llama, axes, inputs, targets, local_rows, T);
      span.emplace(dev.trace(), dev.rank(), "optimizer");
      // A non-finite loss rides in the norm's all_sum, so every device sees it and stops together.
      float sq = static_cast<float>(local_grad_sq(slots)) + (std::isfinite(loss) ? 0.0f : NAN);
      world.all_sum(std::span<float>(&sq, 1));
      const double norm = std::sqrt(static_cast<double>(sq));
      if (!std::isfinite(norm)) throw_diverged(step + 1, loss, norm, kept_checkpoint);
      clip_grads(slots, norm, o.grad_clip);
      const double lr = o.schedule.at(step);
      adam.step(slots, lr);
      span.reset();

      StepRecord rec{step + 1, loss, lr, norm, 0, std::nullopt};
      for (const nn::MoeStats& m : llama.moe_stats()) {  // before evaluate() routes other tokens
        rec.expert_tokens.push_back(m.tokens_per_expert);
        rec.moe_bytes_sent += m.bytes_sent;
        rec.moe_dropped += m.dropped;
      }
      const bool last_step = step + 1 == o.steps;
      const bool eval_now = val_batches && ((o.eval_every > 0 && (step + 1) % o.eval_every == 0) || last_step);
      if (eval_now) rec.val_loss = evaluate();
      const auto now = Clock::now();
      const double dt = std::chrono::duration<double>(now - last).count();
      last = now;
      rec.tokens_per_s = dt > 0 ? static_cast<double>(B) * T / dt : 0;
      if (writer) {
        result.records.push_back(rec);
        if (metrics) metrics << metrics_line(rec) << std::flush;
        if (o.on_step) o.on_step(step, loss);
        if (o.progress) {
          const double elapsed = std::chrono::duration<double>(now - run_start).count();
          const double done = static_cast<double>(step + 1 - start_step);
          const double rate = done * B * T / std::max(elapsed, 1e-9);
          char buf[256];
          std::snprintf(buf, sizeof buf, "step %lld/%lld | loss %.4f | lr %.2e | %.0f tok/s | ETA %s",
                        static_cast<long long>(step + 1), static_cast<long long>(o.steps), loss, lr, rate,
                        format_duration(elapsed / done * static_cast<double>(o.steps - step - 1)).c_str());
          if (!rec.expert_tokens.empty()) {  // MoE: the busiest expert's load over an even share
            double worst = 0;
            for (const auto& counts : rec.expert_tokens) {
              int64_t total = 0, most = 0;
              for (int64_t c : counts) total += c, most = std::max(most, c);
              if (total > 0) worst = std::max(worst, static_cast<double>(most) * counts.size() / total);
            }
            std::snprintf(buf + std::strlen(buf), sizeof buf - std::strlen(buf), " | expert load max %.2fx even",
                          worst);
          }
          if (rec.val_loss) {
            std::snprintf(buf + std::strlen(buf), sizeof buf - std::strlen(buf), " | val %.4f", *rec.val_loss);
            progress.keep(buf);
          } else if (progress.tty || (o.log_every > 0 && (step + 1) % o.log_every == 0) || step == start_step) {
            progress.line(buf);
          }
        }
      }
      const bool save_now = o.save_every ? ((step + 1) % *o.save_every == 0) : eval_now;
      if (save_now || last_step) {
        save(step + 1);
        saved_at_end = last_step;
      }
    }
    if (!saved_at_end) save(step);  // interrupted (or resumed at the end): keep what we have
    if (writer) {
      result.end_step = step;
      if (o.progress && result.interrupted)
        progress.message("interrupted: stopped after step " + std::to_string(step) + ", checkpoint saved");
    }

    // A sample from the trained model, on data rank 0's tensor group. With experts spread over an
    // expert group (MoE), every decode step would be a collective over it: data rank 0 samples from
    // a copy that holds every expert (gather_weights is a collective, so every device calls it).
    std::optional<model::Llama> all_experts;
    if (o.sample_tokens > 0 && experts.size() > 1) {
      model::TensorWeights full = llama.gather_weights();
      if (data.rank() == 0) all_experts.emplace(full, tp);
    }
    model::Llama& sampler = all_experts ? *all_experts : llama;
    if (o.sample_tokens > 0 && data.rank() == 0) {
      auto forward = [&](int token, int pos) -> std::span<const float> { return sampler.forward(token, pos); };
      const int steps = std::min(o.sample_tokens + 1, o.model.seq_len);
      std::string text;
      if (o.tokenizer->kind() == TokenizerKind::Llama2c) {
        model::GenerateOptions g;
        g.prompt = "";
        g.steps = steps;
        g.temperature = 0.8f;
        g.topp = 0.9f;
        g.seed = o.seed;
        text = model::generate(forward, *o.tokenizer->bpe(), model::normalized(g, o.model.seq_len), nullptr).text;
      } else {
        text = generate_text(forward, *o.tokenizer, "", steps, o.model.seq_len, 0.8f, 0.9f, o.seed, nullptr).text;
      }
      if (writer) result.sample = text;
    }
  }, run_options);
  if (progress.open_line) progress.message("");
  result.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return result;
}

}  // namespace tpcli::train

#include "train/loop.h"

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <optional>
#include <stdexcept>

#include "distributed/runtime.h"
#include "distributed/trace.h"
#include "files/atomic_file.h"
#include "formats/safetensors.h"
#include "model/llama.h"
#include "model/packed_weights.h"
#include "model/random_init.h"
#include "model/shard_plan.h"
#include "model/trainable_llama.h"
#include "train/checkpoint.h"
#include "train/checkpoint_io.h"
#include "train/loss_guard.h"
#include "train/loss_plot.h"
#include "train/metrics.h"
#include "train/sample.h"

namespace tpcli::train {

using Clock = std::chrono::steady_clock;

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
  if (o.grad_accum < 1) fail("train.grad_accum = " + std::to_string(o.grad_accum) + " must be >= 1");
  if (o.bucket_elems < 1) fail("train.bucket_kb must be >= 1");
  // Token positions of a step are ints (train/data.h); a step is K * batch_size rows of seq_len.
  if (int64_t{o.batch_size} * o.grad_accum * std::max(o.seq_len, 1) > (int64_t{1} << 30))
    fail("train.batch_size x train.grad_accum = " + std::to_string(int64_t{o.batch_size} * o.grad_accum) +
         " rows of seq_len " + std::to_string(o.seq_len) + " per step: more than 2^30 tokens");
  if (o.batch_size % D != 0)
    fail("mesh axis " + o.data_axis + " = " + std::to_string(D) + " does not divide train.batch_size = " +
         std::to_string(o.batch_size));
  if (o.seq_len < 1 || o.seq_len > o.model.seq_len)
    fail("train.seq_len = " + std::to_string(o.seq_len) + " must be in [1, model seq_len = " +
         std::to_string(o.model.seq_len) + "]");
  if (o.steps < 1) fail("train.steps = " + std::to_string(o.steps) + " must be >= 1");
  if (!o.tokenizer || (!o.sft && (!o.corpus || !o.corpus->train)))
    fail("training needs a corpus and its tokenizer (data.path)");
  if (o.sft) {
    if (!o.sft->train || o.sft->train->empty()) fail("training needs examples (data.path)");
    if (o.eval_batches > 0 && (!o.sft->val || o.sft->val->empty()))
      fail("fine-tuning evaluates on data.val_path: set it or set train.eval_batches = 0");
  }
  if (o.tokenizer->vocab_size() > o.model.vocab_size)
    fail("the tokenizer has " + std::to_string(o.tokenizer->vocab_size()) + " tokens but model vocab_size = " +
         std::to_string(o.model.vocab_size));
  // One window is seq_len + 1 tokens (train/data.h).
  if (!o.sft && o.corpus->train->size() < int64_t{o.seq_len} + 1)
    fail("the training split holds " + std::to_string(o.corpus->train->size()) + " tokens: too few for seq_len = " +
         std::to_string(o.seq_len) + " (needs seq_len + 1; lower train.seq_len or use a longer corpus)");
  if (!o.sft && o.eval_batches > 0 && (!o.corpus->val || o.corpus->val->size() < int64_t{o.seq_len} + 1))
    fail("the validation split holds " + std::to_string(o.corpus->val ? o.corpus->val->size() : 0) + " tokens: too few for seq_len = " +
         std::to_string(o.seq_len) + " (set train.eval_batches = 0 or use a longer corpus)");
  if (o.init && !(o.init->config().dim == o.model.dim && o.init->config().n_layers == o.model.n_layers &&
                  o.init->config().vocab_size == o.model.vocab_size))
    fail("model.init_from has a different shape than the [model] section");
  if (o.resume && o.out_dir.empty()) fail("--resume needs train.out_dir");
  if (o.lora && o.sequence_parallel) fail("train.lora: mesh.sequence_parallel = true is not supported with LoRA yet");
  if (o.sequence_parallel && o.model.is_moe())
    fail("mesh.sequence_parallel = true is not supported with a MoE model (model.n_experts = " +
         std::to_string(o.model.n_experts) + ")");
  if (o.sequence_parallel && o.seq_len % TP != 0)
    fail("mesh.sequence_parallel = true needs train.seq_len = " + std::to_string(o.seq_len) +
         " divisible by the tensor axis '" + o.tensor_axis + "' = " + std::to_string(TP));
}

bool is_writer_process(const TrainOptions& o) {
  const std::vector<int>& local = o.run.local_ranks;
  return local.empty() || std::find(local.begin(), local.end(), 0) != local.end();
}

// QLoRA: the base as stored, the format of its first packed matrix and every matrix stored otherwise.
static void set_base_formats(const model::WeightSource& base, MemoryLayout& m) {
  std::map<std::string, tensor::WeightFormat> formats;
  for (const auto& spec : model::llama_parameters(base.config()))
    if (spec.shape.size() == 2) {
      const tensor::WeightFormat f = model::stored_format(base, spec.name);
      if (!m.packed_base && f.kind != tensor::WeightKind::F32) m.packed_base = f;
      formats.emplace(spec.name, f);
    }
  if (!m.packed_base) return;
  for (const auto& [name, f] : formats)
    if (f != *m.packed_base) m.base_formats.emplace(name, f);
}

MemoryLayout memory_layout(const TrainOptions& o) {
  const std::string expert_axis = o.expert_axis.empty() ? o.data_axis : o.expert_axis;
  MemoryLayout m;
  m.data = o.mesh.axis_size(o.data_axis);
  m.tensor = o.mesh.axis_size(o.tensor_axis);
  m.expert_group = o.mesh.axis_size(expert_axis);
  m.experts_on_data_axis = expert_axis == o.data_axis;
  m.rows = o.batch_size / m.data;
  m.seq_len = o.seq_len;
  m.recompute = o.recompute;
  m.sequence_parallel = o.sequence_parallel;
  m.shard_optimizer = o.shard_optimizer;
  m.bucket_elems = o.bucket_elems;
  m.lora = o.lora;
  if (o.lora && o.init) set_base_formats(*o.init, m);
  return m;
}

DeviceBytes run_device_bytes(const TrainOptions& o) { return device_bytes(o.model, memory_layout(o)); }

// One line for a run that stops because its weights went bad: what was seen, what was done about
// it, and the checkpoint the user can resume from (`kept`: DeviceRun::kept_text()).
[[noreturn]] static void throw_diverged(const std::string& what, const std::string& done, const std::string& kept) {
  throw std::runtime_error("training diverged " + what + " (" + done + "; " + kept +
                           "; lower train.lr or raise train.warmup_steps)");
}

// ---- the loop ----

namespace {

// ", LoRA: optimizer state 1.2% of a full fine-tune's" (empty without LoRA).
std::string lora_note_of(const TrainOptions& o) {
  if (!o.lora) return "";
  MemoryLayout full = memory_layout(o);
  full.lora.reset();
  const double share = 100.0 * static_cast<double>(run_device_bytes(o).optimizer) /
                       static_cast<double>(device_bytes(o.model, full).optimizer);
  char text[96];
  std::snprintf(text, sizeof text, "; LoRA: optimizer state %.2f%% of a full fine-tune's", share);
  return text;
}

// "memory per device (device 0): parameters ..." as the run starts (train/memory.h).
std::string memory_line_of(const TrainOptions& o) {
  return "memory per device (device 0): " + describe(run_device_bytes(o)) + (o.recompute ? " (recompute)" : "") +
         (o.shard_optimizer ? " (optimizer sharded)" : "") + (o.sequence_parallel ? " (sequence parallel)" : "") +
         lora_note_of(o);
}

// What the devices of one train() call share: the options, the weights they start from, the
// batches, and (device 0 only) the files and the result.
struct RunShared {
  const TrainOptions& o;
  std::shared_ptr<const model::WeightSource> source;
  std::shared_ptr<formats::SafetensorsFile> resume_file;
  // The last local device to finish reading `source` frees its conversions (a Hugging Face
  // directory's dequantized or 16-bit weights in f32, q/k rows reordered) and file pages: each
  // device holds copies of its shards, so they would otherwise double the base for the whole run.
  std::optional<model::DevicesBuilding> building;
  std::string memory_line;  // read from the base's stored formats before `building` releases them
  int64_t start_step = 0;
  std::shared_ptr<const StepBatches> train_batches, val_batches;
  MetricsLog metrics;
  Progress progress;
  TrainResult result;
  std::mutex result_mutex;
  Clock::time_point t0 = Clock::now();

  explicit RunShared(const TrainOptions& options);
  // Device 0 alone writes the run's files (over ZeroMQ the other processes share its out_dir, and
  // resume reads it there), once the backend has started: processes that fail to meet write nothing.
  void open_files();
};

RunShared::RunShared(const TrainOptions& options) : o(options) {
  // Where the weights come from: the checkpoint we resume, init_from, or random.
  source = o.init;
  if (o.resume) {
    const std::string path = latest_checkpoint(o.out_dir);
    if (!std::filesystem::exists(path)) throw std::runtime_error(path + ": no checkpoint to resume from");
    resume_file = std::make_shared<formats::SafetensorsFile>(path);
    start_step = resume_step(*resume_file);
    require_same_model(*resume_file, o.model, o.lora);
    if (!o.lora) source = resume_file;  // LoRA: the base is init's again, the adapters are the checkpoint's
  }
  if (!source) source = std::make_shared<model::TensorWeights>(model::random_weights(o.model, o.seed));
  if (o.progress) memory_line = memory_line_of(o);
  building.emplace(*source, o.run.local_ranks.empty() ? o.mesh.size() : static_cast<int>(o.run.local_ranks.size()));
  // A step takes K micro-batches: the rows of one batch K times as large (train/step.h).
  const int B = o.batch_size * o.grad_accum;
  if (o.sft) {
    // Sequence parallel splits a step's T over the tensor axis: T a multiple of it.
    const int multiple = o.sequence_parallel ? o.mesh.axis_size(o.tensor_axis) : 1;
    train_batches = std::make_shared<LengthBatches>(o.sft->train, B, o.seq_len, o.shuffle, o.seed, o.sft->pad_token, multiple);
    if (o.eval_batches > 0)
      val_batches = std::make_shared<LengthBatches>(o.sft->val, o.batch_size, o.seq_len, false, o.seed, o.sft->pad_token, multiple);
  } else {
    train_batches = std::make_shared<BatchSampler>(o.corpus->train, B, o.seq_len, o.shuffle, o.seed);
    if (o.eval_batches > 0) val_batches = std::make_shared<BatchSampler>(o.corpus->val, o.batch_size, o.seq_len, false, o.seed);
  }
  result.start_step = result.end_step = start_step;
}

void RunShared::open_files() {
  if (o.out_dir.empty()) return;
  std::filesystem::create_directories(o.out_dir);
  const std::string checkpoint = latest_checkpoint(o.out_dir);
  if (files::remove_stale_temporary(checkpoint))
    progress.message("removed " + files::temporary_path(checkpoint) + ", left by a save that was killed");
  if (o.lora && resume_file) rewrite_peft_adapter(*resume_file, o);  // adapter/ may lag a killed save
  metrics.open(o.out_dir, o.resume, start_step);
}

// What one step's gradients say about the weights they were taken at (before its update).
struct StepGradients {
  double loss = 0;  // mean over the step's K global batches
  double norm = 0;  // global gradient norm, the same on every device; non-finite when any loss is
};

// One device's whole run (SPMD: every device runs the same calls, so collectives pair up).
class DeviceRun {
 public:
  DeviceRun(RunShared& shared, dist::Device& dev);
  void run();

 private:
  void check_same_resume_step();
  StepGradients gradients(int64_t step);
  StepRecord optimizer_step(int64_t step);
  std::string agreed_unsound(const StepGradients& next);
  void save_if_sound(int64_t step, const StepGradients& next);
  void save_final(int64_t step);
  std::string kept_text() const;
  double evaluate();
  void save(int64_t step);
  void note_kept(int64_t step);
  void report(const StepRecord& rec, int64_t step, Clock::time_point run_start);
  void sample();

  RunShared& s_;
  const TrainOptions& o_;
  dist::Device& dev_;
  dist::Group& data_;
  dist::Group& tp_;
  dist::Group& experts_;  // MoE: the experts are dealt out over it (nn/moe.h)
  const bool writer_;
  ParallelAxes axes_;
  model::TrainableLlama llama_;
  DataParallelOptimizer optimizer_;
  RowRange rows_;  // this data rank's rows of the K-times batch
  std::vector<int> inputs_, targets_;  // (B_local, T) scratch
  LossGuard loss_guard_;               // judges the weights before a checkpoint takes them
  bool save_due_ = false;              // a checkpoint of the weights now in the model, once the next step's gradients vouch for them
  int64_t kept_step_ = -1;             // the step of out_dir/latest.safetensors (-1: none from this run or its resume)
};

std::string expert_axis_of(const TrainOptions& o) { return o.expert_axis.empty() ? o.data_axis : o.expert_axis; }

// This device's model: the source's weights, and with LoRA the resumed checkpoint's adapters.
model::TrainableLlama build_model(const RunShared& s, dist::Group& tensor_group, dist::Group& expert_group) {
  model::TrainableLlama llama(*s.source, tensor_group, expert_group, s.o.lora);
  if (s.o.lora && s.resume_file) llama.load_parameters(*s.resume_file);
  else if (s.o.lora && s.o.lora_init) llama.load_parameters(*s.o.lora_init);
  return llama;
}

DeviceRun::DeviceRun(RunShared& shared, dist::Device& dev)
    : s_(shared),
      o_(shared.o),
      dev_(dev),
      data_(dev.axis(o_.data_axis)),
      tp_(dev.axis(o_.tensor_axis)),
      experts_(dev.axis(expert_axis_of(o_))),
      writer_(dev.rank() == 0),
      axes_{&data_, &dev.world(), data_.size(), tp_.size(), experts_.size(), expert_axis_of(o_) == o_.data_axis},
      llama_(build_model(shared, tp_, experts_)),
      optimizer_(llama_, axes_, tp_.rank(), o_.adamw, o_.shard_optimizer, o_.bucket_elems),
      rows_(data_rows(o_.batch_size * o_.grad_accum, data_.size(), data_.rank())),
      loss_guard_(o_.model.vocab_size) {
  llama_.set_recompute(o_.recompute);
  llama_.set_sequence_parallel(o_.sequence_parallel);
  if (s_.resume_file) {
    check_same_resume_step();
    for (int k = 0; k < 2; ++k) {
      const char* prefix = k == 0 ? EXP_AVG_PREFIX : EXP_AVG_SQ_PREFIX;
      optimizer_.set_moments(k, llama_.lora() ? llama_.local_parts(*s_.resume_file, prefix)
                                              : load_moments(*s_.resume_file, o_.model, tp_, experts_, prefix));
    }
    optimizer_.set_steps(s_.start_step);
    kept_step_ = s_.start_step;
  }
  s_.building->built();
}

// Over ZeroMQ every process read the checkpoint on its own: they must resume the same step.
void DeviceRun::check_same_resume_step() {
  if (o_.run.local_ranks.empty()) return;
  const auto start = static_cast<int32_t>(s_.start_step);
  int32_t steps[2] = {start, -start};  // max, -min
  dev_.world().all_max(std::span<int32_t>(steps, 2));
  if (steps[0] != -steps[1])
    throw std::runtime_error(latest_checkpoint(o_.out_dir) + ": the processes resume from different steps (" +
                             std::to_string(static_cast<int64_t>(-steps[1])) + " to " +
                             std::to_string(static_cast<int64_t>(steps[0])) +
                             "): every process must read the same checkpoint (one shared out_dir)");
}

StepGradients DeviceRun::gradients(int64_t step) {
  std::optional<dist::TraceSpan> span(std::in_place, dev_.trace(), dev_.rank(), "gradients");
  GradientExchange exchange(optimizer_, o_.grad_accum, o_.overlap_buckets);
  auto loss = static_cast<float>(accumulate_gradients(llama_, *s_.train_batches, step, rows_, o_.grad_accum, inputs_,
                                                      targets_, [&](int64_t end) { exchange.gradients_ready(end); }));
  span.emplace(dev_.trace(), dev_.rank(), "data-parallel mean");
  exchange.finish();
  data_.mean(std::span<float>(&loss, 1));
  span.emplace(dev_.trace(), dev_.rank(), "gradient norm");
  // A non-finite loss rides in the norm's all_sum, so every device sees it and stops together.
  return {loss, optimizer_.global_grad_norm(std::isfinite(loss))};
}

StepRecord DeviceRun::optimizer_step(int64_t step) {
  const StepGradients g = gradients(step);
  if (save_due_) save_if_sound(step, g);
  if (!std::isfinite(g.norm))
    throw_diverged("at step " + std::to_string(step + 1) + ": " + loss_guard_.unsound(g.loss, g.norm),
                   "stopped before the update", kept_text());
  loss_guard_.add(g.loss);
  dist::TraceSpan span(dev_.trace(), dev_.rank(), "optimizer");
  optimizer_.clip(g.norm, o_.grad_clip);
  const double lr = o_.schedule.at(step);
  optimizer_.step(lr);
  StepRecord rec{step + 1, g.loss, lr, g.norm, 0, std::nullopt};
  for (const nn::MoeStats& m : llama_.moe_stats()) {  // before evaluate() routes other tokens
    rec.expert_tokens.push_back(m.tokens_per_expert);
    rec.moe_bytes_sent += m.bytes_sent;
    rec.moe_dropped += m.dropped;
  }
  return rec;
}

// Why the weights that gave `next` are unsound (train/loss_guard.h), "" when sound. Collective
// over the world: each device judges its own copy of the loss and any doubt wins, so every device
// saves, or skips, the same checkpoint.
std::string DeviceRun::agreed_unsound(const StepGradients& next) {
  std::string why = loss_guard_.unsound(next.loss, next.norm);
  int32_t unsound = why.empty() ? 0 : 1;
  dev_.world().all_max(std::span<int32_t>(&unsound, 1));
  if (unsound > 0 && why.empty()) why = "another device found them unsound";
  return why;
}

// The weights of `step` completed steps are still in the model (step + 1's update has not run):
// they replace latest.safetensors only when step + 1's loss and gradient norm vouch for them, so a
// diverging run never destroys its last good checkpoint.
void DeviceRun::save_if_sound(int64_t step, const StepGradients& next) {
  save_due_ = false;
  const std::string why = agreed_unsound(next);
  if (why.empty()) {
    save(step);
    return;
  }
  // A non-finite norm stops the run next, and its error says the same.
  if (writer_ && std::isfinite(next.norm))
    s_.progress.message("step " + std::to_string(step + 1) + ": " + why + ": the weights of step " +
                        std::to_string(step) + " are not saved; " + kept_text());
}

// The end of the run (last step, interrupted, or resumed at the end): no next step will vouch for
// the final weights, so one more step's gradients are taken (and not applied) to judge them.
void DeviceRun::save_final(int64_t step) {
  if (o_.out_dir.empty()) return;
  if (step == kept_step_) {  // resumed at the end: the checkpoint holds these weights already
    note_kept(step);
    return;
  }
  const std::string why = agreed_unsound(gradients(step));
  if (!why.empty())
    throw_diverged("by step " + std::to_string(step) + ": on the next batch its weights give " + why,
                   "they are not saved", kept_text());
  save(step);
}

// Where the user can pick up a diverged run.
std::string DeviceRun::kept_text() const {
  if (kept_step_ < 0) return "no checkpoint was written";
  const std::string step = std::to_string(kept_step_);
  return latest_checkpoint(o_.out_dir) + " (step " + step + ") is kept: --resume continues from step " + step;
}

double DeviceRun::evaluate() {
  dist::TraceSpan span(dev_.trace(), dev_.rank(), "evaluate");
  const RowRange rows = data_rows(o_.batch_size, data_.size(), data_.rank());
  const int local_rows = rows.end - rows.begin;
  // Counted targets (fine-tuning): the mean over those of all eval_batches batches of every data
  // rank, each batch's loss its sum over D / (the total count) (train/step.h).
  std::optional<double> divisor;
  if (s_.val_batches->counted_targets(0)) {
    int64_t counted = 0;
    for (int k = 0; k < o_.eval_batches; ++k) counted += *s_.val_batches->counted_targets(k);
    divisor = static_cast<double>(std::max<int64_t>(counted, 1)) / data_.size();
  }
  double sum = 0;
  for (int k = 0; k < o_.eval_batches; ++k) {
    const int T = s_.val_batches->step_len(k);
    inputs_.resize(static_cast<size_t>(local_rows) * T);
    targets_.resize(inputs_.size());
    s_.val_batches->fill(k, rows.begin, rows.end, inputs_, targets_);
    sum += llama_.loss(inputs_, targets_, local_rows, T, divisor);
  }
  auto mean = static_cast<float>(divisor ? sum : sum / o_.eval_batches);
  data_.mean(std::span<float>(&mean, 1));
  return static_cast<double>(mean);
}

void DeviceRun::save(int64_t step) {
  if (o_.out_dir.empty()) return;
  dist::TraceSpan span(dev_.trace(), dev_.rank(), "checkpoint");
  const std::string path = latest_checkpoint(o_.out_dir);
  save_checkpoint(llama_, optimizer_, {path, step, &o_}, writer_);
  note_kept(step);
}

// out_dir/latest.safetensors holds the weights of `step`.
void DeviceRun::note_kept(int64_t step) {
  kept_step_ = step;
  if (writer_) {
    std::lock_guard lock(s_.result_mutex);
    s_.result.checkpoint = latest_checkpoint(o_.out_dir);
  }
}

// Device 0: the record, metrics.jsonl and the progress line.
void DeviceRun::report(const StepRecord& rec, int64_t step, Clock::time_point run_start) {
  s_.result.records.push_back(rec);
  s_.metrics.append(rec);
  if (!o_.out_dir.empty() && (rec.val_loss || step + 1 == o_.steps)) refresh_loss_plot(o_.out_dir);  // beside metrics.jsonl
  if (o_.on_step) o_.on_step(step, rec.loss);
  if (!o_.progress) return;
  const double elapsed = std::chrono::duration<double>(Clock::now() - run_start).count();
  const double done = static_cast<double>(step + 1 - s_.start_step);
  const double rate = done * o_.batch_size * o_.grad_accum * o_.seq_len / std::max(elapsed, 1e-9);
  const std::string text = progress_text(rec, o_.steps, rate, elapsed / done * static_cast<double>(o_.steps - step - 1));
  if (rec.val_loss)
    s_.progress.keep(text);
  else if (s_.progress.tty || (o_.log_every > 0 && (step + 1) % o_.log_every == 0) || step == s_.start_step)
    s_.progress.line(text);
}

void DeviceRun::run() {
  if (writer_) {
    s_.open_files();
    if (o_.progress) s_.progress.message(s_.memory_line);
  }
  const auto run_start = Clock::now();
  auto last = run_start;
  int64_t step = s_.start_step;
  for (; step < o_.steps; ++step) {
    int32_t stop = o_.run.stop && o_.run.stop->load() ? 1 : 0;
    dev_.world().all_max(std::span<int32_t>(&stop, 1));  // every device stops at the same step
    if (stop > 0) {
      s_.result.interrupted = true;
      break;
    }
    StepRecord rec = optimizer_step(step);
    const bool last_step = step + 1 == o_.steps;
    const bool eval_now = s_.val_batches && ((o_.eval_every > 0 && (step + 1) % o_.eval_every == 0) || last_step);
    if (eval_now) rec.val_loss = evaluate();
    const auto now = Clock::now();
    const double dt = std::chrono::duration<double>(now - last).count();
    last = now;
    // Positions the step ran (fine-tuning batches are as long as their longest example, padding included).
    const double tokens = static_cast<double>(o_.batch_size) * o_.grad_accum * s_.train_batches->step_len(step);
    rec.tokens_per_s = dt > 0 ? tokens / dt : 0;
    if (writer_) report(rec, step, run_start);
    const bool save_now = o_.save_every ? ((step + 1) % *o_.save_every == 0) : eval_now;
    save_due_ = !o_.out_dir.empty() && save_now && !last_step;  // saved by the next step's gradients
  }
  save_final(step);  // the last step, interrupted, or resumed at the end: keep what we have
  if (writer_) {
    s_.result.end_step = step;
    if (o_.progress && s_.result.interrupted)
      s_.progress.message("interrupted: stopped after step " + std::to_string(step) + ", checkpoint saved");
  }
  sample();
}

// A sample from the trained model, on data rank 0's tensor group, by the inference model built
// from the gathered weights (gather_weights is a collective, so every device calls it). It holds
// every expert of a MoE model, so a decode step is no collective over the expert group.
void DeviceRun::sample() {
  if (o_.sample_tokens <= 0 || llama_.lora()) return;  // LoRA: gather_weights holds the adapters alone
  const model::TensorWeights full = llama_.gather_weights();
  if (data_.rank() != 0) return;
  model::Llama sampler(full, tp_);
  engine::ModelFns fns;  // generation runs a batch engine over it
  fns.llama = &sampler;
  const int steps = std::min(o_.sample_tokens + 1, o_.model.seq_len);
  std::string text;
  if (o_.tokenizer->kind() == TokenizerKind::Llama2c) {
    engine::GenerateOptions g;
    g.prompt = "";
    g.steps = steps;
    g.temperature = 0.8f;
    g.topp = 0.9f;
    g.seed = o_.seed;
    text = engine::generate(fns, *o_.tokenizer->bpe(), engine::normalized(g, o_.model.seq_len), nullptr).text;
  } else {
    text = generate_text(fns, *o_.tokenizer, "", steps, o_.model.seq_len, 0.8f, 0.9f, o_.seed, nullptr).text;
  }
  if (writer_) s_.result.sample = text;
}

}  // namespace

TrainResult train(const TrainOptions& o) {
  check_options(o);
  RunShared shared(o);
  dist::RunOptions run = o.run;  // run.stop also ends a collective wait that would hold the step forever
  run.seed = o.seed;
  dist::run_on_mesh(o.mesh, [&](dist::Device& dev) { DeviceRun(shared, dev).run(); }, run);
  if (shared.progress.open_line) shared.progress.message("");
  shared.result.seconds = std::chrono::duration<double>(Clock::now() - shared.t0).count();
  return std::move(shared.result);
}

}  // namespace tpcli::train

// tpcli::train — the training loop: data parallelism over one mesh axis, tensor parallelism over
// another, both at once.
//
// Dimension legend: B global batch rows, B_local = B / D rows of this data rank, D data ranks,
// TP tensor-parallel devices, T tokens per row.
//
// Every device runs the same body (SPMD):
//   build its Llama shard (random init from the seed, init_from, or the checkpoint it resumes)
//   each step s:
//     all_max(stop flag) over the world          every device agrees on the step it stops at
//     rows [d*KB/D, (d+1)*KB/D) of batch s       (train/data.h: a pure function of s), in K
//                                                micro-batches of B/D rows (train/step.h)
//     forward_backward per micro-batch -> local grads (tensor collectives inside the model)
//     pmean grads over the data axis, per bucket, in place (train/data_parallel_optimizer.h;
//                                                started during the last backward; sharded:
//                                                reduce_scatter, AdamW on this rank's chunk,
//                                                all_gather of the values)
//     global norm: all_sum over the world of each device's weighted sum of squares
//     clip, AdamW with lr(s)
//   every eval_every steps: validation loss (pmean over the data axis); checkpoint, written once
//                                                the next step's loss and gradient norm vouch
//                                                for the weights (train/loss_guard.h)
// The loss of step s is the mean cross-entropy over all K*B*T targets of that step, before the update
// (supervised fine-tuning: over the step's counted targets, train/step.h).
//
// Files: loop.cpp (options, the per-device run), step.cpp (gradients of a step),
// data_parallel_optimizer.cpp (data-parallel reduction, norm, AdamW, ZeRO-1), param_table.cpp
// (the parameter table and buckets), checkpoint_io.cpp (gathering and slicing checkpoints),
// metrics.cpp (metrics.jsonl and the progress line), memory.cpp (bytes per device).
//
// Over the ZeroMQ backend (run.make_backend, run.local_ranks) each process runs its own devices; the one
// hosting device 0 is the run's only writer (out_dir, metrics, checkpoints, progress, result),
// the others create no file and leave TrainResult's records, checkpoint and sample empty.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distributed/mesh.h"
#include "distributed/runtime.h"
#include "model/llama_config.h"
#include "model/trainable_llama.h"
#include "model/weights.h"
#include "train/data.h"
#include "train/data_parallel_optimizer.h"
#include "train/memory.h"
#include "train/optimizer.h"
#include "train/param_table.h"
#include "train/sft_batches.h"
#include "train/step.h"

namespace tpcli::train {

struct TrainOptions {
  // Mesh and the roles of its axes.
  dist::Mesh mesh;
  std::string data_axis = "data";
  std::string tensor_axis = "model";
  std::string expert_axis;  // "" = the data axis
  // How the devices run (distributed/runtime.h RunOptions, which documents each field):
  // blas_threads; the transport, make_backend and local_ranks (set by dist::use_zmq_backend or
  // use_mpi_backend; unset = the thread backend); the modelled links ([mesh.links]). Here:
  //   run.stop   set (e.g. from a SIGINT handler) to stop after the current step with a checkpoint;
  //              a step that cannot finish (a device stuck in a collective) fails with
  //              dist::RunStopped instead.
  //   run.trace  records every device's steps (spans "gradients", "data-parallel mean", "gradient
  //              norm", "optimizer", "evaluate", "checkpoint") and collectives (distributed/trace.h).
  //   run.seed   not read: train() runs the mesh with `seed` below.
  dist::RunOptions run;

  // Model: the initial weights (null = random_weights(model, seed)).
  model::LlamaConfig model;
  std::shared_ptr<const model::WeightSource> init;
  // LoRA: `init` stays frozen and only the adapters train; checkpoints hold the adapters (and their
  // moments), and --resume takes the base from `init` again.
  std::optional<model::LoraOptions> lora;
  // LoRA: the adapters' first values (a PEFT folder's, "layers.L.wq.lora_a" ...; null = fresh ones).
  std::shared_ptr<const model::WeightSource> lora_init;
  std::string base_name;  // where init came from (a LoRA adapter's base_model_name_or_path)

  // Data: a corpus of text windows, or (when sft is set, and corpus is then unused) supervised
  // fine-tuning examples batched by length (train/sft_batches.h; T varies per step, <= seq_len).
  std::shared_ptr<const Corpus> corpus;
  std::shared_ptr<const SftData> sft;
  std::shared_ptr<const TextTokenizer> tokenizer;
  bool shuffle = true;

  // Optimisation.
  int64_t steps = 2000;
  int batch_size = 12;  // rows of one micro-batch over the whole data axis
  int seq_len = 64;
  int grad_accum = 1;   // K micro-batches per optimizer step: a step sees K * batch_size rows
  bool recompute = false;        // activation checkpointing per block (model/trainable_llama.h set_recompute)
  bool sequence_parallel = false;  // token rows split over the tensor axis (model/trainable_llama.h set_sequence_parallel)
  bool shard_optimizer = false;  // ZeRO-1 (train/data_parallel_optimizer.h)
  int64_t bucket_elems = 262144; // floats per data-parallel gradient bucket
  bool overlap_buckets = true;   // buckets start during backward (train/data_parallel_optimizer.h GradientExchange)
  uint64_t seed = 1337;
  LrSchedule schedule;
  AdamWOptions adamw;
  double grad_clip = 1.0;  // 0 = off

  // Evaluation, checkpoints, output.
  int eval_every = 250;  // 0 = never (a final evaluation still runs when eval_batches > 0)
  int eval_batches = 20;
  std::string out_dir;   // "" = no files (tests)
  std::optional<int> save_every;  // nullopt = at each evaluation and at the end
  bool resume = false;   // continue from out_dir/latest.safetensors
  int log_every = 10;    // progress line cadence when stderr is not a terminal
  bool progress = true;  // progress line on stderr
  int sample_tokens = 200;
  std::string metadata_note;  // "train.config": the config file, for the record

  // Called on world rank 0 after every step (tests read the loss sequence).
  std::function<void(int64_t step, double loss)> on_step;
};

struct StepRecord {
  int64_t step = 0;  // 1-based: the number of completed steps
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0;
  std::optional<double> val_loss;
  // MoE only (empty for a dense model): per block, the assignments each expert got this step over
  // the expert group (before capacity drops); device 0's bytes sent by the MoE all_to_all_v calls
  // (forward + backward, all blocks); device 0's assignments dropped by a capacity factor.
  std::vector<std::vector<int64_t>> expert_tokens;
  uint64_t moe_bytes_sent = 0;
  int64_t moe_dropped = 0;
};

struct TrainResult {
  std::vector<StepRecord> records;  // this run's steps (a resumed run: from the resume step on)
  int64_t start_step = 0;
  int64_t end_step = 0;
  bool interrupted = false;
  std::string checkpoint;  // path of the last checkpoint written ("" if none)
  std::string sample;      // generated text ("" if none)
  double seconds = 0;
};

// Throws std::invalid_argument with one line when the options cannot work (mesh vs heads/batch,
// missing axis roles, corpus too short, ...): call before starting anything long.
void check_options(const TrainOptions& options);

// True when this process hosts mesh device 0 (always, on the thread backend): the process that
// writes the run's files and output.
bool is_writer_process(const TrainOptions& options);

TrainResult train(const TrainOptions& options);

// ---- pieces of a step, shared with tests and benchmarks: train/step.h (data_parallel_gradients),
// train/data_parallel_optimizer.h (make_slots), train/param_table.h (ParallelAxes) ----

// Bytes per device of this run (train/memory.h) for device 0, the largest.
MemoryLayout memory_layout(const TrainOptions& options);
DeviceBytes run_device_bytes(const TrainOptions& options);

// Collective over the tensor group: every parameter's full gradient (the model gathers its
// gradients the way it gathers its weights).
model::TensorWeights gather_gradients(model::TrainableLlama& llama);

}  // namespace tpcli::train

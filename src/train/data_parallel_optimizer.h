// tpcli::train — the data-parallel half of a step: gradient averaging over the data axis in
// buckets, the global norm, clipping and AdamW; optionally with the optimizer state sharded over
// the data axis (ZeRO-1, JAX's psum_scatter).
//
// Dimension legend: P elements of the flat buffer (train/param_table.h), D data ranks, d this
// data rank, S = this rank's share of P (the sum over buckets of its even_split chunk).
//
// Plain: per bucket, all_sum over the data axis and scale by 1/(D*K); AdamW updates every local
//   parameter, and every data rank holds the full moments of its local parameters.
// Sharded (shard_optimizer): per bucket, reduce_scatter (psum_scatter): rank d receives its chunk
//   (dist::even_split of the bucket, uneven when D does not divide it) of the summed gradient;
//   AdamW updates only those S elements (moments (S,) instead of (P,)); per bucket, all_gather_v
//   brings every rank's updated values back into the model. Same arithmetic per element as plain.
// Expert weights dealt out over the data axis (MoE) are not in the flat buffer: they are updated
// locally in both modes. Moments read and written through moments()/set_moments() are always the
// full local tensors (what checkpoints hold), so checkpoints do not depend on the mode or mesh.
#pragma once

#include <cstdint>
#include <vector>

#include "train/optimizer.h"
#include "train/param_table.h"

namespace tpcli::train {

class DataParallelOptimizer {
 public:
  DataParallelOptimizer(model::TrainableLlama& llama, const ParallelAxes& axes, int tensor_rank, const AdamWOptions& adamw,
                        bool shard, int64_t bucket_elems);

  // After K forward_backward calls (grads summed over K micro-batches): every device holds the
  // gradient of the mean loss over the K global batches (sharded: its chunk of it). Blocking, one
  // bucket after the other; GradientExchange does the same with the buckets started during backward.
  void reduce_gradients(int micro_batches);
  // Collective over the world: the global gradient norm; non-finite when any device passes
  // local_finite = false (a non-finite loss), so every device stops together.
  double global_grad_norm(bool local_finite);
  void clip(double norm, double max_norm);
  // AdamW with learning rate lr; sharded: then the all_gather of the updated values.
  void step(double lr);

  // Collective over the data axis when sharded: the moments (0: exp_avg, 1: exp_avg_sq) in the
  // local parameters' shapes, in llama_parameters order.
  std::vector<tensor::Tensor> moments(int which);
  void set_moments(int which, const std::vector<tensor::Tensor>& local);
  void set_steps(int64_t t);
  int64_t steps() const { return local_adam_.steps(); }

  int64_t moment_bytes() const;  // the optimizer state this device holds
  const ParamTable& table() const { return table_; }
  bool sharded() const { return shard_; }

 private:
  friend class GradientExchange;
  struct Chunk {
    dist::Range flat;               // this rank's part of a bucket, in flat coordinates
    int64_t shard_offset = 0;       // where it sits in shard_values_ / shard_grads_
    std::vector<int64_t> counts;    // every rank's chunk size of this bucket
  };
  void build_local_slots(bool all);
  void build_shard_slots();
  std::vector<float> shard_moments(int which) const;  // (S,) concatenated over the shard slots
  void set_shard_moments(int which, const std::vector<float>& flat);

  ParamTable table_;
  ParallelAxes axes_;
  bool shard_;
  std::vector<size_t> local_entries_;  // table entries AdamW updates in place
  std::vector<Slot> local_slots_;
  AdamW local_adam_;
  std::vector<Chunk> chunks_;            // sharded: one per bucket
  std::vector<float> shard_values_, shard_grads_;  // (S,)
  std::vector<Slot> shard_slots_;
  AdamW shard_adam_;
  std::vector<float> bucket_;  // scratch, one bucket (values and moments; gradients are reduced in place)
};

// One step's data-parallel gradient reduction (PyTorch DDP's reducer). With start_early, each
// bucket's collective (all_sum, or reduce_scatter when sharded) starts as soon as backward has
// finished its gradients (model::TrainableLlama::set_gradients_ready calls gradients_ready); the buckets
// follow grad_buffer()'s order, the last block's first. finish() starts what is left and waits for
// all, so the optimizer reads complete gradients. Without start_early, finish() runs the blocking
// collectives, bucket by bucket. Same sums, same bits either way. Keep it on the step's stack:
// leaving by an exception drops the started handles there, which fails the run rather than
// leaving collectives behind (distributed/async_worker.h).
class GradientExchange {
 public:
  GradientExchange(DataParallelOptimizer& optimizer, int micro_batches, bool start_early);
  // grad_buffer()[0, end) holds its final values: start the buckets inside it.
  void gradients_ready(int64_t end);
  void finish();
  size_t started() const { return next_bucket_; }  // buckets started so far

 private:
  void scale_experts(int64_t end);  // 1/G on replicated expert gradients inside [0, end), once
  std::span<float> summed(size_t b) const;  // where bucket b's sum lands
  void start_bucket(size_t b);
  void scale_bucket(size_t b);      // 1 / (D*K) once summed

  DataParallelOptimizer& o_;
  int micro_batches_;
  bool start_early_;
  bool reduce_;  // anything to sum (D > 1, K > 1, or a sharded optimizer)
  size_t next_bucket_ = 0;
  std::vector<bool> expert_scaled_;  // per table entry
  std::vector<dist::Pending> pending_;  // [next_bucket_]
};

// The optimizer's view of every local parameter with the global-norm weights of the plain
// (unsharded) mode: 1 / (devices in the world holding the same gradient element).
std::vector<Slot> make_slots(model::TrainableLlama& llama, const model::LlamaConfig& config, const ParallelAxes& axes,
                             int tensor_rank);

}  // namespace tpcli::train

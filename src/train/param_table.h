// tpcli::train — the parameter table: every parameter this device holds, where it sits in the flat
// data-parallel gradient buffer, how it is sharded and whether it decays; and the buckets that the
// data-parallel collectives run on.
//
// Dimension legend: P elements of the flat buffer (every local parameter that is replicated over
// the data axis, in llama_parameters order), D data ranks, TP tensor devices.
//
// The flat buffer is the model's gradient buffer (model::TrainableLlama::grad_buffer(), in the order backward
// finishes the gradients: last block first), so a bucket of gradients is a view of it and the
// collectives run in place. Values stay in the model's tensors: a range of them is copied out and
// back (gather / scatter) where the sharded optimizer needs them flat. Expert weights dealt out over
// the data axis (MoE) are different on every data rank: they are not in the flat buffer (offset -1;
// the model keeps them after it).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "distributed/group.h"
#include "model/trainable_llama.h"
#include "tensor/tensor.h"

namespace tpcli::train {

// How one device's parameters combine across the mesh.
struct ParallelAxes {
  dist::Group* data = nullptr;    // the data-parallel group
  dist::Group* world = nullptr;   // every device (for the global norm)
  int data_size = 1;              // D
  int tensor_size = 1;            // TP
  int expert_group_size = 1;      // G (MoE): devices the experts are dealt over
  bool experts_on_data_axis = true;
};

struct ParamEntry {
  const model::ParamSpec* spec = nullptr;
  tensor::Tensor* value = nullptr;  // this device's shard
  tensor::Tensor* grad = nullptr;   // same shape
  int64_t offset = -1;              // in the flat buffer (= grad_buffer()); -1 = not replicated over the data axis
  // 1 / (tensor devices holding this very slice): replicated parameters count 1/TP on each.
  double tensor_norm_weight = 1.0;
  // KV heads (spec->kv_heads) shared by some tensor devices and not others: per head row of the
  // slice, 1 / (tensor devices holding it). Empty otherwise.
  std::vector<double> row_tensor_norm_weights;
  int64_t numel() const { return value->numel(); }
};

// The buckets of a flat buffer of `flat` elements: consecutive ranges of bucket_elems, the last
// one shorter (what ParamTable uses, and what train/step_plan.h plans with).
std::vector<dist::Range> bucket_ranges(int64_t flat, int64_t bucket_elems);

class ParamTable {
 public:
  // bucket_elems: floats per bucket (at least 1).
  ParamTable(model::TrainableLlama& llama, const ParallelAxes& axes, int tensor_rank, int64_t bucket_elems);

  std::vector<ParamEntry>& entries() { return entries_; }
  const std::vector<ParamEntry>& entries() const { return entries_; }
  int64_t flat_size() const { return flat_size_; }
  const std::vector<dist::Range>& buckets() const { return buckets_; }

  // The gradients of flat elements [r.offset, r.offset + r.count): a view of the model's buffer.
  std::span<float> grads(dist::Range r) const { return flat_grads_.subspan(static_cast<size_t>(r.offset), static_cast<size_t>(r.count)); }
  // One tensor per entry (same order): the values, the gradients.
  std::vector<tensor::Tensor*> values() const;
  std::vector<tensor::Tensor*> grads() const;
  // out[r.count] = flat elements [r.offset, r.offset + r.count) read from `tensors` (one per entry).
  void gather(dist::Range r, std::span<tensor::Tensor* const> tensors, float* out) const;
  // The inverse: flat elements of r written into `tensors`.
  void scatter(dist::Range r, const float* in, std::span<tensor::Tensor* const> tensors) const;

 private:
  template <class Fn>
  void for_each_piece(dist::Range r, Fn&& fn) const;  // fn(entry index, element in entry, flat pos, count)
  std::vector<ParamEntry> entries_;
  int64_t flat_size_ = 0;
  std::span<float> flat_grads_;  // [P] the model's grad_buffer() prefix
  std::vector<dist::Range> buckets_;
};

}  // namespace tpcli::train

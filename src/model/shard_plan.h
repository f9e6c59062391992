// tpcli::model — the shard planner: which rows of which weight each tensor-parallel device keeps.
//
// Dimension legend: C dim, F hidden_dim, FE expert hidden dim, NH query heads, NKV kv heads,
// HS head size, V vocab; *_local = this device's part. T tensor-parallel devices, 1 <= T <= NH.
//
// All sharding arithmetic of the model lives here (and only here):
//   - query heads are dealt out by dist::even_split (12 heads on 8 devices: four hold 2, four 1);
//   - a device holds every KV head its query heads use. A KV head is *replicated* when several
//     devices' query heads use it (more devices than KV heads, or a device boundary inside a group
//     of query heads): each holder computes that head's K/V itself, and the gradients of its wk/wv
//     rows are summed over the holders (see kv_replicated);
//   - FFN rows (F, and FE for experts) and vocabulary rows (the classifier and the token embedding)
//     are split by dist::even_split; in a quantized checkpoint FFN rows (and the experts' FE rows) go in whole
//     groups (they are w2's input columns). wo's columns follow the heads; where they cut a group the model keeps
//     that device's wo in f32.
#pragma once

#include <vector>

#include "distributed/group.h"
#include "model/llama_config.h"

namespace tpcli::model {

struct ShardPlan {
  int devices = 1;  // T
  int rank = 0;     // this device's rank in the tensor group
  int head_size = 0;
  dist::Range heads;       // query heads held, global indices [offset, offset + count)
  dist::Range kv_heads;    // KV heads held (those used by `heads`)
  dist::Range ffn;         // rows of w1/w3 and columns of w2, of F
  dist::Range expert_ffn;  // rows of experts.w1/w3 and columns of experts.w2, of FE (MoE only)
  dist::Range vocab;       // classifier rows, of V
  bool kv_replicated = false;  // true on every device when any KV head has more than one holder

  // Rows of wq (and columns of wo) held: the heads' rows.
  dist::Range q_rows() const { return {heads.offset * head_size, heads.count * head_size}; }
  // Rows of wk and wv held.
  dist::Range kv_rows() const { return {kv_heads.offset * head_size, kv_heads.count * head_size}; }
  // This device's rows (Split::Rows) or columns (Split::Columns) of a parameter split along `dim`
  // (not None or Experts: those are whole, or dealt out by nn/moe.h).
  dist::Range range_of(ShardedDim dim) const;
  // Local index of the KV head used by local query head h (0 <= h < heads.count).
  int kv_head_of(int h, int kv_mul) const {
    return static_cast<int>((heads.offset + h) / kv_mul - kv_heads.offset);
  }
};

// Throws std::invalid_argument ("cannot split 8 heads over 12 devices: ...") when T does not fit.
void check_tensor_devices(const LlamaConfig& config, int devices);
// The plan of device `rank` of `devices`; also validates (check_tensor_devices).
ShardPlan plan_shards(const LlamaConfig& config, int devices, int rank);
// The plans of every device, rank order.
std::vector<ShardPlan> plan_all_shards(const LlamaConfig& config, int devices);

}  // namespace tpcli::model

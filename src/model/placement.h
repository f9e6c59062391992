// tpcli::model — where a model sits on a mesh, decided once per run: which mesh axis splits the
// weights (tensor), which deals a MoE's experts out (expert), and every tensor-parallel device's
// shard plan (model/shard_plan.h). The axes take their roles from the user (AxisRoles: the tensor
// axis is "model" unless named otherwise); no other code names an inference axis. Every device
// builds its Llama from the same Placement, and the run reads the plans from it, so a run derives
// them once.
//
//   model::check_axis_roles(mesh, roles);                       // inference, before the model is read
//   const model::Placement placement(weights, mesh, roles);     // the plans, once
//   model::run_placed(weights, placement, run_options, [&](model::Llama& llama, dist::Device& dev) { ... });
//
// Inference has no data role: an axis that splits the batch would run whole replicas of one
// request (training's data axis is its [mesh] data_axis, train/loop.h).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "distributed/mesh.h"
#include "distributed/runtime.h"
#include "model/shard_plan.h"
#include "model/weights.h"
#include "nn/attention.h"

namespace tpcli::model {

class Llama;

// The mesh axis given each role in inference.
struct AxisRoles {
  std::string tensor = "model";   // splits the weights (heads, FFN rows, vocabulary rows)
  std::string expert = "expert";  // a MoE's experts dealt out over it (nn/moe.h)
};

// std::invalid_argument when the tensor and expert roles name one axis, or for the first axis
// longer than 1 that no role uses (its devices would each run the whole model), naming it and the
// roles: "axis 'tp' (size 4) has no role in inference, so its 4 devices would each run the whole
// model: the weights split over 'model' and the experts over 'expert'".
void check_axis_roles(const dist::Mesh& mesh, const AxisRoles& roles);

class Placement {
 public:
  // Every tensor device's shard plan for `weights` as they will be built (after any conversion,
  // view or adapter): std::invalid_argument when the model does not split over the tensor axis
  // (check_tensor_devices' message). The roles are not checked here (inference commands check them
  // first, check_axis_roles; a bench may run replicas over an axis on purpose).
  Placement(const WeightSource& weights, dist::Mesh mesh, AxisRoles roles = {});

  const dist::Mesh& mesh() const { return mesh_; }
  const AxisRoles& roles() const { return roles_; }
  int tensor_devices() const { return mesh_.axis_size(roles_.tensor); }
  int expert_devices() const { return mesh_.axis_size(roles_.expert); }
  // This device's groups along the tensor and expert axes (size 1 when the mesh lacks the axis).
  dist::Group& tensor_group(dist::Device& dev) const { return dev.axis(roles_.tensor); }
  dist::Group& expert_group(dist::Device& dev) const { return dev.axis(roles_.expert); }
  // [tensor_devices()] every tensor device's plan, rank order.
  const std::vector<ShardPlan>& plans() const { return plans_; }
  // Whether the logits are bit for bit 1 device's (model/llama.h split_invariant).
  bool split_invariant() const { return split_invariant_; }

 private:
  dist::Mesh mesh_;
  AxisRoles roles_;
  std::vector<ShardPlan> plans_;
  bool split_invariant_ = false;
};

// Runs `work` on every device of `placement`'s mesh that this process hosts, each with its shard
// of `weights` as an inference model built on huge pages (Llama::on_huge_pages), freeing the
// checkpoint's pages once every local device has built its own (DevicesBuilding). kv_dtype: the
// models' own KV caches. Failures inside a device: dist::DeviceError.
void run_placed(const WeightSource& weights, const Placement& placement, const dist::RunOptions& run_options,
                const std::function<void(Llama& llama, dist::Device& dev)>& work, nn::KvDtype kv_dtype = nn::KvDtype::F32);

}  // namespace tpcli::model

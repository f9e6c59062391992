#include "model/placement.h"

#include <stdexcept>

#include "model/llama.h"

namespace tpcli::model {

void check_axis_roles(const dist::Mesh& mesh, const AxisRoles& roles) {
  if (roles.tensor == roles.expert)
    throw std::invalid_argument("the tensor and expert roles name one axis '" + roles.tensor + "'");
  for (const dist::MeshAxis& axis : mesh.axes()) {
    if (axis.size == 1 || axis.name == roles.tensor || axis.name == roles.expert) continue;
    const std::string n = std::to_string(axis.size);
    throw std::invalid_argument("axis '" + axis.name + "' (size " + n + ") has no role in inference, so its " + n +
                                " devices would each run the whole model: the weights split over '" + roles.tensor +
                                "' and the experts over '" + roles.expert + "'");
  }
}

Placement::Placement(const WeightSource& weights, dist::Mesh mesh, AxisRoles roles)
    : mesh_(std::move(mesh)), roles_(std::move(roles)) {
  plans_ = plan_all_shards(weights.config(), tensor_devices());
  split_invariant_ = model::split_invariant(weights, plans_, expert_devices());
}

void run_placed(const WeightSource& weights, const Placement& placement, const dist::RunOptions& run_options,
                const std::function<void(Llama& llama, dist::Device& dev)>& work, nn::KvDtype kv_dtype) {
  const dist::Mesh& mesh = placement.mesh();
  DevicesBuilding building(weights, run_options.local_ranks.empty() ? mesh.size() : static_cast<int>(run_options.local_ranks.size()));
  dist::run_on_mesh(
      mesh,
      [&](dist::Device& dev) {
        Llama llama = Llama::on_huge_pages(weights, placement, dev, kv_dtype);
        building.built();
        work(llama, dev);
      },
      run_options);
}

}  // namespace tpcli::model

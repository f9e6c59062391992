// tpcli::perf — the work-item cost model and the collectives' modelled times (see cost_model.h).
#include "perf/cost_model.h"

#include <algorithm>
#include <stdexcept>

namespace tpcli::perf {

namespace {

int group_size(model::Role role, const PlanMesh& m) {
  return role == model::Role::Tensor ? m.tensor : role == model::Role::Data ? m.data : m.devices();
}

}  // namespace

std::vector<std::string> group_axes(model::Role role, const PlanMesh& m) {
  if (role == model::Role::Tensor) return {m.tensor_axis};
  if (role == model::Role::Data) return {m.data_axis};
  std::vector<std::string> axes;
  if (m.data > 1) axes.push_back(m.data_axis);
  if (m.tensor > 1) axes.push_back(m.tensor_axis);
  return axes;
}

double modelled_seconds(const model::PlannedCollective& p, const PlanMesh& m) {
  const dist::AxisLink link = dist::group_link(m.links, group_axes(p.role, m));
  if (link.gb_per_s <= 0) return 0;
  return dist::modelled_seconds(link, group_size(p.role, m), p.kind, static_cast<uint64_t>(p.bytes()));
}

double modelled_seconds(const std::vector<model::PlannedCollective>& plan, const PlanMesh& m) {
  double total = 0;
  for (const auto& p : plan) total += static_cast<double>(p.calls) * modelled_seconds(p, m);
  return total;
}

int64_t working_set_class(int64_t bytes) {
  int64_t c = int64_t{16} << 10;
  while (c < bytes && c < (int64_t{64} << 20)) c *= 2;
  return c;
}

double WorkRates::memory_rate(int64_t bytes) const {
  const auto it = bytes_per_s.find(working_set_class(bytes));
  if (it == bytes_per_s.end()) throw std::logic_error("plan report: no memory rate measured for " + std::to_string(bytes) + " bytes");
  return it->second;
}

std::array<int64_t, 6> call_key(const model::PlannedWork& w) {
  return {static_cast<int64_t>(w.op), w.m, w.n, w.heads, w.kv_heads, w.head_size};
}

std::array<int64_t, 4> gemm_key(const model::PlannedWork& w) { return {w.m, w.n, w.k, static_cast<int64_t>(w.gemm)}; }

double WorkRates::seconds(const model::PlannedWork& w) const {
  const double calls = static_cast<double>(w.calls);
  switch (w.kind) {
    case model::PlannedWork::Kind::Matmul: {
      const double rate = given_gflops > 0 ? given_gflops : gflops.at(gemm_key(w));
      return w.flops() / (rate * 1e9);
    }
    case model::PlannedWork::Kind::Memory: return calls * static_cast<double>(w.bytes) / memory_rate(w.bytes);
    case model::PlannedWork::Kind::Exp: return calls * static_cast<double>(w.elements) / exps_per_s;
    case model::PlannedWork::Kind::Call: return calls * call_s.at(call_key(w));
    case model::PlannedWork::Kind::Weights: {
      const auto it = weight_bytes_per_s.find(w.tensor);
      return calls * static_cast<double>(w.bytes) / (it != weight_bytes_per_s.end() ? it->second : memory_rate(w.bytes));
    }
  }
  return 0;
}

std::string collective_key(const model::PlannedCollective& p) {
  return std::to_string(static_cast<int>(p.role)) + " " + p.name + " " + std::to_string(p.floats);
}

double collective_seconds(const model::PlannedCollective& p, const PlanMesh& m, const WorkRates& rates) {
  const auto measured = rates.collective_s.find(collective_key(p));
  const double floor = measured != rates.collective_s.end() ? measured->second
                                                            : 2.0 * static_cast<double>(p.bytes()) / rates.memory_rate(2 * p.bytes());
  return std::max(modelled_seconds(p, m), floor);
}

Prediction predict(const std::vector<model::PlannedWork>& work, const std::vector<model::PlannedCollective>& comm,
                   const PlanMesh& mesh, const WorkRates& rates, bool overlap_buckets, int grad_accum) {
  Prediction p;
  double backward_s = 0;
  for (const auto& w : work) {
    const double s = rates.seconds(w);
    using K = model::PlannedWork::Kind;
    (w.kind == K::Matmul ? p.matmul_s : w.kind == K::Call ? p.calls_s : w.kind == K::Exp ? p.exp_s : p.memory_s) += s;
    if (w.backward) backward_s += s;
  }
  double buckets_s = 0, last_bucket_s = 0;
  for (const auto& c : comm) {
    const double s = collective_seconds(c, mesh, rates);
    p.collectives_s += static_cast<double>(c.calls) * s;
    if (c.role == model::Role::Data && c.what == "gradient bucket") {
      buckets_s += static_cast<double>(c.calls) * s;
      last_bucket_s = s;
    }
  }
  if (overlap_buckets) p.hidden_s = std::min(buckets_s - last_bucket_s, backward_s / std::max(1, grad_accum));
  return p;
}

}  // namespace tpcli::perf

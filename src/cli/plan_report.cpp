// tpcli::cli — sharding plans and predictions (see plan_report.h).
#include "cli/plan_report.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "dist/runtime.h"
#include "tensor/blas.h"

namespace tpcli::cli {

namespace {

std::string axis_name(model::Role role, const PlanMesh& m) {
  switch (role) {
    case model::Role::Tensor: return m.tensor_axis;
    case model::Role::Data: return m.data_axis;
    case model::Role::World: return "world";
  }
  return "?";
}

int group_size(model::Role role, const PlanMesh& m) {
  return role == model::Role::Tensor ? m.tensor : role == model::Role::Data ? m.data : m.devices();
}

// The axes of the group (those of size > 1: a lone axis does not carry the world's data).
std::vector<std::string> group_axes(model::Role role, const PlanMesh& m) {
  if (role == model::Role::Tensor) return {m.tensor_axis};
  if (role == model::Role::Data) return {m.data_axis};
  std::vector<std::string> axes;
  if (m.data > 1) axes.push_back(m.data_axis);
  if (m.tensor > 1) axes.push_back(m.tensor_axis);
  return axes;
}

std::string duration(double s) {
  char buf[32];
  if (s < 1e-3)
    std::snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.2f ms", s * 1e3);
  return buf;
}

std::string byte_size(int64_t b) {
  char buf[32];
  if (b < 10'000)
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(b));
  else if (b < 10'000'000)
    std::snprintf(buf, sizeof buf, "%.1f KB", static_cast<double>(b) / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(b) / 1e6);
  return buf;
}

}  // namespace

std::string jax_sharding(const model::ParamSpec& spec, const std::string& dtype, const std::string& tensor_axis,
                         int tensor_devices, const std::string& expert_axis) {
  // The split dim: Rows = dim 0 of [out, in] (or of [E, out, in] after the expert dim), Columns the last.
  const size_t rank = spec.shape.size(), first = spec.expert ? 1 : 0;
  const int split_dim = tensor_devices <= 1 || spec.split == model::Split::Replicated ? -1
                        : spec.split == model::Split::Rows                           ? static_cast<int>(first)
                                                                                     : static_cast<int>(rank - 1);
  std::string s = dtype + "[";
  for (size_t d = 0; d < rank; ++d) {
    s += (d ? ", " : "") + std::to_string(spec.shape[d]);
    if (static_cast<int>(d) == split_dim) s += "@" + tensor_axis;
    if (d == 0 && spec.expert && !expert_axis.empty()) s += "@" + expert_axis;
  }
  return s + "]";
}

void print_sharding(const model::LlamaConfig& c, const PlanMesh& m,
                    const std::function<std::string(const model::ParamSpec&)>& dtype_of, std::ostream& out) {
  out << "  sharding (JAX notation; @" << m.tensor_axis << " = split over the " << m.tensor
      << " devices of that axis, dealt by even_split; no @ = replicated)\n";
  for (const model::ParamSpec& spec : model::llama_parameters(c))
    out << "    " << spec.name << std::string(spec.name.size() < 24 ? 24 - spec.name.size() : 1, ' ')
        << jax_sharding(spec, dtype_of(spec), m.tensor_axis, m.tensor, c.is_moe() ? m.data_axis : "") << "\n";
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

void print_collectives(const std::vector<model::PlannedCollective>& plan, const PlanMesh& m, std::ostream& out) {
  if (plan.empty()) {
    out << "    (none: one device)\n";
    return;
  }
  int64_t bytes = 0, calls = 0;
  bool any_unmodelled = false;
  for (const auto& p : plan) {
    const bool modelled = dist::group_link(m.links, group_axes(p.role, m)).gb_per_s > 0;
    any_unmodelled |= !modelled;
    char line[200];
    std::snprintf(line, sizeof line, "    %-6s %-15s %-36s %10s x %-5lld %s\n", axis_name(p.role, m).c_str(), p.name,
                  p.what.c_str(), byte_size(p.bytes()).c_str(), static_cast<long long>(p.calls),
                  modelled ? (duration(modelled_seconds(p, m)) + " each").c_str() : "unmodelled");
    out << line;
    bytes += p.bytes() * p.calls;
    calls += p.calls;
  }
  out << "    total  " << calls << " calls, " << byte_size(bytes) << "; modelled time "
      << duration(modelled_seconds(plan, m)) << (any_unmodelled ? " (axes without [mesh.links] / --link count 0)" : "")
      << "\n";
}

double measure_matmul_gflops(int devices, int64_t m, int64_t n, int64_t k, double seconds) {
  std::vector<double> rate(static_cast<size_t>(devices));
  dist::run_on_mesh(dist::Mesh::line(devices), [&](dist::Device& dev) {
    std::mt19937 rng(static_cast<uint32_t>(dev.rank()));
    std::uniform_real_distribution<float> d(-1, 1);
    std::vector<float> a(static_cast<size_t>(m * k)), w(static_cast<size_t>(n * k)), c(static_cast<size_t>(m * n));
    for (float& x : a) x = d(rng);
    for (float& x : w) x = d(rng);
    auto product = [&] {
      if (m == 1)
        tensor::matvec(c.data(), w.data(), a.data(), n, k);
      else
        tensor::matmul_wt(c.data(), a.data(), w.data(), m, n, k);
    };
    product();  // warm-up
    const auto t0 = std::chrono::steady_clock::now();
    int reps = 0;
    double took = 0;
    do {
      product();
      ++reps;
      took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } while (took < seconds);
    rate[static_cast<size_t>(dev.rank())] = 2.0 * static_cast<double>(m * n * k) * reps / took / 1e9;
  });
  return *std::min_element(rate.begin(), rate.end());  // the slowest device sets the pace
}

std::string describe_prediction(double flops, double gflops, bool rate_measured, double comm_s, bool modelled) {
  const double compute_s = flops / (gflops * 1e9);
  char buf[240];
  std::snprintf(buf, sizeof buf, "compute %s (%.3g GFLOP at %.1f GFLOP/s%s), collectives %s%s: predicted %s",
                duration(compute_s).c_str(), flops / 1e9, gflops, rate_measured ? " measured" : " given",
                duration(comm_s).c_str(), modelled ? " modelled" : " (links unmodelled)",
                duration(compute_s + comm_s).c_str());
  return buf;
}

}  // namespace tpcli::cli

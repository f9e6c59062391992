// tpcli::cli — sharding plans and predictions (see plan_report.h).
#include "cli/plan_report.h"

#include <cstdio>
#include <map>

namespace tpcli::cli {

namespace {

std::string axis_name(model::Role role, const perf::PlanMesh& m) {
  switch (role) {
    case model::Role::Tensor: return m.tensor_axis;
    case model::Role::Data: return m.data_axis;
    case model::Role::World: return "world";
  }
  return "?";
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

void print_sharding(const model::LlamaConfig& c, const perf::PlanMesh& m, const std::string& expert_axis,
                    const std::function<std::string(const model::ParamSpec&)>& dtype_of, std::ostream& out) {
  out << "  sharding (JAX notation; @" << m.tensor_axis << " = split over the " << m.tensor
      << " devices of that axis, dealt by even_split; no @ = replicated)\n";
  for (const model::ParamSpec& spec : model::llama_parameters(c))
    out << "    " << spec.name << std::string(spec.name.size() < 24 ? 24 - spec.name.size() : 1, ' ')
        << jax_sharding(spec, dtype_of(spec), m.tensor_axis, m.tensor, expert_axis) << "\n";
}

void print_collectives(const std::vector<model::PlannedCollective>& plan, const perf::PlanMesh& m, std::ostream& out) {
  if (plan.empty()) {
    out << "    (none: one device)\n";
    return;
  }
  int64_t bytes = 0, calls = 0;
  bool any_unmodelled = false;
  for (const auto& p : plan) {
    const bool modelled = dist::group_link(m.links, perf::group_axes(p.role, m)).gb_per_s > 0;
    any_unmodelled |= !modelled;
    char line[200];
    std::snprintf(line, sizeof line, "    %-6s %-15s %-36s %10s x %-5lld %s\n", axis_name(p.role, m).c_str(), p.name,
                  p.what.c_str(), byte_size(p.bytes()).c_str(), static_cast<long long>(p.calls),
                  modelled ? (duration(perf::modelled_seconds(p, m)) + " each").c_str() : "unmodelled");
    out << line;
    bytes += p.bytes() * p.calls;
    calls += p.calls;
  }
  out << "    total  " << calls << " calls, " << byte_size(bytes) << "; modelled time "
      << duration(perf::modelled_seconds(plan, m)) << (any_unmodelled ? " (axes without [mesh.links] / --link count 0)" : "")
      << "\n";
}

void print_work(const std::vector<model::PlannedWork>& work, const perf::WorkRates& rates, std::ostream& out) {
  struct Sum {
    double seconds = 0, flops = 0, bytes = 0, calls = 0;
    bool timed_call = false;  // Kind::Call: each call timed at its shape
  };
  std::vector<std::string> order;
  std::map<std::string, Sum> sums;  // by what
  for (const auto& w : work) {
    if (!sums.count(w.what)) order.push_back(w.what);
    Sum& s = sums[w.what];
    s.seconds += rates.seconds(w);
    s.flops += w.flops();
    s.bytes += static_cast<double>(w.bytes * w.calls);
    s.calls += static_cast<double>(w.calls);
    s.timed_call |= w.kind == model::PlannedWork::Kind::Call;
  }
  for (const std::string& what : order) {
    const Sum& s = sums[what];
    char line[200];
    if (s.flops > 0)
      std::snprintf(line, sizeof line, "    %-32s %10s  %8.3f GFLOP at %6.1f GFLOP/s%s\n", what.c_str(),
                    duration(s.seconds).c_str(), s.flops / 1e9, s.flops / s.seconds / 1e9,
                    s.timed_call ? " (calls timed at their shape)" : "");
    else if (s.timed_call)
      std::snprintf(line, sizeof line, "    %-32s %10s  %8.0f calls of %s (timed at their shape)\n", what.c_str(),
                    duration(s.seconds).c_str(), s.calls, duration(s.seconds / s.calls).c_str());
    else if (s.bytes > 0)
      std::snprintf(line, sizeof line, "    %-32s %10s  %8.1f MB at %6.1f GB/s\n", what.c_str(), duration(s.seconds).c_str(),
                    s.bytes / 1e6, s.bytes / s.seconds / 1e9);
    else
      std::snprintf(line, sizeof line, "    %-32s %10s  (exponentials at %.0f M/s)\n", what.c_str(), duration(s.seconds).c_str(),
                    rates.exps_per_s / 1e6);
    out << line;
  }
}

std::string describe(const perf::Prediction& p) {
  std::string s = "matmul " + duration(p.matmul_s) + (p.calls_s > 0 ? " + timed calls " + duration(p.calls_s) : "") +
                  " + memory " + duration(p.memory_s) + " + exp " + duration(p.exp_s) + " + collectives " +
                  duration(p.collectives_s);
  if (p.hidden_s > 0) s += " - overlapped " + duration(p.hidden_s);
  return s + " = " + duration(p.total());
}

}  // namespace tpcli::cli

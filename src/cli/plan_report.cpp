// tpcli::cli — sharding plans and predictions (see plan_report.h).
#include "cli/plan_report.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <stdexcept>

#include "dist/runtime.h"
#include "model/packed_weights.h"
#include "tensor/aligned_storage.h"
#include "tensor/blas.h"
#include "tensor/packed_matrix.h"
#include "tensor/vec_math.h"

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

namespace {
std::array<int64_t, 4> gemm_key(const model::PlannedWork& w) { return {w.m, w.n, w.k, static_cast<int64_t>(w.gemm)}; }
}  // namespace

double WorkRates::seconds(const model::PlannedWork& w) const {
  const double calls = static_cast<double>(w.calls);
  switch (w.kind) {
    case model::PlannedWork::Kind::Matmul: {
      const double rate = given_gflops > 0 ? given_gflops : gflops.at(gemm_key(w));
      return w.flops() / (rate * 1e9);
    }
    case model::PlannedWork::Kind::Memory: return calls * static_cast<double>(w.bytes) / memory_rate(w.bytes);
    case model::PlannedWork::Kind::Exp: return calls * static_cast<double>(w.elements) / exps_per_s;
    case model::PlannedWork::Kind::Weights: {
      const auto it = weight_bytes_per_s.find(w.tensor);
      return calls * static_cast<double>(w.bytes) / (it != weight_bytes_per_s.end() ? it->second : memory_rate(w.bytes));
    }
  }
  return 0;
}

namespace {

using Clock = std::chrono::steady_clock;

// Calls `once` until `seconds` have passed (at least twice); returns the seconds per call.
template <class F>
double seconds_per_call(F&& once, double seconds) {
  once();  // warm-up: BLIS buffers, caches
  const auto t0 = Clock::now();
  int reps = 0;
  double took = 0;
  do {
    once();
    ++reps;
    took = std::chrono::duration<double>(Clock::now() - t0).count();
  } while (took < seconds || reps < 2);
  return took / reps;
}

std::vector<float> random_floats(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace

WorkRates measure_work_rates(const std::vector<model::PlannedWork>& work, const std::vector<model::PlannedCollective>& comm,
                             int devices, int blas_threads, double given_gflops, double seconds) {
  std::vector<std::array<int64_t, 4>> shapes;  // distinct gemm_key, in order
  std::vector<int64_t> classes;
  bool exps = false;
  for (const auto& w : work) {
    if (w.kind == model::PlannedWork::Kind::Matmul && given_gflops <= 0 &&
        std::find(shapes.begin(), shapes.end(), gemm_key(w)) == shapes.end())
      shapes.push_back(gemm_key(w));
    if ((w.kind == model::PlannedWork::Kind::Memory || w.kind == model::PlannedWork::Kind::Weights) &&
        std::find(classes.begin(), classes.end(), working_set_class(w.bytes)) == classes.end())
      classes.push_back(working_set_class(w.bytes));
    exps |= w.kind == model::PlannedWork::Kind::Exp;
  }
  for (const auto& c : comm)
    if (std::find(classes.begin(), classes.end(), working_set_class(2 * c.bytes())) == classes.end())
      classes.push_back(working_set_class(2 * c.bytes()));
  const size_t D = static_cast<size_t>(devices);
  std::vector<std::vector<double>> shape_s(shapes.size(), std::vector<double>(D)), class_s(classes.size(), std::vector<double>(D));
  std::vector<double> exp_s(D);
  constexpr int64_t EXP_N = 4096;
  dist::RunOptions options;
  options.blas_threads = blas_threads;
  dist::run_on_mesh(dist::Mesh::line(devices), [&](dist::Device& dev) {
    const auto d = static_cast<size_t>(dev.rank());
    std::mt19937 rng(static_cast<uint32_t>(dev.rank()));
    for (size_t i = 0; i < shapes.size(); ++i) {
      const auto [m, n, k, layout] = shapes[i];
      const auto a = random_floats(static_cast<size_t>(m * k), rng), b = random_floats(static_cast<size_t>(n * k), rng);
      std::vector<float> c(static_cast<size_t>(m * n));  // [m, n], row-major, as the model's calls lay them out
      const bool ta = layout == static_cast<int64_t>(model::PlannedWork::Gemm::TN);
      const bool tb = layout == static_cast<int64_t>(model::PlannedWork::Gemm::NT);
      using tensor::Trans;
      dev.world().barrier();
      shape_s[i][d] = seconds_per_call([&] {
        tensor::gemm(ta ? Trans::Yes : Trans::No, tb ? Trans::Yes : Trans::No, m, n, k, 1.0f, a.data(), ta ? m : k,
                     b.data(), tb ? k : n, 0.0f, c.data(), n);
      }, seconds);
    }
    for (size_t i = 0; i < classes.size(); ++i) {
      const size_t n = static_cast<size_t>(classes[i]) / 12;  // x, y read, z written: classes[i] bytes a pass
      const auto x = random_floats(n, rng), y = random_floats(n, rng);
      std::vector<float> z(n);
      dev.world().barrier();
      class_s[i][d] = seconds_per_call([&] {
        for (size_t j = 0; j < n; ++j) z[j] = 0.5f * x[j] + y[j];
        asm volatile("" : : "r"(z.data()) : "memory");  // keep the stores
      }, seconds) / static_cast<double>(n * 12);
    }
    if (exps) {
      const auto x = random_floats(EXP_N, rng);
      std::vector<float> y(EXP_N);
      dev.world().barrier();
      exp_s[d] = seconds_per_call([&] { tensor::exp_sum(y.data(), x.data(), EXP_N, 1.0f, 1.0f); }, seconds) / EXP_N;
    }
  }, options);
  const auto slowest = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
  WorkRates r;
  r.given_gflops = given_gflops;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto [m, n, k, layout] = shapes[i];
    r.gflops[shapes[i]] = 2.0 * static_cast<double>(m * n) * static_cast<double>(k) / slowest(shape_s[i]) / 1e9;
  }
  for (size_t i = 0; i < classes.size(); ++i) r.bytes_per_s[classes[i]] = 1.0 / slowest(class_s[i]);
  if (exps) r.exps_per_s = 1.0 / slowest(exp_s);
  return r;
}

namespace {

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Seconds of the median pass of the slowest device, each pass one `stream` over copies of one
// [rows, cols] matrix (distinct copies, `stream_bytes` in all, so they come from memory).
double time_matvec_passes(const model::PlannedWork& item, const tensor::WeightFormat& format, bool packed, int devices,
                          int threads, int64_t stream_bytes, int64_t& streamed) {
  constexpr int PASSES = 7;
  const int64_t rows = item.m, cols = item.k;
  std::vector<std::vector<double>> pass_s(static_cast<size_t>(devices), std::vector<double>(PASSES));
  dist::RunOptions options;
  options.blas_threads = threads;
  dist::run_on_mesh(dist::Mesh::line(devices), [&](dist::Device& dev) {
    std::mt19937 rng(static_cast<uint32_t>(dev.rank()));
    const auto w = random_floats(static_cast<size_t>(rows * cols), rng), x = random_floats(static_cast<size_t>(cols), rng);
    std::vector<float> y(static_cast<size_t>(rows));
    const tensor::HugePageArena as_the_model_holds_them;  // (model/llama.cpp: weights on 2 MB pages)
    std::vector<tensor::PackedMatrix> set;  // packed: [count] copies of [rows, cols]
    std::vector<std::vector<float, tensor::AlignedAllocator<float>>> plain;  // f32: the same
    const int64_t each = packed ? tensor::PackedMatrix::from_f32(w.data(), rows, cols, format).bytes() : rows * cols * 4;
    for (int64_t held = 0; held < std::max(stream_bytes, each); held += each) {
      if (packed) set.push_back(set.empty() ? tensor::PackedMatrix::from_f32(w.data(), rows, cols, format) : set.front());
      else plain.emplace_back(w.begin(), w.end());
    }
    const auto pass = [&] {
      for (const auto& m : set) m.matvec(y.data(), x.data());
      for (const auto& m : plain) tensor::matvec(y.data(), m.data(), x.data(), rows, cols);
    };
    if (dev.rank() == 0) streamed = each * static_cast<int64_t>(set.size() + plain.size());
    pass();  // warm-up
    for (int p = 0; p < PASSES; ++p) {
      dev.world().barrier();
      const auto t0 = Clock::now();
      pass();
      pass_s[static_cast<size_t>(dev.rank())][static_cast<size_t>(p)] = std::chrono::duration<double>(Clock::now() - t0).count();
    }
  }, options);
  std::vector<double> slowest(PASSES, 0.0);  // [PASSES] the slowest device's pass
  for (size_t p = 0; p < PASSES; ++p)
    for (const auto& dev : pass_s) slowest[p] = std::max(slowest[p], dev[p]);
  return median_of(slowest);
}

}  // namespace

std::map<std::string, double> measure_weight_rates(const std::vector<model::PlannedWork>& work,
                                                   const model::WeightSource& weights, int devices, int threads,
                                                   int64_t stream_bytes) {
  const bool packed = model::holds_packed_weights(weights);
  std::map<std::string, double> rates;
  for (const auto& item : work) {
    if (item.kind != model::PlannedWork::Kind::Weights || rates.count(item.tensor)) continue;
    int64_t streamed = 0;
    const double s = time_matvec_passes(item, model::stored_format(weights, item.tensor), packed, devices, threads,
                                        stream_bytes, streamed);
    rates[item.tensor] = static_cast<double>(streamed) / s;
  }
  return rates;
}

double collective_seconds(const model::PlannedCollective& p, const PlanMesh& m, const WorkRates& rates) {
  const double copy = 2.0 * static_cast<double>(p.bytes()) / rates.memory_rate(2 * p.bytes());
  return std::max(modelled_seconds(p, m), copy);
}

Prediction predict(const std::vector<model::PlannedWork>& work, const std::vector<model::PlannedCollective>& comm,
                   const PlanMesh& mesh, const WorkRates& rates, bool overlap_buckets, int grad_accum) {
  Prediction p;
  double backward_s = 0;
  for (const auto& w : work) {
    const double s = rates.seconds(w);
    (w.kind == model::PlannedWork::Kind::Matmul ? p.matmul_s : w.kind == model::PlannedWork::Kind::Exp ? p.exp_s : p.memory_s) += s;
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

void print_work(const std::vector<model::PlannedWork>& work, const WorkRates& rates, std::ostream& out) {
  std::vector<std::string> order;
  std::map<std::string, std::array<double, 3>> sums;  // what -> {seconds, flops, bytes}
  for (const auto& w : work) {
    if (!sums.count(w.what)) order.push_back(w.what);
    auto& s = sums[w.what];
    s[0] += rates.seconds(w);
    s[1] += w.flops();
    s[2] += static_cast<double>(w.bytes * w.calls);
  }
  for (const std::string& what : order) {
    const auto& [sec, flops, bytes] = sums[what];
    char line[200];
    if (flops > 0)
      std::snprintf(line, sizeof line, "    %-32s %10s  %8.3f GFLOP at %6.1f GFLOP/s\n", what.c_str(), duration(sec).c_str(),
                    flops / 1e9, flops / sec / 1e9);
    else if (bytes > 0)
      std::snprintf(line, sizeof line, "    %-32s %10s  %8.1f MB at %6.1f GB/s\n", what.c_str(), duration(sec).c_str(),
                    bytes / 1e6, bytes / sec / 1e9);
    else
      std::snprintf(line, sizeof line, "    %-32s %10s  (exponentials at %.0f M/s)\n", what.c_str(), duration(sec).c_str(),
                    rates.exps_per_s / 1e6);
    out << line;
  }
}

std::string describe(const Prediction& p) {
  std::string s = "matmul " + duration(p.matmul_s) + " + memory " + duration(p.memory_s) + " + exp " + duration(p.exp_s) +
                  " + collectives " + duration(p.collectives_s);
  if (p.hidden_s > 0) s += " - overlapped " + duration(p.hidden_s);
  return s + " = " + duration(p.total());
}

}  // namespace tpcli::cli

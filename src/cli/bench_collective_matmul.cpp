// tpcli bench collective-matmul — JAX's collective matmul example under a modelled link.
//
// Dimension legend: B rows (batch x sequence), D model dim, F ffn dim, T devices on the `model`
// axis; *_local = this device's shard.
//
// All-gather case (JAX: A[B@model, D] @ W[D, F@model]): every device ends with out[B, F_local].
//   unsharded               A already whole on every device: the local product A[B, D] @ W_local, no
//                           communication (the time the overlapped form aims for)
//   all-gather then matmul  blocking all_gather of A (its modelled time), then that product
//   overlapped              nn::all_gather_matmul: T chunk products while the next chunk moves on a
//                           started ppermute (and the two-way ring variant; and the one-way form
//                           with the link not modelled: chunking plus the ring's copies and worker)
//   chunk products alone    the T chunk products straight from A, nothing else: the cost of
//                           cutting the product into chunks by itself
// The link: --link model=GBPS,US[,ring|switch]; by default a ring whose bandwidth makes the
// modelled communication --comm-ratio (0.4) of the measured local product, the regime where
// overlapping can hide it (what the link is is printed).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "distributed/links.h"
#include "distributed/runtime.h"
#include "distributed/trace.h"
#include "nn/collective_matmul.h"
#include "nn/linear.h"

namespace tpcli::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int devices = 2;
  int64_t batch = 512, dim = 1024, ffn = 4096;  // the JAX example's B=1024, D=2048, F=8192, halved
  int reps = 5;
  double comm_ratio = 0.4;
  std::vector<std::string> links;
  std::string trace;  // --trace FILE: the overlapped run's spans
};

std::vector<float> random_floats(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

// One way of computing the case: given a device, prepares its shards (untimed) and returns the
// call that computes the case once into out (this device's result).
using Call = std::function<void(std::vector<float>& out)>;
using Variant = std::function<Call(dist::Device& dev)>;

struct Timing {
  double median_s = 0;
  std::vector<float> out0;  // device 0's result of the last rep
};

// Median over reps (after a warm-up) of the slowest device's time for one call.
Timing measure(const Options& o, const dist::LinkSpec& links, const Variant& variant, dist::Trace* trace = nullptr) {
  dist::RunOptions run;
  run.links = links;
  run.trace = trace;
  std::vector<std::vector<double>> took(static_cast<size_t>(o.devices), std::vector<double>(static_cast<size_t>(o.reps)));
  Timing t;
  dist::run_on_mesh(dist::Mesh::line(o.devices), [&](dist::Device& dev) {
    std::vector<float> out;
    const Call call = variant(dev);
    call(out);  // warm-up
    for (int rep = 0; rep < o.reps; ++rep) {
      dev.world().barrier();
      const auto t0 = Clock::now();
      call(out);
      took[static_cast<size_t>(dev.rank())][static_cast<size_t>(rep)] = std::chrono::duration<double>(Clock::now() - t0).count();
    }
    if (dev.rank() == 0) t.out0 = out;
  }, run);
  std::vector<double> slowest(static_cast<size_t>(o.reps), 0.0);
  for (const auto& d : took)
    for (size_t i = 0; i < d.size(); ++i) slowest[i] = std::max(slowest[i], d[i]);
  std::sort(slowest.begin(), slowest.end());
  t.median_s = slowest[slowest.size() / 2];
  return t;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
  return m;
}

// The link the run models: --link, else a ring sized so the modelled communication of `bytes`
// moved by a ring all-gather / reduce-scatter is comm_ratio x `compute_s`.
dist::AxisLink pick_link(const Options& o, const dist::LinkSpec& given, uint64_t bytes, double compute_s) {
  if (auto it = given.find("model"); it != given.end()) return it->second;
  const double latency_us = 10, T = o.devices;
  const double comm_s = o.comm_ratio * compute_s - (T - 1) * latency_us * 1e-6;
  return {(T - 1) / T * static_cast<double>(bytes) / std::max(comm_s, 1e-6) / 1e9, latency_us, dist::Topology::Ring};
}

void print_row(const char* label, double seconds, double base) {
  std::printf("  %-28s %10.2f ms   %5.2fx\n", label, seconds * 1e3, seconds / base);
}

void print_link(const dist::AxisLink& link, int T, dist::CollectiveKind kind, uint64_t bytes, double compute_s) {
  const double comm = dist::modelled_seconds(link, T, kind, bytes);
  std::printf("  link: %.4g GB/s, %.4g us, %s; modelled %s of %.2f MB: %.2f ms (%.2f x the local product)\n",
              link.gb_per_s, link.latency_us, link.topology == dist::Topology::Ring ? "ring" : "switch",
              kind == dist::CollectiveKind::AllGather ? "all-gather" : "reduce-scatter", static_cast<double>(bytes) / 1e6,
              comm * 1e3, comm / compute_s);
}

// The case every variant computes: W^T[F, D] whole (each device takes its F_local rows), A[B, D].
struct Case {
  const Options& o;
  nn::Linear w;
  std::vector<float> a;
  std::shared_ptr<nn::AllToShardedLinear> layer(dist::Device& dev) const {
    return std::make_shared<nn::AllToShardedLinear>(
        std::get<nn::AllToShardedLinear>(nn::shard_linear(w, nn::Sharding::AllToSharded, dev.world())));
  }
};

// JAX's case: A's contraction columns are dealt out, A[B, D@model]. Device r holds a_cols[B, DC_r].
void bench_contracting(const Case& c, const dist::LinkSpec& links, double local_s) {
  const Options& o = c.o;
  const int T = o.devices;
  const int64_t B = o.batch, D = o.dim;
  std::printf("all-gather matmul, JAX's case: A[%lld, %lld@model] @ W[%lld, %lld@model]; the gather is over the "
              "contraction dim\n", static_cast<long long>(B), static_cast<long long>(D), static_cast<long long>(D),
              static_cast<long long>(o.ffn));
  print_link(links.at("model"), T, dist::CollectiveKind::AllGather, static_cast<uint64_t>(B * D) * sizeof(float), local_s);
  auto my_columns = [&](int r) {  // [B, DC_r]
    return std::make_shared<tensor::Tensor>(nn::slice_columns(c.a.data(), B, D, {dist::even_split(D, T, r)}));
  };
  const Timing plain = measure(o, links, [&](dist::Device& dev) -> Call {
    auto l = c.layer(dev);
    dist::Group& g = dev.world();
    auto mine = my_columns(g.rank());
    auto blocks = std::make_shared<std::vector<float>>(static_cast<size_t>(B * D));  // [T][B, DC_m]
    auto whole = std::make_shared<std::vector<float>>(blocks->size());                // [B, D]
    std::vector<int64_t> counts = dist::even_split_counts(D, T);
    for (int64_t& n : counts) n *= B;
    return [=, &g](std::vector<float>& out) {
      g.all_gather_v(std::span<const float>(mine->data(), static_cast<size_t>(mine->numel())), *blocks, counts);
      const float* block = blocks->data();
      for (int m = 0; m < T; ++m) {  // the gathered blocks into A's own layout
        const dist::Range cols = dist::even_split(D, T, m);
        for (int64_t n = 0; n < B; ++n) std::copy(block + n * cols.count, block + (n + 1) * cols.count, whole->data() + n * D + cols.offset);
        block += B * cols.count;
      }
      out.resize(static_cast<size_t>(B * l->out_features()));
      l->forward(out.data(), whole->data(), B);
    };
  });
  auto overlapped = [&](const dist::LinkSpec& over) {
    return measure(o, over, [&](dist::Device& dev) -> Call {
      auto l = c.layer(dev);
      dist::Group& g = dev.world();
      auto mine = my_columns(g.rank());
      return [l, mine, &g, B](std::vector<float>& out) {
        out.resize(static_cast<size_t>(B * l->out_features()));
        nn::all_gather_contracting_matmul(out.data(), mine->data(), B, *l, g);
      };
    });
  };
  const Timing one_way = overlapped(links), unmodelled = overlapped({});
  print_row("unsharded", local_s, local_s);
  print_row("all-gather then matmul", plain.median_s, local_s);
  print_row("overlapped", one_way.median_s, local_s);
  print_row("overlapped, link unmodelled", unmodelled.median_s, local_s);
  std::printf("  max |overlapped - all-gather then matmul| on device 0: %.3g\n", max_abs_diff(one_way.out0, plain.out0));
}

// The model's case (sequence parallelism): A's rows are dealt out, A[B@model, D].
void bench_rows(const Case& c, const dist::LinkSpec& links, double local_s, const std::string& trace_path) {
  const Options& o = c.o;
  const int T = o.devices;
  const int64_t B = o.batch, D = o.dim;
  std::printf("all-gather matmul, sequence-parallel case (the model's): A[%lld@model, %lld] @ W[%lld, %lld@model]; "
              "every chunk product packs all of W_local again\n", static_cast<long long>(B), static_cast<long long>(D),
              static_cast<long long>(D), static_cast<long long>(o.ffn));
  std::vector<int64_t> counts = dist::even_split_counts(B, T);  // floats each device contributes
  for (int64_t& n : counts) n *= D;
  const Timing plain = measure(o, links, [&](dist::Device& dev) -> Call {
    auto l = c.layer(dev);
    const dist::Range r = dist::even_split(B, T, dev.world().rank());
    auto mine = std::span<const float>(c.a).subspan(static_cast<size_t>(r.offset * D), static_cast<size_t>(r.count * D));
    auto whole = std::make_shared<std::vector<float>>(static_cast<size_t>(B * D));  // [B, D]
    dist::Group& g = dev.world();
    return [l, mine, whole, &g, &counts, B](std::vector<float>& out) {
      g.all_gather_v(mine, *whole, counts);
      out.resize(static_cast<size_t>(B * l->out_features()));
      l->forward(out.data(), whole->data(), B);
    };
  });
  auto overlapped = [&](nn::Ring ring, dist::Trace* tr, const dist::LinkSpec& over) {
    return measure(o, over, [&, ring](dist::Device& dev) -> Call {
      auto l = c.layer(dev);
      const float* mine = c.a.data() + dist::even_split(B, T, dev.world().rank()).offset * D;
      dist::Group& g = dev.world();
      return [l, mine, &g, ring, B](std::vector<float>& out) {
        out.resize(static_cast<size_t>(B * l->out_features()));
        nn::all_gather_matmul(out.data(), mine, B, *l, g, ring);
      };
    }, tr);
  };
  // The overlapped form's T chunk products alone, straight from A (no ppermute, no copies, no
  // worker thread): what cutting the product into chunks costs by itself.
  const Timing chunks_alone = measure(o, {}, [&](dist::Device& dev) -> Call {
    auto l = c.layer(dev);
    const int r = dev.world().rank();
    return [&c, l, B, D, T, r](std::vector<float>& out) {
      const int64_t OL = l->out_features();
      out.resize(static_cast<size_t>(B * OL));
      for (int s = 0; s < T; ++s) {
        const dist::Range chunk = dist::even_split(B, T, ((r - s) % T + T) % T);
        l->forward(out.data() + chunk.offset * OL, c.a.data() + chunk.offset * D, chunk.count);
      }
    };
  });
  std::optional<dist::Trace> trace;
  const Timing one_way = overlapped(nn::Ring::OneWay, trace_path.empty() ? nullptr : &trace.emplace(), links);
  const Timing two_way = overlapped(nn::Ring::TwoWay, nullptr, links);
  const Timing chunked = overlapped(nn::Ring::OneWay, nullptr, {});  // same chunk products, link not modelled
  if (trace) write_trace(*trace, trace_path, "one-way overlapped runs' transfers, waits");
  print_row("all-gather then matmul", plain.median_s, local_s);
  print_row("overlapped", one_way.median_s, local_s);
  print_row("overlapped (two-way ring)", two_way.median_s, local_s);
  print_row("overlapped, link unmodelled", chunked.median_s, local_s);
  print_row("chunk products alone", chunks_alone.median_s, local_s);
  std::printf("  max |overlapped - all-gather then matmul| on device 0: %.3g (one-way), %.3g (two-way)\n",
              max_abs_diff(one_way.out0, plain.out0), max_abs_diff(two_way.out0, plain.out0));
}

void bench_all_gather(const Options& o, const dist::LinkSpec& given) {
  const int64_t B = o.batch, D = o.dim, F = o.ffn;
  const Case c{o, nn::Linear(tensor::Tensor({F, D}, random_floats(F * D, 1))), random_floats(B * D, 2)};
  // unsharded: A already whole on every device, the local product A[B, D] @ W_local with no
  // communication: the time both overlapped forms aim for.
  const Timing local = measure(o, {}, [&](dist::Device& dev) -> Call {
    auto l = c.layer(dev);
    return [&c, l, B](std::vector<float>& out) {
      out.resize(static_cast<size_t>(B * l->out_features()));  // [B, F_local]
      l->forward(out.data(), c.a.data(), B);
    };
  });
  const uint64_t bytes = static_cast<uint64_t>(B * D) * sizeof(float);
  const dist::LinkSpec links{{"model", pick_link(o, given, bytes, local.median_s)}};
  bench_contracting(c, links, local.median_s);
  bench_rows(c, links, local.median_s, o.trace);
}

void run(const Options& o) {
  if (o.devices < 1 || o.batch < o.devices || o.dim < 1 || o.ffn < o.devices || o.reps < 1 || !(o.comm_ratio > 0))
    throw UsageError("bench collective-matmul: need --devices >= 1, --batch and --ffn >= devices, --dim >= 1, --reps >= 1, "
                     "--comm-ratio > 0");
  RunFlags flags;
  flags.links = o.links;
  const dist::LinkSpec given = links_from_flags(flags);
  for (const auto& [axis, link] : given)
    if (axis != "model") throw UsageError("bench collective-matmul: --link " + axis + ": the mesh has only the axis 'model'");
  std::printf("tpcli bench collective-matmul: median of %d (slowest device per run); times include the modelled link\n",
              o.reps);
  bench_all_gather(o, given);
}

void setup(CLI::App& sub) {
  auto o = std::make_shared<Options>();
  sub.add_option("--devices", o->devices, "devices on the model axis")->capture_default_str();
  sub.add_option("--batch", o->batch, "B: rows of A (JAX example: 1024)")->capture_default_str();
  sub.add_option("--dim", o->dim, "D: contraction dim (JAX example: 2048)")->capture_default_str();
  sub.add_option("--ffn", o->ffn, "F: output dim (JAX example: 8192)")->capture_default_str();
  sub.add_option("--reps", o->reps, "timed repetitions (median reported)")->capture_default_str();
  sub.add_option("--comm-ratio", o->comm_ratio, "without --link: modelled communication / local product time")
      ->capture_default_str();
  sub.add_option("--link", o->links, "model the model axis: GBPS,US[,ring|switch], e.g. model=1,10")
      ->type_name("model=GBPS,US[,ring|switch]");
  sub.add_option("--trace", o->trace, "write a Chrome-trace JSON of the one-way overlapped runs")->type_name("FILE");
  sub.callback([o] { run(*o); });
}

const bool registered = register_bench(
    {"collective-matmul", "JAX's collective matmul: all-gather then matmul vs overlapped, under a modelled link", setup});

}  // namespace

}  // namespace tpcli::cli

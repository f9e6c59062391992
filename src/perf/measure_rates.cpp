// tpcli::perf — the rates a prediction prices work at, measured on this machine (see measure_rates.h).
#include "perf/measure_rates.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <stdexcept>

#include "distributed/runtime.h"
#include "model/packed_weights.h"
#include "nn/attention.h"
#include "nn/rmsnorm.h"
#include "nn/rope.h"
#include "perf/stats.h"
#include "tensor/aligned_storage.h"
#include "tensor/blas.h"
#include "tensor/packed_matrix.h"
#include "tensor/vec_math.h"

namespace tpcli::perf {

namespace {

using Clock = std::chrono::steady_clock;

// Calls `once` until `seconds` have passed (at least three times); returns the median call's
// seconds: like the benches' median step, so a burst of other work on a shared machine moves the
// prediction no more than it moves the measured step.
template <class F>
double seconds_per_call(F&& once, double seconds) {
  once();  // warm-up: BLIS buffers, caches
  const auto t0 = Clock::now();
  std::vector<double> calls;
  for (auto last = t0; calls.size() < 3 || std::chrono::duration<double>(last - t0).count() < seconds;) {
    once();
    const auto now = Clock::now();
    calls.push_back(std::chrono::duration<double>(now - last).count());
    last = now;
  }
  return median(std::move(calls));
}

std::vector<float> random_floats(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

dist::Group& group_of(model::Role role, const PlanMesh& m, dist::Device& dev) {
  return role == model::Role::Tensor ? dev.axis(m.tensor_axis) : role == model::Role::Data ? dev.axis(m.data_axis) : dev.world();
}

// One call of `p` as the model and the optimizer make it: all_sum / all_max over `floats`,
// all_gather into `floats` (each member's even share in), reduce_scatter of `floats` (a share out).
void run_collective(const model::PlannedCollective& p, dist::Group& g, std::vector<float>& whole, std::vector<float>& share) {
  const auto counts = dist::even_split_counts(p.floats, g.size());
  const auto mine = static_cast<size_t>(counts[static_cast<size_t>(g.rank())]);
  const std::string_view name = p.name;
  if (name == "all_sum") g.all_sum(whole);
  else if (name == "all_max") g.all_max(whole);
  else if (name == "all_gather") g.all_gather_v(std::span<const float>(share.data(), mine), whole, counts);
  else if (name == "reduce_scatter") g.reduce_scatter_v(whole, std::span<float>(share.data(), mine), counts);
  else throw std::logic_error(std::string("plan report: no way to run collective ") + p.name);
}

// Seconds per call of each distinct collective of `comm` (collective_key), the slowest device's,
// run on the mesh's groups under its modelled links (distributed/links.h: the backend holds a call until
// its modelled end, waking a little after it).
std::map<std::string, double> measure_collectives(const std::vector<model::PlannedCollective>& comm, const PlanMesh& m,
                                                  double seconds) {
  std::vector<const model::PlannedCollective*> distinct;
  for (const auto& c : comm)
    if (std::none_of(distinct.begin(), distinct.end(), [&](auto* d) { return collective_key(*d) == collective_key(c); }))
      distinct.push_back(&c);
  std::vector<std::vector<double>> took(distinct.size(), std::vector<double>(static_cast<size_t>(m.devices())));
  if (distinct.empty()) return {};
  const dist::Mesh mesh({{m.data_axis, m.data}, {m.tensor_axis, m.tensor}});
  dist::RunOptions options;
  options.links = m.links;  // the backend holding each call until its modelled end, as in the run
  dist::run_on_mesh(mesh, [&](dist::Device& dev) {
    for (size_t i = 0; i < distinct.size(); ++i) {
      const model::PlannedCollective& p = *distinct[i];
      dist::Group& g = group_of(p.role, m, dev);
      std::vector<float> whole(static_cast<size_t>(p.floats), 1.0f), share(whole.size());
      dev.world().barrier();
      run_collective(p, g, whole, share);  // warm-up, and a first measure of its time
      const auto t0 = Clock::now();
      run_collective(p, g, whole, share);
      // the same count of calls on every device (each deciding by its own clock would not match)
      auto reps = static_cast<int32_t>(std::clamp(seconds / std::max(std::chrono::duration<double>(Clock::now() - t0).count(), 1e-7), 2.0, 200.0));
      dev.world().all_max(std::span<int32_t>(&reps, 1));
      dev.world().barrier();
      const auto t1 = Clock::now();
      for (int r = 0; r < static_cast<int>(reps); ++r) run_collective(p, g, whole, share);
      took[i][static_cast<size_t>(dev.rank())] = std::chrono::duration<double>(Clock::now() - t1).count() / static_cast<int>(reps);
    }
  }, options);
  std::map<std::string, double> out;
  for (size_t i = 0; i < distinct.size(); ++i)
    out[collective_key(*distinct[i])] = *std::max_element(took[i].begin(), took[i].end());
  return out;
}

// Seconds of one attention call at the item's shape, on random q, k, v (and output gradients).
double time_attention_call(const model::PlannedWork& w, std::mt19937& rng, double seconds) {
  std::vector<int> kv_of(static_cast<size_t>(w.heads));  // [NH] as model/shard_plan.h pairs them
  for (int64_t h = 0; h < w.heads; ++h) kv_of[static_cast<size_t>(h)] = static_cast<int>(h / (w.heads / w.kv_heads));
  const nn::AttentionShape shape{static_cast<int>(w.heads), static_cast<int>(w.kv_heads), static_cast<int>(w.head_size), kv_of};
  const int64_t B = w.m, T = w.n, N = B * T;
  const auto qkv = random_floats(static_cast<size_t>(N * shape.qkv_dim()), rng);    // [N, QL + 2 KVL]
  const auto dout = random_floats(static_cast<size_t>(N * shape.q_dim()), rng);     // [N, QL]
  std::vector<float> out(static_cast<size_t>(N * shape.q_dim())), dqkv(qkv.size());  // [N, QL], [N, QL + 2 KVL]
  std::vector<float> att(static_cast<size_t>(B * w.heads * T * T));                // [B, NH, T, T]
  nn::attention_forward(out.data(), att.data(), qkv.data(), B, T, shape);  // the backward reads att
  if (w.op == model::PlannedWork::Op::AttentionForward)
    return seconds_per_call([&] { nn::attention_forward(out.data(), att.data(), qkv.data(), B, T, shape); }, seconds);
  return seconds_per_call([&] { nn::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, shape); },
                          seconds);
}

// Seconds of one rmsnorm call over [N, C] (forward: out, rstd from x; backward: dx, dweight from dy).
double time_rmsnorm_call(const model::PlannedWork& w, std::mt19937& rng, double seconds) {
  const int64_t N = w.m, C = w.n;
  const auto x = random_floats(static_cast<size_t>(N * C), rng), dy = random_floats(x.size(), rng);  // [N, C]
  const auto weight = random_floats(static_cast<size_t>(C), rng);                                   // [C]
  std::vector<float> out(x.size()), dweight(weight.size()), rstd(static_cast<size_t>(N));           // [N, C], [C], [N]
  nn::rmsnorm_forward(out.data(), rstd.data(), x.data(), weight.data(), N, C, 1e-5f);
  if (w.op == model::PlannedWork::Op::RmsNormForward)
    return seconds_per_call([&] { nn::rmsnorm_forward(out.data(), rstd.data(), x.data(), weight.data(), N, C, 1e-5f); },
                            seconds);
  return seconds_per_call(
      [&] { nn::rmsnorm_backward(out.data(), dweight.data(), dy.data(), x.data(), weight.data(), rstd.data(), N, C); },
      seconds);
}

// Seconds of RoPE over N rows of q|k (rows at positions 0..T-1 in turn), as model/llama.cpp does.
double time_rope_call(const model::PlannedWork& w, std::mt19937& rng, double seconds) {
  const int64_t N = w.m, T = w.n, QL = w.heads * w.head_size, QK = QL + w.kv_heads * w.head_size;
  const nn::RopeTable rope(static_cast<int>(T), static_cast<int>(w.head_size), 10000.0f);
  auto qk = random_floats(static_cast<size_t>(N * QK), rng);  // [N, QL + KVL]
  const bool forward = w.op == model::PlannedWork::Op::RopeForward;
  return seconds_per_call([&] {
    for (int64_t n = 0; n < N; ++n) {
      float* row = qk.data() + n * QK;
      const int pos = static_cast<int>(n % T);
      if (forward) {
        rope.forward(row, static_cast<int>(w.heads), pos);
        rope.forward(row + QL, static_cast<int>(w.kv_heads), pos);
      } else {
        rope.backward(row, static_cast<int>(w.heads), pos);
        rope.backward(row + QL, static_cast<int>(w.kv_heads), pos);
      }
    }
  }, seconds);
}

// Seconds of one gemm of `shape` {m, n, k, layout}. Copies of the operands, one after another,
// are taken in turn: a step's gemm finds its operands out of cache (its working set, the
// activations of every layer and the weights, is larger), so the rate is measured with them
// coming from memory, not hot from the previous call. Every device starts timing together (`world`).
double time_gemm(const std::array<int64_t, 4>& shape, std::mt19937& rng, double seconds, dist::Group& world) {
  constexpr size_t STREAM_BYTES = size_t{64} << 20;  // the copies in all: beyond the caches
  const auto [m, n, k, layout] = shape;
  const size_t A = static_cast<size_t>(m * k), B = static_cast<size_t>(n * k), C = static_cast<size_t>(m * n);
  const size_t copies = std::clamp<size_t>(STREAM_BYTES / (4 * (A + B + C)), 1, 64);
  std::vector<float> a = random_floats(A, rng), b = random_floats(B, rng);  // [copies, m, k], [copies, n, k] (or k, n)
  std::vector<float> c(C * copies);  // [copies, m, n], row-major, as the model's calls lay them out
  a.resize(A * copies), b.resize(B * copies);
  for (size_t j = 1; j < copies; ++j) {
    std::copy_n(a.begin(), A, a.begin() + static_cast<std::ptrdiff_t>(j * A));
    std::copy_n(b.begin(), B, b.begin() + static_cast<std::ptrdiff_t>(j * B));
  }
  const bool ta = layout == static_cast<int64_t>(model::PlannedWork::Gemm::TN);
  const bool tb = layout == static_cast<int64_t>(model::PlannedWork::Gemm::NT);
  using tensor::Trans;
  size_t turn = 0;
  world.barrier();
  return seconds_per_call([&] {
    const size_t j = turn++ % copies;
    tensor::gemm(ta ? Trans::Yes : Trans::No, tb ? Trans::Yes : Trans::No, m, n, k, 1.0f, a.data() + j * A, ta ? m : k,
                 b.data() + j * B, tb ? k : n, 0.0f, c.data() + j * C, n);
  }, seconds);
}

double time_call(const model::PlannedWork& w, std::mt19937& rng, double seconds) {
  using Op = model::PlannedWork::Op;
  switch (w.op) {
    case Op::AttentionForward:
    case Op::AttentionBackward: return time_attention_call(w, rng, seconds);
    case Op::RmsNormForward:
    case Op::RmsNormBackward: return time_rmsnorm_call(w, rng, seconds);
    case Op::RopeForward:
    case Op::RopeBackward: return time_rope_call(w, rng, seconds);
  }
  return 0;
}

}  // namespace

WorkRates measure_work_rates(const std::vector<model::PlannedWork>& work, const std::vector<model::PlannedCollective>& comm,
                             const PlanMesh& mesh, int blas_threads, double given_gflops, double seconds) {
  const int devices = mesh.devices();
  std::vector<std::array<int64_t, 4>> shapes;  // distinct gemm_key, in order
  std::vector<int64_t> classes;
  std::vector<const model::PlannedWork*> calls;  // distinct call_key, in order
  bool exps = false;
  for (const auto& w : work) {
    if (w.kind == model::PlannedWork::Kind::Call &&
        std::none_of(calls.begin(), calls.end(), [&](auto* c) { return call_key(*c) == call_key(w); }))
      calls.push_back(&w);
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
  std::vector<std::vector<double>> call_seconds(calls.size(), std::vector<double>(D));
  constexpr int64_t EXP_N = 4096;
  dist::RunOptions options;
  options.blas_threads = blas_threads;
  dist::run_on_mesh(dist::Mesh::line(devices), [&](dist::Device& dev) {
    const auto d = static_cast<size_t>(dev.rank());
    std::mt19937 rng(static_cast<uint32_t>(dev.rank()));
    for (size_t i = 0; i < shapes.size(); ++i) {
      shape_s[i][d] = time_gemm(shapes[i], rng, seconds, dev.world());
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
    for (size_t i = 0; i < calls.size(); ++i) {
      dev.world().barrier();
      call_seconds[i][d] = time_call(*calls[i], rng, seconds);
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
  for (size_t i = 0; i < calls.size(); ++i) r.call_s[call_key(*calls[i])] = slowest(call_seconds[i]);
  r.collective_s = measure_collectives(comm, mesh, seconds);
  return r;
}

namespace {


// A [rows, cols] matrix in `format` to time: w quantized, or for the ggml block types (which tpcli
// reads but does not write, save Q8_0) blocks of zero bytes, which its kernels read as they read
// any other (no branch depends on a value).
tensor::PackedMatrix sample_matrix(const std::vector<float>& w, int64_t rows, int64_t cols, const tensor::WeightFormat& format) {
  if (format.kind != tensor::WeightKind::Ggml) return tensor::PackedMatrix::from_f32(w.data(), rows, cols, format);
  const std::vector<uint8_t> zeros(static_cast<size_t>(rows * format.row_bytes(cols)), 0);
  tensor::PackedMatrix::Parts parts;
  parts.data = zeros.data();
  return tensor::PackedMatrix::copy_of(format, rows, cols, parts, 0, rows);
}

// Seconds of the median pass of the slowest device, each pass one `stream` over copies of one
// [rows, cols] matrix (distinct copies, `stream_bytes` in all, so they come from memory).
double time_matvec_passes(const model::PlannedWork& item, const tensor::WeightFormat& format, bool packed, int devices,
                          int threads, int64_t stream_bytes, int64_t& streamed) {
  constexpr int PASSES = 7;
  const int64_t rows = item.m, cols = model::held_columns(format, {0, item.k}).count;  // device 0's whole groups
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
    const tensor::PackedMatrix first = packed ? sample_matrix(w, rows, cols, format) : tensor::PackedMatrix{};
    const int64_t each = packed ? first.bytes() : rows * cols * 4;
    for (int64_t held = 0; held < std::max(stream_bytes, each); held += each) {
      if (packed) set.push_back(first);
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
  return median(slowest);
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

}  // namespace tpcli::perf

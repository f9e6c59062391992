// Collective checks against serial references, reusable by every backend.
//
// Each check runs *inside* a member's body: it builds this member's input from a shared seed,
// calls the collective, rebuilds every member's input from the same seed, computes the serial
// reference and throws std::runtime_error naming the op, sizes, member and element on a mismatch.
// Nothing is shared between members, so the checks work for threads and for processes alike; a
// backend's test only needs a RunGroup that runs a body on every member of an N-member group and
// propagates the first exception (run_on_mesh does: DeviceError).
//
// S = group size, r = this member's rank in the group, n = floats per member.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "distributed/group.h"
#include "tensor/quant_formats.h"

namespace tpcli::testing {

using dist::Group;

// Runs body(group) on every member of a group of `members` devices; throws the first failure.
using RunGroup = std::function<void(int members, const std::function<void(Group&)>& body)>;

// Member m's input for a check with this seed: n floats uniform in [-1, 1), from a seeded mt19937.
inline std::vector<float> member_input(uint64_t seed, int member, int64_t n) {
  std::mt19937 rng(static_cast<uint32_t>(seed * 1000003u + static_cast<uint64_t>(member) * 7919u + 17u));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = dist(rng);
  return x;
}

// Throws on the first element where |got - want| > tol (tol = 0: exact; NaN never matches).
inline void expect_close(const std::string& what, std::span<const float> got, std::span<const float> want, float tol,
                         int rank) {
  std::ostringstream os;
  if (got.size() != want.size()) {
    os << what << ": member " << rank << " got " << got.size() << " floats, expected " << want.size();
    throw std::runtime_error(os.str());
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::fabs(got[i] - want[i]) <= tol)) {
      os << what << ": member " << rank << " element " << i << " = " << got[i] << ", expected " << want[i];
      throw std::runtime_error(os.str());
    }
  }
}

inline std::string label(const char* op, const Group& g, int64_t n) {
  return std::string(op) + " (S=" + std::to_string(g.size()) + ", n=" + std::to_string(n) + ")";
}

// Serial reduction in member order.
inline std::vector<float> serial_sum(uint64_t seed, int S, int64_t n) {
  std::vector<float> ref(static_cast<size_t>(n), 0.0f);
  for (int m = 0; m < S; ++m) {
    std::vector<float> x = member_input(seed, m, n);
    for (size_t i = 0; i < ref.size(); ++i) ref[i] += x[i];
  }
  return ref;
}

// Members lo..hi-1's inputs summed as a balanced binary tree in rank order (the first half's sum
// plus the second half's, an odd count's extra member in the second half): what an all_sum gives
// on every backend, bit for bit (one device per process).
inline std::vector<float> tree_sum(uint64_t seed, int lo, int hi, int64_t n) {
  if (hi - lo == 1) return member_input(seed, lo, n);
  const int mid = lo + (hi - lo) / 2;
  std::vector<float> sum = tree_sum(seed, lo, mid, n);
  const std::vector<float> right = tree_sum(seed, mid, hi, n);
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += right[i];
  return sum;
}

inline float sum_tol(int S) { return 1e-5f * static_cast<float>(S); }

inline void check_all_sum(Group& g, int64_t n, uint64_t seed) {
  std::vector<float> x = member_input(seed, g.rank(), n);
  g.all_sum(x);
  expect_close(label("all_sum", g, n), x, serial_sum(seed, g.size(), n), sum_tol(g.size()), g.rank());
}

inline void check_mean(Group& g, int64_t n, uint64_t seed) {
  std::vector<float> x = member_input(seed, g.rank(), n);
  g.mean(x);
  std::vector<float> ref = serial_sum(seed, g.size(), n);
  for (float& v : ref) v /= static_cast<float>(g.size());
  expect_close(label("mean", g, n), x, ref, sum_tol(g.size()), g.rank());
}

inline void check_all_max(Group& g, int64_t n, uint64_t seed) {
  std::vector<float> x = member_input(seed, g.rank(), n);
  g.all_max(x);
  std::vector<float> ref(static_cast<size_t>(n), -std::numeric_limits<float>::infinity());
  for (int m = 0; m < g.size(); ++m) {
    std::vector<float> y = member_input(seed, m, n);
    for (size_t i = 0; i < ref.size(); ++i) ref[i] = std::max(ref[i], y[i]);
  }
  expect_close(label("all_max", g, n), x, ref, 0.0f, g.rank());
}

// Output buffers start as NaN so an element the collective forgot to write fails the check.
inline std::vector<float> nan_buffer(int64_t n) {
  return std::vector<float>(static_cast<size_t>(n), std::numeric_limits<float>::quiet_NaN());
}

inline void check_all_gather(Group& g, int64_t n, uint64_t seed) {
  std::vector<float> in = member_input(seed, g.rank(), n), out = nan_buffer(n * g.size()), ref;
  g.all_gather(in, out);
  for (int m = 0; m < g.size(); ++m) {
    std::vector<float> y = member_input(seed, m, n);
    ref.insert(ref.end(), y.begin(), y.end());
  }
  expect_close(label("all_gather", g, n), out, ref, 0.0f, g.rank());
}

// Counts every member derives from the shared seed: uniform in [0, max_count], some forced to zero.
inline std::vector<int64_t> shared_counts(uint64_t seed, int S, int64_t max_count) {
  std::mt19937 rng(static_cast<uint32_t>(seed ^ 0x9e3779b9u));
  std::uniform_int_distribution<int64_t> count(0, max_count);
  std::vector<int64_t> counts(static_cast<size_t>(S));
  for (int64_t& c : counts) c = rng() % 4 == 0 ? 0 : count(rng);
  return counts;
}

inline void check_all_gather_v(Group& g, int64_t max_count, uint64_t seed) {
  const std::vector<int64_t> counts = shared_counts(seed, g.size(), max_count);
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  std::vector<float> in = member_input(seed, g.rank(), counts[static_cast<size_t>(g.rank())]);
  std::vector<float> out = nan_buffer(total), ref;
  g.all_gather_v(in, out, counts);
  for (int m = 0; m < g.size(); ++m) {
    std::vector<float> y = member_input(seed, m, counts[static_cast<size_t>(m)]);
    ref.insert(ref.end(), y.begin(), y.end());
  }
  expect_close(label("all_gather_v", g, total), out, ref, 0.0f, g.rank());
}

inline void check_reduce_scatter(Group& g, int64_t n, uint64_t seed) {
  const dist::Range mine = dist::even_split(n, g.size(), g.rank());
  std::vector<float> in = member_input(seed, g.rank(), n), out = nan_buffer(mine.count);
  g.reduce_scatter(in, out);
  const std::vector<float> sum = serial_sum(seed, g.size(), n);
  const std::vector<float> ref(sum.begin() + mine.offset, sum.begin() + mine.offset + mine.count);
  expect_close(label("reduce_scatter", g, n), out, ref, sum_tol(g.size()), g.rank());
}

// Ragged chunks (some empty) from the shared seed: member m keeps counts[m] floats of the sum.
inline void check_reduce_scatter_v(Group& g, int64_t max_count, uint64_t seed) {
  const std::vector<int64_t> counts = shared_counts(seed, g.size(), max_count);
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  const int64_t offset = std::accumulate(counts.begin(), counts.begin() + g.rank(), int64_t{0});
  const int64_t mine = counts[static_cast<size_t>(g.rank())];
  std::vector<float> in = member_input(seed, g.rank(), total), out = nan_buffer(mine);
  g.reduce_scatter_v(in, out, counts);
  const std::vector<float> sum = serial_sum(seed, g.size(), total);
  const std::vector<float> ref(sum.begin() + offset, sum.begin() + offset + mine);
  expect_close(label("reduce_scatter_v", g, total), out, ref, sum_tol(g.size()), g.rank());
}

// chunk floats go from every member to every member.
inline void check_all_to_all(Group& g, int64_t chunk, uint64_t seed) {
  const int S = g.size(), r = g.rank();
  std::vector<float> in = member_input(seed, r, chunk * S), out = nan_buffer(chunk * S), ref;
  g.all_to_all(in, out);
  for (int m = 0; m < S; ++m) {
    std::vector<float> y = member_input(seed, m, chunk * S);
    ref.insert(ref.end(), y.begin() + r * chunk, y.begin() + (r + 1) * chunk);
  }
  expect_close(label("all_to_all", g, chunk * S), out, ref, 0.0f, r);
}

// counts[src][dst] from the shared seed, uniform in [0, max_count] with many zeros.
inline void check_all_to_all_v(Group& g, int64_t max_count, uint64_t seed) {
  const int S = g.size(), r = g.rank();
  std::vector<std::vector<int64_t>> counts;  // [S][S]
  for (int m = 0; m < S; ++m) counts.push_back(shared_counts(seed + static_cast<uint64_t>(m) * 31u, S, max_count));
  auto input_of = [&](int m) {
    const auto& c = counts[static_cast<size_t>(m)];
    return member_input(seed, m, std::accumulate(c.begin(), c.end(), int64_t{0}));
  };
  std::vector<float> in = input_of(r), ref;
  std::vector<int64_t> recv_counts;
  std::vector<float> out = g.all_to_all_v(in, counts[static_cast<size_t>(r)], recv_counts);
  std::vector<int64_t> want_counts;
  for (int m = 0; m < S; ++m) {
    const auto& c = counts[static_cast<size_t>(m)];
    const int64_t off = std::accumulate(c.begin(), c.begin() + r, int64_t{0});
    std::vector<float> y = input_of(m);
    ref.insert(ref.end(), y.begin() + off, y.begin() + off + c[static_cast<size_t>(r)]);
    want_counts.push_back(c[static_cast<size_t>(r)]);
  }
  if (recv_counts != want_counts)
    throw std::runtime_error(label("all_to_all_v", g, static_cast<int64_t>(in.size())) + ": member " +
                             std::to_string(r) + " got wrong receive counts");
  expect_close(label("all_to_all_v", g, static_cast<int64_t>(in.size())), out, ref, 0.0f, r);
}

// A random permutation of the members from the shared seed; `partial` drops about half the pairs.
inline dist::Perm shared_perm(uint64_t seed, int S, bool partial) {
  std::mt19937 rng(static_cast<uint32_t>(seed * 2654435761u + 1u));
  std::vector<int> dst(static_cast<size_t>(S));
  std::iota(dst.begin(), dst.end(), 0);
  std::shuffle(dst.begin(), dst.end(), rng);
  dist::Perm perm;
  for (int m = 0; m < S; ++m)
    if (!partial || rng() % 2 == 0) perm.emplace_back(m, dst[static_cast<size_t>(m)]);
  std::shuffle(perm.begin(), perm.end(), rng);  // order of pairs must not matter
  return perm;
}

inline void check_ppermute(Group& g, int64_t n, uint64_t seed, bool partial) {
  const dist::Perm perm = shared_perm(seed, g.size(), partial);
  std::vector<float> in = member_input(seed, g.rank(), n), out = nan_buffer(n);
  g.ppermute(in, out, perm);
  std::vector<float> ref(static_cast<size_t>(n), 0.0f);
  for (const auto& [src, dst] : perm)
    if (dst == g.rank()) ref = member_input(seed, src, n);
  expect_close(label(partial ? "ppermute (partial)" : "ppermute", g, n), out, ref, 0.0f, g.rank());
}

inline void check_broadcast(Group& g, int64_t n, int root, uint64_t seed) {
  std::vector<float> x = member_input(seed, g.rank(), n);
  g.broadcast(x, root);
  expect_close(label("broadcast", g, n), x, member_input(seed, root, n), 0.0f, g.rank());
}

// ---- typed collectives: int32, bf16, bytes ----

// Member m's int32 input: uniform in [-2^27, 2^27], beyond f32's exact integers (2^24), so an f32
// sum would round them; a sum over 8 members stays inside int32.
inline std::vector<int32_t> member_ints(uint64_t seed, int member, int64_t n) {
  std::mt19937 rng(static_cast<uint32_t>(seed * 1000003u + static_cast<uint64_t>(member) * 7919u + 29u));
  std::uniform_int_distribution<int32_t> dist(-(1 << 27), 1 << 27);
  std::vector<int32_t> x(static_cast<size_t>(n));
  for (int32_t& v : x) v = dist(rng);
  return x;
}

// Member m's bf16 input: member_input rounded to bf16 (scaled so the members' magnitudes differ).
inline std::vector<dist::Bf16> member_bf16(uint64_t seed, int member, int64_t n) {
  std::vector<dist::Bf16> x;
  for (float v : member_input(seed, member, n)) x.push_back({tensor::f32_to_bf16(v * static_cast<float>(1 + member))});
  return x;
}

inline std::vector<float> widen(std::span<const dist::Bf16> x) {
  std::vector<float> out;
  for (dist::Bf16 v : x) out.push_back(tensor::bf16_to_f32(v.bits));
  return out;
}

template <class T>
void expect_equal(const std::string& what, std::span<const T> got, std::span<const T> want, int rank) {
  std::ostringstream os;
  if (got.size() != want.size()) {
    os << what << ": member " << rank << " got " << got.size() << " elements, expected " << want.size();
    throw std::runtime_error(os.str());
  }
  for (size_t i = 0; i < got.size(); ++i)
    if (!(got[i] == want[i])) {
      os << what << ": member " << rank << " element " << i << " differs, expected the reference's bits";
      throw std::runtime_error(os.str());
    }
}

// Members lo..hi-1's widened bf16 inputs summed as tree_sum does (the f32 all_sum's order).
inline std::vector<float> tree_sum_bf16(uint64_t seed, int lo, int hi, int64_t n) {
  if (hi - lo == 1) return widen(member_bf16(seed, lo, n));
  const int mid = lo + (hi - lo) / 2;
  std::vector<float> sum = tree_sum_bf16(seed, lo, mid, n);
  const std::vector<float> right = tree_sum_bf16(seed, mid, hi, n);
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += right[i];
  return sum;
}

// int32 all_sum and all_max: exact, against int64 sums and maxima in member order.
inline void check_int_reductions(Group& g, int64_t n, uint64_t seed) {
  const int S = g.size();
  std::vector<int32_t> sum = member_ints(seed, g.rank(), n), most = sum;
  g.all_sum(std::span<int32_t>(sum));
  g.all_max(std::span<int32_t>(most));
  std::vector<int64_t> ref_sum(static_cast<size_t>(n), 0);
  std::vector<int32_t> ref_max(static_cast<size_t>(n), std::numeric_limits<int32_t>::min()), want_sum;
  for (int m = 0; m < S; ++m) {
    const std::vector<int32_t> y = member_ints(seed, m, n);
    for (size_t i = 0; i < y.size(); ++i) {
      ref_sum[i] += y[i];
      ref_max[i] = std::max(ref_max[i], y[i]);
    }
  }
  for (int64_t v : ref_sum) want_sum.push_back(static_cast<int32_t>(v));
  expect_equal<int32_t>(label("all_sum int32", g, n), sum, want_sum, g.rank());
  expect_equal<int32_t>(label("all_max int32", g, n), most, ref_max, g.rank());
}

// bf16 all_sum: the serial tree sum of the widened values rounded once, and bit for bit what the
// f32 all_sum of the widened values rounds to; all_max: the largest value, exact.
inline void check_bf16_reductions(Group& g, int64_t n, uint64_t seed) {
  const int S = g.size();
  std::vector<dist::Bf16> sum = member_bf16(seed, g.rank(), n), most = sum;
  std::vector<float> wide = widen(sum);
  g.all_sum(std::span<dist::Bf16>(sum));
  g.all_sum(std::span<float>(wide));
  g.all_max(std::span<dist::Bf16>(most));
  std::vector<dist::Bf16> want_sum, via_f32, want_max(static_cast<size_t>(n), dist::Bf16{0xff80});  // -inf
  for (float v : tree_sum_bf16(seed, 0, S, n)) want_sum.push_back({tensor::f32_to_bf16(v)});
  for (float v : wide) via_f32.push_back({tensor::f32_to_bf16(v)});
  for (int m = 0; m < S; ++m) {
    const std::vector<dist::Bf16> y = member_bf16(seed, m, n);
    for (size_t i = 0; i < y.size(); ++i)
      if (tensor::bf16_to_f32(want_max[i].bits) < tensor::bf16_to_f32(y[i].bits)) want_max[i] = y[i];
  }
  expect_equal<dist::Bf16>(label("all_sum bf16", g, n), sum, want_sum, g.rank());
  expect_equal<dist::Bf16>(label("all_sum bf16 vs f32", g, n), sum, via_f32, g.rank());
  expect_equal<dist::Bf16>(label("all_max bf16", g, n), most, want_max, g.rank());
}

// int32 and bf16 all_gather_v (uneven counts, some zero) and all_gather, exact; out starts as a
// pattern no input has at the same place.
inline void check_typed_gathers(Group& g, int64_t max_count, uint64_t seed) {
  const int S = g.size(), r = g.rank();
  const std::vector<int64_t> counts = shared_counts(seed, S, max_count);
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  const std::vector<int32_t> ints = member_ints(seed, r, counts[static_cast<size_t>(r)]);
  const std::vector<dist::Bf16> halves = member_bf16(seed, r, counts[static_cast<size_t>(r)]);
  std::vector<int32_t> ints_out(static_cast<size_t>(total), -7), ints_ref;
  std::vector<dist::Bf16> halves_out(static_cast<size_t>(total), dist::Bf16{0x7fc1}), halves_ref;
  g.all_gather_v(std::span<const int32_t>(ints), std::span<int32_t>(ints_out), counts);
  g.all_gather_v(std::span<const dist::Bf16>(halves), std::span<dist::Bf16>(halves_out), counts);
  for (int m = 0; m < S; ++m) {
    const std::vector<int32_t> y = member_ints(seed, m, counts[static_cast<size_t>(m)]);
    const std::vector<dist::Bf16> h = member_bf16(seed, m, counts[static_cast<size_t>(m)]);
    ints_ref.insert(ints_ref.end(), y.begin(), y.end());
    halves_ref.insert(halves_ref.end(), h.begin(), h.end());
  }
  expect_equal<int32_t>(label("all_gather_v int32", g, total), ints_out, ints_ref, r);
  expect_equal<dist::Bf16>(label("all_gather_v bf16", g, total), halves_out, halves_ref, r);
  // Equal chunks, in place (this member's chunk of out is its input).
  const int64_t n = max_count;
  std::vector<int32_t> whole(static_cast<size_t>(n * S), -7), whole_ref;
  const std::vector<int32_t> own = member_ints(seed + 1, r, n);
  std::copy(own.begin(), own.end(), whole.begin() + r * n);
  g.all_gather(std::span<const int32_t>(whole.data() + r * n, static_cast<size_t>(n)), std::span<int32_t>(whole));
  for (int m = 0; m < S; ++m) {
    const std::vector<int32_t> y = member_ints(seed + 1, m, n);
    whole_ref.insert(whole_ref.end(), y.begin(), y.end());
  }
  expect_equal<int32_t>(label("all_gather int32 in place", g, n), whole, whole_ref, r);
  // Records of 6 bytes (no whole number of words).
  struct Record {
    int32_t id;
    uint16_t tag;
  };
  const auto records_of = [&](int member) {
    std::vector<std::byte> b;
    for (int32_t id : member_ints(seed + 2, member, n)) {
      const Record rec{id, static_cast<uint16_t>(id ^ member)};
      const auto* p = reinterpret_cast<const std::byte*>(&rec);
      b.insert(b.end(), p, p + 6);
    }
    return b;
  };
  const std::vector<std::byte> mine = records_of(r);
  std::vector<std::byte> records(mine.size() * static_cast<size_t>(S), std::byte{0x5a}), records_ref;
  g.all_gather(std::span<const std::byte>(mine), std::span<std::byte>(records));
  for (int m = 0; m < S; ++m) {
    const std::vector<std::byte> y = records_of(m);
    records_ref.insert(records_ref.end(), y.begin(), y.end());
  }
  expect_equal<std::byte>(label("all_gather bytes", g, 6 * n), records, records_ref, r);
}

// Raw bytes from `root` (a length that is no whole number of words), exact.
inline void check_byte_broadcast(Group& g, int64_t n, int root, uint64_t seed) {
  const auto bytes_of = [&](int member) {
    std::mt19937 rng(static_cast<uint32_t>(seed * 31u + static_cast<uint64_t>(member)));
    std::vector<std::byte> b(static_cast<size_t>(4 * n + 3));
    for (std::byte& v : b) v = static_cast<std::byte>(rng());
    return b;
  };
  std::vector<std::byte> x = bytes_of(g.rank());
  g.broadcast(std::span<std::byte>(x), root);
  const std::vector<std::byte> want = bytes_of(root);
  expect_equal<std::byte>(label("broadcast bytes", g, 4 * n + 3), x, want, g.rank());
}

inline void check_typed_collectives(Group& g, int64_t n, uint64_t seed) {
  check_int_reductions(g, n, seed + 1);
  check_bf16_reductions(g, n, seed + 2);
  check_typed_gathers(g, n, seed + 3);
  check_byte_broadcast(g, n, g.size() - 1, seed + 4);
  check_byte_broadcast(g, n, 0, seed + 5);
}

// Every collective once at length n (chunk-based ones with n per chunk or as the max count).
inline void check_every_collective(Group& g, int64_t n, uint64_t seed) {
  check_all_sum(g, n, seed + 1);
  check_all_max(g, n, seed + 2);
  check_mean(g, n, seed + 3);
  check_all_gather(g, n, seed + 4);
  check_all_gather_v(g, n, seed + 5);
  check_reduce_scatter(g, n, seed + 6);
  check_reduce_scatter_v(g, n, seed + 12);
  check_all_to_all(g, n, seed + 7);
  check_all_to_all_v(g, n, seed + 8);
  check_ppermute(g, n, seed + 9, false);
  check_ppermute(g, n, seed + 10, true);
  check_broadcast(g, n, g.size() - 1, seed + 11);
  check_typed_collectives(g, n, seed + 20);
  g.barrier();
}

// The started (asynchronous) forms, several in flight at once and interleaved with blocking calls:
// each result must equal the blocking form's bit for bit (same backend algorithm) and the serial
// reference. Waits happen out of start order on purpose.
inline void check_started_collectives(Group& g, int64_t n, uint64_t seed) {
  const int S = g.size(), r = g.rank();
  const dist::Range mine = dist::even_split(n, S, r);
  const dist::Perm perm = shared_perm(seed, S, false);
  // Blocking forms first: the results the started ones must reproduce.
  std::vector<float> sum_b = member_input(seed + 1, r, n), gather_b = nan_buffer(n * S), scatter_b = nan_buffer(mine.count),
                     perm_b = nan_buffer(n);
  const std::vector<float> gather_in = member_input(seed + 2, r, n), scatter_in = member_input(seed + 3, r, n),
                           perm_in = member_input(seed + 4, r, n);
  g.all_sum(sum_b);
  g.all_gather(gather_in, gather_b);
  g.reduce_scatter(scatter_in, scatter_b);
  g.ppermute(perm_in, perm_b, perm);
  // all_to_all needs S equal chunks: n rounded down to a multiple of S; broadcast from the last member.
  const int64_t n_a2a = n / S * S;
  const int root = S - 1;
  const std::vector<float> a2a_in = member_input(seed + 6, r, n_a2a);
  std::vector<float> a2a_b = nan_buffer(n_a2a), bcast_b = member_input(seed + 7, r, n);
  g.all_to_all(a2a_in, a2a_b);
  g.broadcast(bcast_b, root);

  std::vector<float> sum_a = member_input(seed + 1, r, n), gather_a = nan_buffer(n * S), scatter_a = nan_buffer(mine.count),
                     perm_a = nan_buffer(n), between = member_input(seed + 5, r, n);
  dist::Pending p_perm = g.start_ppermute(perm_in, perm_a, perm);
  dist::Pending p_gather = g.start_all_gather(gather_in, gather_a);
  g.all_sum(between);  // a blocking call while two started ones are in flight
  dist::Pending p_scatter = g.start_reduce_scatter(scatter_in, scatter_a);
  dist::Pending p_sum = g.start_all_sum(sum_a);
  std::vector<float> a2a_a = nan_buffer(n_a2a), bcast_a = member_input(seed + 7, r, n);
  dist::Pending p_a2a = g.start_all_to_all(a2a_in, a2a_a);
  dist::Pending p_bcast = g.start_broadcast(bcast_a, root);
  p_sum.wait();
  p_gather.wait();
  p_bcast.wait();
  p_scatter.wait();
  p_a2a.wait();
  p_perm.wait();
  expect_close(label("started all_to_all vs blocking", g, n), a2a_a, a2a_b, 0.0f, r);
  expect_close(label("started broadcast vs blocking", g, n), bcast_a, bcast_b, 0.0f, r);
  // all_to_all: chunk m of out is chunk r of member m's in; broadcast: the root's x everywhere.
  std::vector<float> a2a_ref;
  const int64_t chunk = n_a2a / S;
  for (int m = 0; m < S; ++m) {
    const std::vector<float> y = member_input(seed + 6, m, n_a2a);
    a2a_ref.insert(a2a_ref.end(), y.begin() + r * chunk, y.begin() + (r + 1) * chunk);
  }
  expect_close(label("started all_to_all", g, n), a2a_a, a2a_ref, 0.0f, r);
  expect_close(label("started broadcast", g, n), bcast_a, member_input(seed + 7, root, n), 0.0f, r);
  expect_close(label("started all_sum vs blocking", g, n), sum_a, sum_b, 0.0f, r);
  expect_close(label("started all_gather vs blocking", g, n), gather_a, gather_b, 0.0f, r);
  expect_close(label("started reduce_scatter vs blocking", g, n), scatter_a, scatter_b, 0.0f, r);
  expect_close(label("started ppermute vs blocking", g, n), perm_a, perm_b, 0.0f, r);
  // And against the serial references.
  expect_close(label("started all_sum", g, n), sum_a, serial_sum(seed + 1, S, n), sum_tol(S), r);
  expect_close(label("all_sum between started ones", g, n), between, serial_sum(seed + 5, S, n), sum_tol(S), r);
  std::vector<float> gather_ref;
  for (int m = 0; m < S; ++m) {
    const std::vector<float> y = member_input(seed + 2, m, n);
    gather_ref.insert(gather_ref.end(), y.begin(), y.end());
  }
  expect_close(label("started all_gather", g, n), gather_a, gather_ref, 0.0f, r);
  const std::vector<float> scatter_sum = serial_sum(seed + 3, S, n);
  expect_close(label("started reduce_scatter", g, n), scatter_a,
               std::vector<float>(scatter_sum.begin() + mine.offset, scatter_sum.begin() + mine.offset + mine.count),
               sum_tol(S), r);
  std::vector<float> perm_ref(static_cast<size_t>(n), 0.0f);
  for (const auto& [src, dst] : perm)
    if (dst == r) perm_ref = member_input(seed + 4, src, n);
  expect_close(label("started ppermute", g, n), perm_a, perm_ref, 0.0f, r);
}

// `ops` collectives back to back in an order and with sizes every member derives from `seed`.
// Sizes are log-uniform up to max_n, so both the small (staged) and the large paths are hit.
inline void check_random_sequence(Group& g, int ops, int64_t max_n, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<double> log_n(0.0, std::log(static_cast<double>(max_n) + 1.0));
  for (int i = 0; i < ops; ++i) {
    const int64_t n = static_cast<int64_t>(std::exp(log_n(rng))) - 1;
    const uint64_t s = rng();
    switch (rng() % 10) {
      case 0: check_all_sum(g, n, s); break;
      case 1: check_all_max(g, n, s); break;
      case 2: check_all_gather(g, n / g.size(), s); break;
      case 3: check_all_gather_v(g, n / g.size(), s); break;
      case 4:
        if (rng() % 2 == 0) check_reduce_scatter(g, n, s);
        else check_reduce_scatter_v(g, n / g.size(), s);
        break;
      case 5: check_all_to_all(g, n / g.size(), s); break;
      case 6: check_all_to_all_v(g, n / g.size(), s); break;
      case 7: check_ppermute(g, n, s, rng() % 2 == 0); break;
      case 8: check_broadcast(g, n, static_cast<int>(s % static_cast<uint64_t>(g.size())), s); break;
      default: g.barrier(); break;
    }
  }
}

}  // namespace tpcli::testing

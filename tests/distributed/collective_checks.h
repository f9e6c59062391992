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

// tpcli::nn — collective matmuls over started ppermutes (legend and schedule: collective_matmul.h).
#include "nn/collective_matmul.h"

#include <algorithm>
#include <span>
#include <vector>

namespace tpcli::nn {

namespace {

// Every member sends to its neighbour `step` ahead (+1 forward, -1 backward).
dist::Perm shift(int T, int step) {
  dist::Perm perm;
  for (int r = 0; r < T; ++r) perm.emplace_back(r, ((r + step) % T + T) % T);
  return perm;
}

int wrap(int c, int T) { return ((c % T) + T) % T; }

// Rows [first, first + count) of chunk c that a half covers: the top half is rows [0, NH) of the
// padded chunk, the bottom half [NH, NP); only rows below the chunk's real count are computed.
struct HalfRows {
  int64_t first = 0, count = 0;
};
HalfRows half_rows(int64_t chunk_count, int64_t NH, bool top) {
  const int64_t lo = top ? 0 : NH, hi = top ? NH : chunk_count;
  return {lo, std::max<int64_t>(0, std::min(hi, chunk_count) - lo)};
}

// A stream of padded row blocks moving round the ring by `step`: `held` is what this member works
// on now, `next` receives the block the ring brings next.
struct Stream {
  std::vector<float> held, next;  // [rows, width] each
  dist::Perm perm;
  dist::Pending moving;
  Stream(int64_t rows, int64_t width, int T, int step)
      : held(static_cast<size_t>(rows * width), 0.0f), next(held.size()), perm(shift(T, step)) {}
  void start(dist::Group& g) { moving = g.start_ppermute(held, next, perm); }
  void arrive() {
    moving.wait();
    held.swap(next);
  }
};

}  // namespace

void all_gather_matmul(float* out, const float* inp, int64_t N, const AllToShardedLinear& layer, dist::Group& group,
                       Ring ring) {
  const int T = group.size(), r = group.rank();
  const int64_t IN = layer.in_features(), OL = layer.out_features(), NP = (N + T - 1) / T;
  const int64_t NH = ring == Ring::TwoWay ? (NP + 1) / 2 : NP;  // rows per travelling block
  const dist::Range mine = dist::even_split(N, T, r);
  // The forward stream carries rows [0, NH) of each chunk; two-way, the backward one the rest.
  Stream fwd(NH, IN, T, +1), bwd(ring == Ring::TwoWay ? NP - NH : 0, IN, T, -1);
  std::copy(inp, inp + std::min(NH, mine.count) * IN, fwd.held.begin());
  if (ring == Ring::TwoWay && mine.count > NH) std::copy(inp + NH * IN, inp + mine.count * IN, bwd.held.begin());
  const bool two_way = ring == Ring::TwoWay && NP > NH;
  for (int s = 0; s < T; ++s) {
    const bool more = s + 1 < T;
    if (more) fwd.start(group);  // the next block moves while this one multiplies
    if (more && two_way) bwd.start(group);
    const dist::Range top = dist::even_split(N, T, wrap(r - s, T));
    const HalfRows t = half_rows(top.count, NH, true);
    if (t.count > 0) layer.forward(out + top.offset * OL, fwd.held.data(), t.count);
    if (two_way) {
      const dist::Range bottom = dist::even_split(N, T, wrap(r + s, T));
      const HalfRows b = half_rows(bottom.count, NH, false);
      if (b.count > 0) layer.forward(out + (bottom.offset + NH) * OL, bwd.held.data(), b.count);
    }
    if (more) fwd.arrive();
    if (more && two_way) bwd.arrive();
  }
}

void all_gather_contracting_matmul(float* out, const float* inp, int64_t N, const AllToShardedLinear& layer,
                                   dist::Group& group) {
  const int T = group.size(), r = group.rank();
  const int64_t IN = layer.in_features(), INP = (IN + T - 1) / T;  // INP: padded columns per chunk
  const dist::Range mine = dist::even_split(IN, T, r);
  Stream ring(N, INP, T, +1);  // held: [N, INP], this step's chunk of columns
  for (int64_t n = 0; n < N; ++n) std::copy(inp + n * mine.count, inp + (n + 1) * mine.count, ring.held.begin() + n * INP);
  for (int s = 0; s < T; ++s) {
    const bool more = s + 1 < T;
    if (more) ring.start(group);  // the block moves on while its product runs
    const dist::Range cols = dist::even_split(IN, T, wrap(r - s, T));
    layer.forward_columns(out, ring.held.data(), INP, N, cols.offset, cols.count, s > 0);
    if (more) ring.arrive();
  }
}

namespace {

// acc[rows.count, OUT] (+)= inp[chunk rows] @ W_local^T for the rows a half of chunk c covers.
void partial_product(float* acc, std::vector<float>& part, const float* inp, int64_t N, int T, int c, int64_t NH,
                     bool top, const ShardedToAllLinear& layer) {
  const dist::Range chunk = dist::even_split(N, T, c);
  const HalfRows h = half_rows(chunk.count, NH, top);
  const int64_t IL = layer.in_features(), OUT = layer.out_features();
  if (h.count == 0 || IL == 0) return;
  layer.local().forward(part.data(), inp + (chunk.offset + h.first) * IL, h.count);
  for (int64_t i = 0; i < h.count * OUT; ++i) acc[i] += part[static_cast<size_t>(i)];
}

}  // namespace

void matmul_reduce_scatter(float* out, const float* inp, int64_t N, const ShardedToAllLinear& layer,
                           dist::Group& group, Ring ring) {
  const int T = group.size(), r = group.rank();
  const int64_t OUT = layer.out_features(), NP = (N + T - 1) / T;
  const int64_t NH = ring == Ring::TwoWay ? (NP + 1) / 2 : NP;
  const bool two_way = ring == Ring::TwoWay && NP > NH;
  // held = the running sums this member adds to; the ring carries them on. Forward: top halves,
  // ending at chunk r after T - 1 moves; backward: bottom halves, the mirror image.
  Stream fwd(NH, OUT, T, +1), bwd(two_way ? NP - NH : 0, OUT, T, -1);
  std::vector<float> part(static_cast<size_t>(NH * OUT)), fresh_f(fwd.held.size()), fresh_b(bwd.held.size());
  partial_product(fwd.held.data(), part, inp, N, T, wrap(r - 1, T), NH, true, layer);
  if (two_way) partial_product(bwd.held.data(), part, inp, N, T, wrap(r + 1, T), NH, false, layer);
  for (int s = 1; s < T; ++s) {
    fwd.start(group);  // the sums move while this member computes its next partials
    if (two_way) bwd.start(group);
    std::fill(fresh_f.begin(), fresh_f.end(), 0.0f);
    partial_product(fresh_f.data(), part, inp, N, T, wrap(r - s - 1, T), NH, true, layer);
    if (two_way) {
      std::fill(fresh_b.begin(), fresh_b.end(), 0.0f);
      partial_product(fresh_b.data(), part, inp, N, T, wrap(r + s + 1, T), NH, false, layer);
    }
    fwd.arrive();
    for (size_t i = 0; i < fresh_f.size(); ++i) fwd.held[i] += fresh_f[i];
    if (two_way) {
      bwd.arrive();
      for (size_t i = 0; i < fresh_b.size(); ++i) bwd.held[i] += fresh_b[i];
    }
  }
  const dist::Range mine = dist::even_split(N, T, r);
  const int64_t top_rows = std::min(NH, mine.count);
  std::copy(fwd.held.begin(), fwd.held.begin() + top_rows * OUT, out);
  if (two_way && mine.count > NH) std::copy(bwd.held.begin(), bwd.held.begin() + (mine.count - NH) * OUT, out + NH * OUT);
}

}  // namespace tpcli::nn

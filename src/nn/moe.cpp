// tpcli::nn — mixture-of-experts feed-forward (see moe.h for the algorithm and gradient semantics).
//
// Dimension legend: N tokens here, C dim, FE expert hidden (FL = FE_local), E experts,
// EL experts owned here, K top-k, G expert-group size, A rows sent, R rows received.
#include "nn/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <string>

#include "tensor/blas.h"

namespace tpcli::nn {

using tensor::gemm;
using tensor::Trans;

dist::Range local_experts(int n_experts, int size, int rank) { return dist::even_split(n_experts, size, rank); }

int expert_owner(int e, int n_experts, int size) {
  for (int m = 0; m < size; ++m) {
    dist::Range r = local_experts(n_experts, size, m);
    if (e >= r.offset && e < r.offset + r.count) return m;
  }
  throw std::out_of_range("moe: expert " + std::to_string(e) + " not in [0, " + std::to_string(n_experts) + ")");
}

namespace {

float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

int64_t hidden_local(const MoeSizes& s, const dist::Group* tensor) {
  return tensor ? dist::even_split(s.hidden, tensor->size(), tensor->rank()).count : s.hidden;
}

void expect_size(const char* what, size_t got, int64_t want) {
  if (static_cast<int64_t>(got) != want)
    throw std::invalid_argument(std::string("moe: ") + what + " has " + std::to_string(got) + " floats, expected " +
                                std::to_string(want));
}

void check_top_k(const MoeSizes& s) {
  if (s.n_experts < 1 || s.top_k < 1 || s.top_k > s.n_experts)
    throw std::invalid_argument("moe: top_k = " + std::to_string(s.top_k) + " must be in [1, n_experts = " +
                                std::to_string(s.n_experts) + "]");
}

void check(const MoeSizes& s, const MoeWeights& w, int64_t el, int64_t fl) {
  check_top_k(s);
  if (s.capacity_factor && !(*s.capacity_factor > 0.0f))
    throw std::invalid_argument("moe: capacity_factor = " + std::to_string(*s.capacity_factor) + " must be > 0");
  expect_size("router", w.router.size(), s.n_experts * s.dim);
  expect_size("experts.w1", w.w1.size(), el * fl * s.dim);
  expect_size("experts.w2", w.w2.size(), el * s.dim * fl);
  expect_size("experts.w3", w.w3.size(), el * fl * s.dim);
}

// Bytes that leave / arrive at this member in one all_to_all_v (the self chunk stays put).
void count_bytes(MoeStats& st, std::span<const int64_t> send_floats, std::span<const int64_t> recv_floats, int self) {
  for (size_t m = 0; m < send_floats.size(); ++m) {
    if (static_cast<int>(m) == self) continue;
    st.bytes_sent += 4 * static_cast<uint64_t>(send_floats[m]);
    st.bytes_received += 4 * static_cast<uint64_t>(recv_floats[m]);
  }
}

std::vector<int64_t> times(std::span<const int64_t> rows, int64_t c) {
  std::vector<int64_t> out(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) out[i] = rows[i] * c;
  return out;
}

// all_to_all_v of rows of width c; checks that what arrived is what the counts promised.
std::vector<float> exchange_rows(dist::Group& g, std::span<const float> in, std::span<const int64_t> send_rows,
                                 std::span<const int64_t> expect_rows, int64_t c, MoeStats& st) {
  std::vector<int64_t> send = times(send_rows, c), recv;
  std::vector<float> out = g.all_to_all_v(in, send, recv);
  std::vector<int64_t> want = times(expect_rows, c);
  if (recv != want) throw std::runtime_error("moe: all_to_all_v delivered other counts than announced");
  count_bytes(st, send, recv, g.rank());
  return out;
}

// probs = softmax(x @ router^T); top-k experts (ties -> lower index); gates renormalised over them
// (or, s.renormalise false, their probabilities as they are).
void route(MoeActivations& a, std::span<const float> inp, std::span<const float> router, const MoeSizes& s) {
  const int64_t N = a.n_tokens, C = s.dim;
  const int E = s.n_experts, K = s.top_k;
  a.probs.assign(static_cast<size_t>(N * E), 0.0f);  // [N, E]
  a.expert.resize(static_cast<size_t>(N * K));       // [N, K]
  a.gate.resize(static_cast<size_t>(N * K));         // [N, K]
  if (N > 0) tensor::matmul_wt(a.probs.data(), inp.data(), router.data(), N, E, C);
  std::vector<int32_t> order(static_cast<size_t>(E));  // [E]
  for (int64_t t = 0; t < N; ++t) {
    float* p = a.probs.data() + t * E;
    float mx = *std::max_element(p, p + E), sum = 0.0f;
    for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(p[e] - mx));
    for (int e = 0; e < E; ++e) p[e] /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K, order.end(),
                      [p](int32_t i, int32_t j) { return p[i] > p[j] || (p[i] == p[j] && i < j); });
    float chosen = 0.0f;
    for (int k = 0; k < K; ++k) chosen += p[order[static_cast<size_t>(k)]];
    if (!s.renormalise) chosen = 1.0f;
    for (int k = 0; k < K; ++k) {
      a.expert[static_cast<size_t>(t * K + k)] = order[static_cast<size_t>(k)];
      a.gate[static_cast<size_t>(t * K + k)] = p[order[static_cast<size_t>(k)]] / chosen;
    }
  }
}

// Decide which assignments are kept (capacity) and their row in the expert-sorted send buffer.
// Returns kept[E]; fills a.row and the pre-drop counts in a.stats.tokens_per_expert (local).
std::vector<int64_t> plan_rows(MoeActivations& a, const MoeSizes& s) {
  const int64_t N = a.n_tokens;
  const int E = s.n_experts, K = s.top_k;
  std::vector<int64_t> wanted(static_cast<size_t>(E), 0), kept(static_cast<size_t>(E), 0);  // [E]
  for (int32_t e : a.expert) ++wanted[static_cast<size_t>(e)];
  int64_t cap = N * K;
  if (s.capacity_factor) cap = static_cast<int64_t>(std::ceil(*s.capacity_factor * static_cast<double>(N * K) / E));
  a.row.assign(static_cast<size_t>(N * K), -1);
  // First choices first, each in token order: the priority order of GShard/Switch.
  for (int k = 0; k < K; ++k)
    for (int64_t t = 0; t < N; ++t) {
      auto e = static_cast<size_t>(a.expert[static_cast<size_t>(t * K + k)]);
      if (kept[e] < cap) a.row[static_cast<size_t>(t * K + k)] = static_cast<int64_t>(e) << 32 | kept[e]++;
    }
  std::vector<int64_t> first(static_cast<size_t>(E), 0);  // [E] first send row of each expert
  for (int e = 1; e < E; ++e) first[static_cast<size_t>(e)] = first[static_cast<size_t>(e - 1)] + kept[static_cast<size_t>(e - 1)];
  for (int64_t& r : a.row)
    if (r >= 0) r = first[static_cast<size_t>(r >> 32)] + (r & 0xffffffff);
  a.stats.tokens_per_expert = wanted;
  a.stats.assignments = N * K;
  a.stats.dropped = N * K - std::accumulate(kept.begin(), kept.end(), int64_t{0});
  return kept;
}

// Group-wide assignment counts -> f_e, and the aux loss with this device's P_e.
void balance_loss(MoeActivations& a, const MoeSizes& s, dist::Group& experts) {
  const int E = s.n_experts;
  std::vector<int32_t> counts(static_cast<size_t>(E) + 1);  // [E + 1]: counts, then N (exact integer sums)
  for (int e = 0; e < E; ++e) counts[static_cast<size_t>(e)] = static_cast<int32_t>(a.stats.tokens_per_expert[static_cast<size_t>(e)]);
  counts[static_cast<size_t>(E)] = static_cast<int32_t>(a.n_tokens);
  experts.all_sum(std::span<int32_t>(counts));
  const float total = static_cast<float>(counts[static_cast<size_t>(E)]) * static_cast<float>(s.top_k);
  a.fraction.assign(static_cast<size_t>(E), 0.0f);  // [E]
  float aux = 0.0f;
  for (int e = 0; e < E; ++e) {
    a.stats.tokens_per_expert[static_cast<size_t>(e)] = counts[static_cast<size_t>(e)];
    a.fraction[static_cast<size_t>(e)] = total > 0 ? static_cast<float>(counts[static_cast<size_t>(e)]) / total : 0.0f;
    if (a.batch_fraction.size() == static_cast<size_t>(E)) a.fraction[static_cast<size_t>(e)] = a.batch_fraction[static_cast<size_t>(e)];
    float mean_p = 0.0f;
    for (int64_t t = 0; t < a.n_tokens; ++t) mean_p += a.probs[static_cast<size_t>(t * E + e)];
    if (a.n_tokens > 0) mean_p /= static_cast<float>(a.n_tokens);
    aux += a.fraction[static_cast<size_t>(e)] * mean_p;
  }
  a.stats.aux_loss = s.aux_coef * static_cast<float>(E) * aux;
}

// Learn from the per-expert counts how many rows each source sends for each local expert, and lay
// out the expert-major receive buffer.
void plan_receive(MoeActivations& a, const std::vector<int64_t>& kept, const MoeSizes& s, dist::Group& experts) {
  const int G = experts.size(), E = s.n_experts;
  const dist::Range mine = local_experts(E, G, experts.rank());
  const int64_t EL = mine.count;
  std::vector<float> meta(kept.begin(), kept.end());  // [E]: member m gets the counts of its experts
  std::vector<int64_t> meta_send(static_cast<size_t>(G)), meta_expect(static_cast<size_t>(G), EL);
  a.send_counts.assign(static_cast<size_t>(G), 0);
  for (int m = 0; m < G; ++m) {
    dist::Range r = local_experts(E, G, m);
    meta_send[static_cast<size_t>(m)] = r.count;
    for (int64_t e = r.offset; e < r.offset + r.count; ++e) a.send_counts[static_cast<size_t>(m)] += kept[static_cast<size_t>(e)];
  }
  std::vector<float> from = exchange_rows(experts, meta, meta_send, meta_expect, 1, a.stats);  // [G, EL]
  auto cnt = [&](int src, int64_t j) { return static_cast<int64_t>(from[static_cast<size_t>(src * EL + j)]); };
  a.recv_counts.assign(static_cast<size_t>(G), 0);
  a.expert_offsets.assign(static_cast<size_t>(EL) + 1, 0);
  for (int src = 0; src < G; ++src)
    for (int64_t j = 0; j < EL; ++j) {
      a.recv_counts[static_cast<size_t>(src)] += cnt(src, j);
      a.expert_offsets[static_cast<size_t>(j) + 1] += cnt(src, j);
    }
  for (int64_t j = 0; j < EL; ++j) a.expert_offsets[static_cast<size_t>(j) + 1] += a.expert_offsets[static_cast<size_t>(j)];
  // Source s's block lists its rows for local expert 0, then 1, ...; expert-major puts all sources'
  // rows of expert j together (source order inside).
  a.to_expert_major.clear();
  std::vector<int64_t> fill(a.expert_offsets.begin(), a.expert_offsets.end() - 1);  // [EL]
  for (int src = 0; src < G; ++src)
    for (int64_t j = 0; j < EL; ++j)
      for (int64_t i = 0; i < cnt(src, j); ++i) a.to_expert_major.push_back(fill[static_cast<size_t>(j)]++);
  a.stats.rows_sent = std::accumulate(a.send_counts.begin(), a.send_counts.end(), int64_t{0});
  a.stats.rows_received = a.expert_offsets.back();
}

// dst[perm[i]] = src[i] (forward = true) or dst[i] = src[perm[i]], rows of width c.
void permute_rows(std::span<float> dst, std::span<const float> src, const std::vector<int64_t>& perm, int64_t c,
                  bool forward) {
  for (size_t i = 0; i < perm.size(); ++i) {
    const int64_t from = forward ? static_cast<int64_t>(i) : perm[i], to = forward ? perm[i] : static_cast<int64_t>(i);
    std::memcpy(dst.data() + to * c, src.data() + from * c, static_cast<size_t>(c) * sizeof(float));
  }
}

// ye[R,C] = SwiGLU of every local expert j over its block of n rows of xe (a grouped matmul), the
// products by `gate_up(j, h1, h3, x, n)` and `down(j, y, act, n)`: f32 or packed weights.
template <class GateUp, class Down>
void swiglu_experts(std::vector<float>& ye, MoeActivations& a, int64_t C, int64_t FL, GateUp&& gate_up, Down&& down) {
  const int64_t R = a.expert_offsets.back(), EL = static_cast<int64_t>(a.expert_offsets.size()) - 1;
  a.h1.resize(static_cast<size_t>(R * FL));             // [R, FL]
  a.h3.resize(static_cast<size_t>(R * FL));             // [R, FL]
  std::vector<float> act(static_cast<size_t>(R * FL));  // [R, FL] silu(h1) * h3
  ye.assign(static_cast<size_t>(R * C), 0.0f);          // [R, C]
  for (int64_t j = 0; j < EL; ++j) {
    const int64_t off = a.expert_offsets[static_cast<size_t>(j)], n = a.expert_offsets[static_cast<size_t>(j) + 1] - off;
    if (n == 0 || FL == 0) continue;
    float *h1 = a.h1.data() + off * FL, *h3 = a.h3.data() + off * FL, *ac = act.data() + off * FL;
    gate_up(j, h1, h3, a.xe.data() + off * C, n);
    for (int64_t i = 0; i < n * FL; ++i) ac[i] = h1[i] * sigmoid(h1[i]) * h3[i];
    down(j, ye.data() + off * C, ac, n);
  }
}

void experts_forward(std::vector<float>& ye, MoeActivations& a, const MoeWeights& w, int64_t C, int64_t FL) {
  swiglu_experts(
      ye, a, C, FL,
      [&](int64_t j, float* h1, float* h3, const float* x, int64_t n) {
        tensor::matmul_wt(h1, x, w.w1.data() + j * FL * C, n, FL, C);
        tensor::matmul_wt(h3, x, w.w3.data() + j * FL * C, n, FL, C);
      },
      [&](int64_t j, float* y, const float* act, int64_t n) {
        tensor::matmul_wt(y, act, w.w2.data() + j * C * FL, n, C, FL);
      });
}

void packed_experts_forward(std::vector<float>& ye, MoeActivations& a, const std::vector<PackedExpert>& experts,
                            int64_t C) {
  const int64_t FL = experts.empty() ? 0 : experts[0].w1.out_features();
  swiglu_experts(
      ye, a, C, FL,
      [&](int64_t j, float* h1, float* h3, const float* x, int64_t n) {
        experts[static_cast<size_t>(j)].w1.forward(h1, x, n);
        experts[static_cast<size_t>(j)].w3.forward(h3, x, n);
      },
      [&](int64_t j, float* y, const float* act, int64_t n) { experts[static_cast<size_t>(j)].w2.forward(y, act, n); });
}

// The reverse of experts_forward: dxe[R,C] = d(ye)/d(xe)^T dye; expert weight gradients +=.
void experts_backward(std::vector<float>& dxe, const MoeGrads& g, const std::vector<float>& dye, const MoeWeights& w,
                      const MoeActivations& a, int64_t C, int64_t FL) {
  const int64_t R = a.expert_offsets.back(), EL = static_cast<int64_t>(a.expert_offsets.size()) - 1;
  dxe.assign(static_cast<size_t>(R * C), 0.0f);  // [R, C]
  std::vector<float> act(static_cast<size_t>(R * FL)), dh1(static_cast<size_t>(R * FL)),
      dh3(static_cast<size_t>(R * FL));  // [R, FL] each
  for (int64_t j = 0; j < EL; ++j) {
    const int64_t off = a.expert_offsets[static_cast<size_t>(j)], n = a.expert_offsets[static_cast<size_t>(j) + 1] - off;
    if (n == 0 || FL == 0) continue;
    const float *x = a.xe.data() + off * C, *dy = dye.data() + off * C;
    const float *h1 = a.h1.data() + off * FL, *h3 = a.h3.data() + off * FL;
    float *ac = act.data() + off * FL, *d1 = dh1.data() + off * FL, *d3 = dh3.data() + off * FL;
    const float *w1 = w.w1.data() + j * FL * C, *w2 = w.w2.data() + j * C * FL, *w3 = w.w3.data() + j * FL * C;
    for (int64_t i = 0; i < n * FL; ++i) ac[i] = h1[i] * sigmoid(h1[i]) * h3[i];
    const bool weights = !g.w1.empty();  // frozen (LoRA): no weight gradients
    if (weights) gemm(Trans::Yes, Trans::No, C, FL, n, 1.0f, dy, C, ac, FL, 1.0f, g.w2.data() + j * C * FL, FL);  // dw2 += dy^T act
    gemm(Trans::No, Trans::No, n, FL, C, 1.0f, dy, C, w2, FL, 0.0f, d1, FL);                        // dact = dy w2
    for (int64_t i = 0; i < n * FL; ++i) {
      const float sg = sigmoid(h1[i]), dact = d1[i];
      d3[i] = dact * h1[i] * sg;
      d1[i] = dact * h3[i] * sg * (1.0f + h1[i] * (1.0f - sg));
    }
    if (weights) {
      gemm(Trans::Yes, Trans::No, FL, C, n, 1.0f, d1, FL, x, C, 1.0f, g.w1.data() + j * FL * C, C);  // dw1 += dh1^T x
      gemm(Trans::Yes, Trans::No, FL, C, n, 1.0f, d3, FL, x, C, 1.0f, g.w3.data() + j * FL * C, C);  // dw3 += dh3^T x
    }
    gemm(Trans::No, Trans::No, n, C, FL, 1.0f, d1, FL, w1, C, 0.0f, dxe.data() + off * C, C);      // dx = dh1 w1
    gemm(Trans::No, Trans::No, n, C, FL, 1.0f, d3, FL, w3, C, 1.0f, dxe.data() + off * C, C);      //    + dh3 w3
  }
}

}  // namespace

namespace {

// ye[R, C] = the local experts on their expert-major rows a.xe[R, C] (a.expert_offsets: blocks).
using RunExperts = std::function<void(std::vector<float>& ye, MoeActivations& a)>;

// moe_forward around any expert implementation: route, dispatch, run_experts, [all_sum], return, combine.
float route_dispatch_combine(std::span<float> out, MoeActivations& a, std::span<const float> inp,
                             std::span<const float> router, const MoeSizes& s, int64_t n_tokens, dist::Group& experts,
                             dist::Group* tensor, const RunExperts& run_experts) {
  const int64_t N = n_tokens, C = s.dim;
  const int K = s.top_k;
  expect_size("moe input", inp.size(), N * C);
  expect_size("moe output", out.size(), N * C);
  a.n_tokens = N;
  a.stats = MoeStats{};

  // router -> softmax -> top-k -> gates; load-balancing statistics over the group
  route(a, inp, router, s);
  std::vector<int64_t> kept = plan_rows(a, s);
  balance_loss(a, s, experts);

  // dispatch: tokens sorted by expert, to the owners of the experts
  plan_receive(a, kept, s, experts);
  const int64_t A = a.stats.rows_sent, R = a.stats.rows_received;
  std::vector<float> send(static_cast<size_t>(A * C));  // [A, C]
  for (int64_t i = 0; i < N * K; ++i)
    if (a.row[static_cast<size_t>(i)] >= 0)
      std::memcpy(send.data() + a.row[static_cast<size_t>(i)] * C, inp.data() + (i / K) * C, static_cast<size_t>(C) * sizeof(float));
  std::vector<float> recv = exchange_rows(experts, send, a.send_counts, a.recv_counts, C, a.stats);  // [R, C]
  a.xe.resize(static_cast<size_t>(R * C));  // [R, C]
  permute_rows(a.xe, recv, a.to_expert_major, C, true);

  // experts (grouped matmul); a tensor-parallel expert ends in an all-sum (ShardedToAll)
  std::vector<float> ye;  // [R, C]
  run_experts(ye, a);
  if (tensor) tensor->all_sum(ye);

  // return trip, then combine with the gates
  permute_rows(recv, ye, a.to_expert_major, C, false);
  a.y = exchange_rows(experts, recv, a.recv_counts, a.send_counts, C, a.stats);  // [A, C]
  std::fill(out.begin(), out.end(), 0.0f);
  for (int64_t i = 0; i < N * K; ++i) {
    const int64_t r = a.row[static_cast<size_t>(i)];
    if (r < 0) continue;
    const float gt = a.gate[static_cast<size_t>(i)];
    const float* y = a.y.data() + r * C;
    float* o = out.data() + (i / K) * C;
    for (int64_t c = 0; c < C; ++c) o[c] += gt * y[c];
  }
  return a.stats.aux_loss;
}

}  // namespace

float moe_forward(std::span<float> out, MoeActivations& a, std::span<const float> inp, const MoeWeights& w,
                  const MoeSizes& s, int64_t n_tokens, dist::Group& experts, dist::Group* tensor) {
  const int64_t C = s.dim, FL = hidden_local(s, tensor);
  const int64_t EL = local_experts(s.n_experts, experts.size(), experts.rank()).count;
  check(s, w, EL, FL);
  return route_dispatch_combine(out, a, inp, w.router, s, n_tokens, experts, tensor,
                                [&](std::vector<float>& ye, MoeActivations& acts) { experts_forward(ye, acts, w, C, FL); });
}

void moe_backward(std::span<float> dinp, const MoeGrads& g, std::span<const float> dout, float d_aux,
                  std::span<const float> inp, const MoeWeights& w, MoeActivations& a, const MoeSizes& s,
                  dist::Group& experts, dist::Group* tensor) {
  const int64_t N = a.n_tokens, C = s.dim, FL = hidden_local(s, tensor);
  const int E = s.n_experts, K = s.top_k;
  const int64_t A = a.stats.rows_sent;
  expect_size("moe dout", dout.size(), N * C);
  expect_size("moe dinp", dinp.size(), N * C);
  if (!g.router.empty()) {  // else frozen: no weight gradients at all
    expect_size("moe router grad", g.router.size(), E * C);
    expect_size("moe experts.w1 grad", g.w1.size(), static_cast<int64_t>(w.w1.size()));
    expect_size("moe experts.w2 grad", g.w2.size(), static_cast<int64_t>(w.w2.size()));
    expect_size("moe experts.w3 grad", g.w3.size(), static_cast<int64_t>(w.w3.size()));
  }

  // combine backward: gate gradients, and each kept row's output gradient (send order)
  std::vector<float> dgate(static_cast<size_t>(N * K), 0.0f);  // [N, K]
  std::vector<float> dy(static_cast<size_t>(A * C), 0.0f);     // [A, C]
  for (int64_t i = 0; i < N * K; ++i) {
    const int64_t r = a.row[static_cast<size_t>(i)];
    if (r < 0) continue;
    const float gt = a.gate[static_cast<size_t>(i)];
    const float *y = a.y.data() + r * C, *d = dout.data() + (i / K) * C;
    float* dyr = dy.data() + r * C;
    float dot = 0.0f;
    for (int64_t c = 0; c < C; ++c) {
      dot += d[c] * y[c];
      dyr[c] = gt * d[c];
    }
    dgate[static_cast<size_t>(i)] = dot;
  }

  // return trip backward = dispatch direction; experts backward; dispatch backward = return direction
  std::vector<float> recv = exchange_rows(experts, dy, a.send_counts, a.recv_counts, C, a.stats);  // [R, C]
  std::vector<float> dye(recv.size());  // [R, C]
  permute_rows(dye, recv, a.to_expert_major, C, true);
  std::vector<float> dxe;  // [R, C]
  experts_backward(dxe, g, dye, w, a, C, FL);
  if (tensor) tensor->all_sum(dxe);  // each FE slice holds a term of dx (AllToSharded backward)
  permute_rows(recv, dxe, a.to_expert_major, C, false);
  std::vector<float> dxb = exchange_rows(experts, recv, a.recv_counts, a.send_counts, C, a.stats);  // [A, C]
  for (int64_t i = 0; i < N * K; ++i) {
    const int64_t r = a.row[static_cast<size_t>(i)];
    if (r < 0) continue;
    const float* src = dxb.data() + r * C;
    float* d = dinp.data() + (i / K) * C;
    for (int64_t c = 0; c < C; ++c) d[c] += src[c];
  }

  // gates = chosen probs / their sum (or the chosen probs as they are); aux loss; softmax; router
  std::vector<float> dlogits(static_cast<size_t>(N * E), 0.0f);  // [N, E] first dprobs, then dlogits
  std::vector<float> dl(static_cast<size_t>(E));                 // [E] one token's dlogits
  const float aux_scale = N > 0 ? d_aux * s.aux_coef * static_cast<float>(E) / static_cast<float>(N) : 0.0f;
  for (int64_t t = 0; t < N; ++t) {
    const float* p = a.probs.data() + t * E;
    float* dp = dlogits.data() + t * E;
    float chosen = 0.0f, gdg = 0.0f;
    for (int k = 0; k < K; ++k) {
      chosen += p[a.expert[static_cast<size_t>(t * K + k)]];
      gdg += a.gate[static_cast<size_t>(t * K + k)] * dgate[static_cast<size_t>(t * K + k)];
    }
    for (int k = 0; k < K; ++k) {
      const float d = dgate[static_cast<size_t>(t * K + k)];
      dp[a.expert[static_cast<size_t>(t * K + k)]] = s.renormalise ? (d - gdg) / chosen : d;
    }
    for (int e = 0; e < E; ++e) dp[e] += aux_scale * a.fraction[static_cast<size_t>(e)];
    // softmax VJP p_j (dp_j - sum_i p_i dp_i), written as p_j sum_i p_i (dp_j - dp_i): a peaked
    // router (p_j near 1) would otherwise lose 1 - p_j to cancellation.
    for (int j = 0; j < E; ++j) {
      float acc = 0.0f;
      for (int i = 0; i < E; ++i) acc += p[i] * (dp[j] - dp[i]);
      dl[static_cast<size_t>(j)] = p[j] * acc;
    }
    std::copy(dl.begin(), dl.end(), dp);
  }
  if (N > 0) {
    if (!g.router.empty()) gemm(Trans::Yes, Trans::No, E, C, N, 1.0f, dlogits.data(), E, inp.data(), C, 1.0f, g.router.data(), C);
    gemm(Trans::No, Trans::No, N, C, E, 1.0f, dlogits.data(), E, w.router.data(), C, 1.0f, dinp.data(), C);
  }
}

// ---- MoeFeedForward ----

namespace {

// This member's slice of a full [E, FE, C] (rows_of_fe) or [E, C, FE] expert tensor.
tensor::Tensor slice_experts(std::span<const float> full, dist::Range experts, dist::Range hidden, int64_t C,
                             int64_t FE, bool rows_of_fe) {
  const int64_t EL = experts.count, FL = hidden.count;
  tensor::Tensor out(rows_of_fe ? tensor::Shape{EL, FL, C} : tensor::Shape{EL, C, FL});
  for (int64_t j = 0; j < EL; ++j) {
    const float* e = full.data() + (experts.offset + j) * FE * C;
    float* o = out.data() + j * FL * C;
    if (rows_of_fe)
      std::copy(e + hidden.offset * C, e + (hidden.offset + FL) * C, o);
    else
      for (int64_t c = 0; c < C; ++c) std::copy(e + c * FE + hidden.offset, e + c * FE + hidden.offset + FL, o + c * FL);
  }
  return out;
}

// Collective over the tensor group: [EL, FL, C] / [EL, C, FL] slices -> [EL, FE, C] / [EL, C, FE].
std::vector<float> gather_hidden(dist::Group& g, const tensor::Tensor& local, int64_t EL, int64_t C, int64_t FE,
                                 bool rows_of_fe) {
  const int T = g.size();
  std::vector<int64_t> counts(static_cast<size_t>(T));
  for (int m = 0; m < T; ++m) counts[static_cast<size_t>(m)] = EL * dist::even_split(FE, T, m).count * C;
  std::vector<float> all(static_cast<size_t>(EL * FE * C)), out(all.size());  // [T pieces], [EL, FE, C]
  g.all_gather_v(local.span(), all, counts);
  const float* src = all.data();
  for (int m = 0; m < T; ++m) {
    const dist::Range h = dist::even_split(FE, T, m);
    for (int64_t j = 0; j < EL; ++j, src += h.count * C) {
      float* e = out.data() + j * FE * C;
      if (rows_of_fe)
        std::copy(src, src + h.count * C, e + h.offset * C);
      else
        for (int64_t c = 0; c < C; ++c) std::copy(src + c * h.count, src + (c + 1) * h.count, e + c * FE + h.offset);
    }
  }
  return out;
}

// Collective over the expert group: every member's [EL_m, X] -> [E, X].
tensor::Tensor gather_experts(dist::Group& g, std::span<const float> local, int E, tensor::Shape full) {
  const int64_t X = tensor::numel(full) / E;
  std::vector<int64_t> counts(static_cast<size_t>(g.size()));
  for (int m = 0; m < g.size(); ++m) counts[static_cast<size_t>(m)] = local_experts(E, g.size(), m).count * X;
  tensor::Tensor out(std::move(full));
  g.all_gather_v(local, out.span(), counts);
  return out;
}

}  // namespace

MoeFeedForward::MoeFeedForward(const MoeSizes& sizes, std::span<const float> router, std::span<const float> w1,
                               std::span<const float> w2, std::span<const float> w3, dist::Group experts,
                               dist::Group tensor, std::string prefix)
    : sizes_(sizes), experts_(std::move(experts)), tensor_(std::move(tensor)), prefix_(std::move(prefix)) {
  const int64_t C = sizes_.dim, FE = sizes_.hidden, E = sizes_.n_experts;
  if (E < 1) throw std::invalid_argument("moe: n_experts = " + std::to_string(E) + " must be >= 1");
  if (tensor_.size() > FE)
    throw std::invalid_argument("moe: cannot split expert_hidden_dim = " + std::to_string(FE) + " over " +
                                std::to_string(tensor_.size()) + " tensor-parallel devices");
  expect_size((prefix_ + "router").c_str(), router.size(), E * C);
  expect_size((prefix_ + "experts.w1").c_str(), w1.size(), E * FE * C);
  expect_size((prefix_ + "experts.w2").c_str(), w2.size(), E * C * FE);
  expect_size((prefix_ + "experts.w3").c_str(), w3.size(), E * FE * C);
  mine_ = local_experts(sizes_.n_experts, experts_.size(), experts_.rank());
  hidden_ = dist::even_split(FE, tensor_.size(), tensor_.rank());
  router_ = tensor::Tensor({E, C}, router);
  w1_ = slice_experts(w1, mine_, hidden_, C, FE, true);
  w2_ = slice_experts(w2, mine_, hidden_, C, FE, false);
  w3_ = slice_experts(w3, mine_, hidden_, C, FE, true);
}

MoeWeights MoeFeedForward::weights() const { return {router_.span(), w1_.span(), w2_.span(), w3_.span()}; }

MoeGrads MoeFeedForward::grads() {
  if (frozen_) return {};
  if (router_grad_.empty()) {
    router_grad_ = tensor::Tensor(router_.shape());
    w1_grad_ = tensor::Tensor(w1_.shape());
    w2_grad_ = tensor::Tensor(w2_.shape());
    w3_grad_ = tensor::Tensor(w3_.shape());
  }
  return {router_grad_.span(), w1_grad_.span(), w2_grad_.span(), w3_grad_.span()};
}

void MoeFeedForward::forward(float* out, const float* inp, int64_t N) {
  const size_t n = static_cast<size_t>(N * sizes_.dim);
  moe_forward({out, n}, acts_, {inp, n}, weights(), sizes_, N, experts_, tensor_or_null());
}

void MoeFeedForward::backward(float* dinp, const float* dout, const float* inp, int64_t N) {
  const size_t n = static_cast<size_t>(N * sizes_.dim);
  if (N != acts_.n_tokens) throw std::logic_error("moe: backward on " + std::to_string(N) + " rows after a forward on " +
                                                  std::to_string(acts_.n_tokens));
  moe_backward({dinp, n}, grads(), {dout, n}, 1.0f, {inp, n}, weights(), acts_, sizes_, experts_, tensor_or_null());
}

std::vector<ParamRef> MoeFeedForward::parameters() {
  if (frozen_) return {};
  grads();
  return {{prefix_ + "router", &router_, &router_grad_},
          {prefix_ + "experts.w1", &w1_, &w1_grad_},
          {prefix_ + "experts.w2", &w2_, &w2_grad_},
          {prefix_ + "experts.w3", &w3_, &w3_grad_}};
}

std::vector<std::pair<std::string, tensor::Tensor>> MoeFeedForward::gather_full() {
  const int64_t C = sizes_.dim, FE = sizes_.hidden, EL = mine_.count;
  const int E = sizes_.n_experts;
  std::vector<std::pair<std::string, tensor::Tensor>> out;
  out.emplace_back(prefix_ + "router", router_);
  const std::vector<float> w1 = gather_hidden(tensor_, w1_, EL, C, FE, true);
  const std::vector<float> w2 = gather_hidden(tensor_, w2_, EL, C, FE, false);
  const std::vector<float> w3 = gather_hidden(tensor_, w3_, EL, C, FE, true);
  out.emplace_back(prefix_ + "experts.w1", gather_experts(experts_, w1, E, {E, FE, C}));
  out.emplace_back(prefix_ + "experts.w2", gather_experts(experts_, w2, E, {E, C, FE}));
  out.emplace_back(prefix_ + "experts.w3", gather_experts(experts_, w3, E, {E, FE, C}));
  return out;
}

int64_t MoeFeedForward::parameter_bytes() const {
  return static_cast<int64_t>(sizeof(float)) * (router_.numel() + w1_.numel() + w2_.numel() + w3_.numel());
}


// ---- QuantizedMoeFeedForward ----

QuantizedMoeFeedForward::QuantizedMoeFeedForward(const MoeSizes& sizes, tensor::Tensor router,
                                                 std::vector<PackedExpert> local, dist::Group experts,
                                                 dist::Group tensor)
    : sizes_(sizes),
      experts_(std::move(experts)),
      tensor_(std::move(tensor)),
      router_(std::move(router)),
      local_(std::move(local)) {
  const int64_t C = sizes_.dim, E = sizes_.n_experts;
  check_top_k(sizes_);
  expect_size("router", static_cast<size_t>(router_.numel()), E * C);
  const int64_t EL = local_experts(sizes_.n_experts, experts_.size(), experts_.rank()).count;
  if (static_cast<int64_t>(local_.size()) != EL)
    throw std::invalid_argument("moe: " + std::to_string(local_.size()) + " packed experts given, this member owns " +
                                std::to_string(EL));
  for (const PackedExpert& e : local_) {
    const int64_t FL = local_[0].w1.out_features();
    if (e.w1.in_features() != C || e.w3.in_features() != C || e.w2.out_features() != C || e.w1.out_features() != FL ||
        e.w3.out_features() != FL || e.w2.in_features() != FL)
      throw std::invalid_argument("moe: packed expert shapes differ from w1/w3 [FL, C], w2 [C, FL] with C = " +
                                  std::to_string(C) + ", FL = " + std::to_string(FL));
  }
}

void QuantizedMoeFeedForward::forward(float* out, const float* inp, int64_t N) {
  const size_t n = static_cast<size_t>(N * sizes_.dim);
  dist::Group* tensor = tensor_.size() > 1 ? &tensor_ : nullptr;
  route_dispatch_combine({out, n}, acts_, {inp, n}, router_.span(), sizes_, N, experts_, tensor,
                         [&](std::vector<float>& ye, MoeActivations& a) { packed_experts_forward(ye, a, local_, sizes_.dim); });
}

int64_t QuantizedMoeFeedForward::parameter_bytes() const {
  int64_t bytes = static_cast<int64_t>(sizeof(float)) * router_.numel();
  for (const PackedExpert& e : local_) bytes += e.w1.bytes() + e.w3.bytes() + e.w2.bytes();
  return bytes;
}

}  // namespace tpcli::nn

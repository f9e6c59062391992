// nn/moe against the plain method: every expert on every token, masked by the routing, in double
// precision, seeing all tokens at once. The expert-parallel layer runs on G devices, each with its
// own tokens. The reference's backward is itself checked against central finite differences.
//
// Dimension legend: NG tokens of the whole group, N tokens of one device, C dim, F expert hidden,
// E experts, K top-k, G devices in the expert group.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "distributed/runtime.h"
#include "nn/moe.h"

namespace {

using tpcli::dist::Device;
using tpcli::dist::Mesh;
using Vec = std::vector<double>;

// Tiny matrices: one BLIS thread per device (several OpenMP threads per tiny gemm crawl on a
// loaded 2-core machine).
tpcli::dist::RunOptions one_thread() {
  tpcli::dist::RunOptions o;
  o.blas_threads = 1;
  return o;
}

struct Problem {
  int64_t C = 12, F = 20;
  int E = 4, K = 2;
  double coef = 0.05;
  std::optional<float> capacity;
  bool renormalise = true;      // the chosen gates divided by their sum (Mixtral), or as they are
  std::vector<int64_t> chunks;  // [G] tokens of each device (the capacity is applied per device)
  Vec x;                        // [NG, C]
  Vec router;                   // [E, C]
  Vec w1, w2, w3;               // [E, F, C], [E, C, F], [E, F, C]
  Vec dout;                     // [NG, C]
  double d_aux = 0.7;           // dL/d(global aux loss)
  int64_t tokens() const { return std::accumulate(chunks.begin(), chunks.end(), int64_t{0}); }
};

Vec randn(std::mt19937& rng, size_t n, double scale) {
  std::normal_distribution<double> d(0.0, scale);
  Vec v(n);
  for (double& x : v) x = d(rng);
  return v;
}

Problem make_problem(int E, int K, int G, int64_t NG, uint32_t seed) {
  std::mt19937 rng(seed);
  Problem p;
  p.E = E;
  p.K = K;
  for (int d = 0; d < G; ++d) p.chunks.push_back(tpcli::dist::even_split(NG, G, d).count);
  p.x = randn(rng, static_cast<size_t>(NG * p.C), 1.0);
  p.router = randn(rng, static_cast<size_t>(E * p.C), 0.5);
  p.w1 = randn(rng, static_cast<size_t>(E * p.F * p.C), 0.3);
  p.w2 = randn(rng, static_cast<size_t>(E * p.C * p.F), 0.3);
  p.w3 = randn(rng, static_cast<size_t>(E * p.F * p.C), 0.3);
  p.dout = randn(rng, static_cast<size_t>(NG * p.C), 1.0);
  return p;
}

struct Result {
  Vec out;  // [NG, C]
  double aux = 0;
  Vec dx, drouter, dw1, dw2, dw3;
  std::vector<int64_t> counts;  // [E] before drops
  int64_t dropped = 0;
};

double silu(double v) { return v / (1.0 + std::exp(-v)); }
double dsilu(double v) {
  double s = 1.0 / (1.0 + std::exp(-v));
  return s * (1.0 + v * (1.0 - s));
}

// The plain method, forward and backward.
Result reference(const Problem& p) {
  const int64_t NG = p.tokens(), C = p.C, F = p.F;
  const int E = p.E, K = p.K;
  Result r;
  r.out.assign(static_cast<size_t>(NG * C), 0);
  r.dx.assign(static_cast<size_t>(NG * C), 0);
  r.drouter.assign(p.router.size(), 0);
  r.dw1.assign(p.w1.size(), 0);
  r.dw2.assign(p.w2.size(), 0);
  r.dw3.assign(p.w3.size(), 0);
  r.counts.assign(static_cast<size_t>(E), 0);
  Vec probs(static_cast<size_t>(NG * E));                    // [NG, E]
  std::vector<std::vector<int>> chosen(static_cast<size_t>(NG));  // [NG][K]
  for (int64_t t = 0; t < NG; ++t) {
    double mx = -1e300;
    Vec l(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) {
      for (int64_t c = 0; c < C; ++c) l[e] += p.router[e * C + c] * p.x[t * C + c];
      mx = std::max(mx, l[e]);
    }
    double s = 0;
    for (int e = 0; e < E; ++e) s += std::exp(l[e] - mx);
    for (int e = 0; e < E; ++e) probs[t * E + e] = std::exp(l[e] - mx) / s;
    std::vector<int> idx(static_cast<size_t>(E));
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return probs[t * E + a] > probs[t * E + b]; });
    chosen[t].assign(idx.begin(), idx.begin() + K);
    for (int e : chosen[t]) ++r.counts[e];
  }
  // capacity: per device, first choices first, in token order
  std::vector<std::vector<bool>> kept(static_cast<size_t>(NG), std::vector<bool>(static_cast<size_t>(K), true));
  if (p.capacity) {
    int64_t first = 0;
    for (int64_t n : p.chunks) {
      const int64_t cap = static_cast<int64_t>(std::ceil(*p.capacity * static_cast<double>(n * K) / E));
      std::vector<int64_t> used(static_cast<size_t>(E), 0);
      for (int k = 0; k < K; ++k)
        for (int64_t t = first; t < first + n; ++t) kept[t][k] = used[chosen[t][k]]++ < cap;
      first += n;
    }
  }
  // aux loss: f_e over all assignments, P_e over all tokens
  Vec f(static_cast<size_t>(E)), P(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) {
    f[e] = static_cast<double>(r.counts[e]) / static_cast<double>(NG * K);
    for (int64_t t = 0; t < NG; ++t) P[e] += probs[t * E + e] / static_cast<double>(NG);
    r.aux += p.coef * E * f[e] * P[e];
  }
  for (int64_t t = 0; t < NG; ++t) {
    const double* x = &p.x[t * C];
    const double* dout = &p.dout[t * C];
    double sum_chosen = 0;
    for (int e : chosen[t]) sum_chosen += probs[t * E + e];
    if (!p.renormalise) sum_chosen = 1;
    Vec gate(static_cast<size_t>(E), 0), dgate(static_cast<size_t>(E), 0);  // full width, zero where unchosen
    for (int k = 0; k < K; ++k) gate[chosen[t][k]] = probs[t * E + chosen[t][k]] / sum_chosen;
    for (int e = 0; e < E; ++e) {  // every expert on every token; the mask zeroes the unchosen
      bool on = false;
      for (int k = 0; k < K; ++k) on = on || (chosen[t][k] == e && kept[t][k]);
      const double m = on ? 1.0 : 0.0;
      Vec h1(static_cast<size_t>(F)), h3(static_cast<size_t>(F)), a(static_cast<size_t>(F)), y(static_cast<size_t>(C));
      for (int64_t i = 0; i < F; ++i) {
        for (int64_t c = 0; c < C; ++c) {
          h1[i] += p.w1[(e * F + i) * C + c] * x[c];
          h3[i] += p.w3[(e * F + i) * C + c] * x[c];
        }
        a[i] = silu(h1[i]) * h3[i];
      }
      for (int64_t c = 0; c < C; ++c) {
        for (int64_t i = 0; i < F; ++i) y[c] += p.w2[(e * C + c) * F + i] * a[i];
        r.out[t * C + c] += m * gate[e] * y[c];
        dgate[e] += m * dout[c] * y[c];
      }
      // expert backward with dy = m * gate * dout
      Vec da(static_cast<size_t>(F));
      for (int64_t c = 0; c < C; ++c) {
        const double dy = m * gate[e] * dout[c];
        for (int64_t i = 0; i < F; ++i) {
          r.dw2[(e * C + c) * F + i] += dy * a[i];
          da[i] += dy * p.w2[(e * C + c) * F + i];
        }
      }
      for (int64_t i = 0; i < F; ++i) {
        const double dh1 = da[i] * h3[i] * dsilu(h1[i]), dh3 = da[i] * silu(h1[i]);
        for (int64_t c = 0; c < C; ++c) {
          r.dw1[(e * F + i) * C + c] += dh1 * x[c];
          r.dw3[(e * F + i) * C + c] += dh3 * x[c];
          r.dx[t * C + c] += dh1 * p.w1[(e * F + i) * C + c] + dh3 * p.w3[(e * F + i) * C + c];
        }
      }
    }
    // gate = p_e / sum_chosen: full Jacobian (or gate = p_e)
    Vec dp(static_cast<size_t>(E), 0);
    for (int j : chosen[t])
      for (int m : chosen[t]) {
        const double by_sum = p.renormalise ? probs[t * E + j] / (sum_chosen * sum_chosen) : 0.0;
        dp[m] += dgate[j] * ((j == m ? 1.0 / sum_chosen : 0.0) - by_sum);
      }
    for (int e = 0; e < E; ++e) dp[e] += p.d_aux * p.coef * E * f[e] / static_cast<double>(NG);
    for (int j = 0; j < E; ++j) {  // softmax Jacobian
      double dl = 0;
      for (int i = 0; i < E; ++i) dl += dp[i] * probs[t * E + i] * ((i == j ? 1.0 : 0.0) - probs[t * E + j]);
      for (int64_t c = 0; c < C; ++c) {
        r.drouter[j * C + c] += dl * x[c];
        r.dx[t * C + c] += dl * p.router[j * C + c];
      }
    }
  }
  for (size_t t = 0; t < kept.size(); ++t)
    for (bool k : kept[t]) r.dropped += k ? 0 : 1;
  return r;
}

// The expert-parallel layer on G devices (expert axis "data"); results gathered in global layout.
Result expert_parallel(const Problem& p, int G) {
  const int64_t NG = p.tokens(), C = p.C, F = p.F;
  const int E = p.E;
  Result r;
  r.out.assign(static_cast<size_t>(NG * C), 0);
  r.dx = r.out;
  r.drouter.assign(p.router.size(), 0);
  r.dw1.assign(p.w1.size(), 0);
  r.dw2.assign(p.w2.size(), 0);
  r.dw3.assign(p.w3.size(), 0);
  std::mutex mu;
  tpcli::nn::MoeSizes s{C, F, E, p.K, static_cast<float>(p.coef), p.capacity, p.renormalise};
  auto to_f = [](const double* first, int64_t n) { return std::vector<float>(first, first + n); };
  tpcli::dist::run_on_mesh(Mesh::line(G, "data"), [&](Device& dev) {
    auto& group = dev.axis("data");
    const int d = group.rank();
    const int64_t first = std::accumulate(p.chunks.begin(), p.chunks.begin() + d, int64_t{0}), N = p.chunks[d];
    const auto ex = tpcli::nn::local_experts(E, G, d);
    std::vector<float> x = to_f(&p.x[first * C], N * C), dout = to_f(&p.dout[first * C], N * C);
    std::vector<float> router = to_f(p.router.data(), E * C);
    std::vector<float> w1 = to_f(&p.w1[ex.offset * F * C], ex.count * F * C);
    std::vector<float> w2 = to_f(&p.w2[ex.offset * C * F], ex.count * C * F);
    std::vector<float> w3 = to_f(&p.w3[ex.offset * F * C], ex.count * F * C);
    std::vector<float> out(x.size()), dx(x.size()), drouter(router.size()), dw1(w1.size()), dw2(w2.size()),
        dw3(w3.size());
    tpcli::nn::MoeActivations acts;
    tpcli::nn::MoeWeights w{router, w1, w2, w3};
    const float aux = tpcli::nn::moe_forward(out, acts, x, w, s, N, group);
    // The global aux loss is sum_d (N_d / NG) aux_d.
    const float d_aux = static_cast<float>(p.d_aux * static_cast<double>(N) / static_cast<double>(NG));
    tpcli::nn::moe_backward(dx, {drouter, dw1, dw2, dw3}, dout, d_aux, x, w, acts, s, group);
    group.all_sum(drouter);
    std::lock_guard lock(mu);
    r.aux += static_cast<double>(aux) * static_cast<double>(N) / static_cast<double>(NG);
    std::copy(out.begin(), out.end(), r.out.begin() + first * C);
    std::copy(dx.begin(), dx.end(), r.dx.begin() + first * C);
    std::copy(dw1.begin(), dw1.end(), r.dw1.begin() + ex.offset * F * C);
    std::copy(dw2.begin(), dw2.end(), r.dw2.begin() + ex.offset * C * F);
    std::copy(dw3.begin(), dw3.end(), r.dw3.begin() + ex.offset * F * C);
    r.dropped += acts.stats.dropped;
    if (d == 0) {
      std::copy(drouter.begin(), drouter.end(), r.drouter.begin());
      r.counts = acts.stats.tokens_per_expert;
    }
  }, one_thread());
  return r;
}

// max |a - b| / max |b|: relative to the tensor's scale, so tiny entries don't dominate.
double rel_err(const Vec& a, const Vec& b) {
  REQUIRE(a.size() == b.size());
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(a[i] - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  return num / den;
}

void require_match(const Result& ep, const Result& ref, double tol = 1e-4) {
  CHECK(rel_err(ep.out, ref.out) < tol);
  CHECK(std::abs(ep.aux - ref.aux) <= tol * std::abs(ref.aux) + 1e-9);
  CHECK(rel_err(ep.dx, ref.dx) < tol);
  CHECK(rel_err(ep.drouter, ref.drouter) < tol);
  CHECK(rel_err(ep.dw1, ref.dw1) < tol);
  CHECK(rel_err(ep.dw2, ref.dw2) < tol);
  CHECK(rel_err(ep.dw3, ref.dw3) < tol);
  CHECK(ep.counts == ref.counts);
  CHECK(ep.dropped == ref.dropped);
}

// L = sum(dout * out) + d_aux * aux, the scalar whose gradient both backward passes compute.
double loss(const Problem& p) {
  Result r = reference(p);
  double l = p.d_aux * r.aux;
  for (size_t i = 0; i < r.out.size(); ++i) l += p.dout[i] * r.out[i];
  return l;
}

}  // namespace

TEST_CASE("moe: expert-parallel forward and backward equal the plain method", "[nn][moe]") {
  for (int E : {4, 8})
    for (int K : {1, 2, E})
      for (int G : {1, 2, 4, 8}) {
        INFO("E = " << E << ", K = " << K << ", G = " << G);
        // 50 tokens: uneven chunks for G = 4 and 8
        Problem p = make_problem(E, K, G, 50, static_cast<uint32_t>(100 * E + 10 * K + G));
        require_match(expert_parallel(p, G), reference(p));
        if (K == E) continue;  // with every expert chosen, unnormalised gates are the same
        p.renormalise = false;  // Qwen2-MoE's and OLMoE's gates
        INFO("unnormalised gates");
        require_match(expert_parallel(p, G), reference(p));
      }
}

TEST_CASE("moe: the reference backward equals central finite differences", "[nn][moe]") {
  for (int K : {1, 2, 4})
  for (const bool renormalise : {true, false}) {
    INFO("K = " << K << (renormalise ? "" : ", unnormalised gates"));
    Problem p = make_problem(4, K, 1, 9, static_cast<uint32_t>(7 + K));
    p.C = 12;
    p.renormalise = renormalise;
    const Result r = reference(p);
    std::mt19937 rng(3);
    auto probe = [&](Vec& param, const Vec& grad, const char* name) {
      for (int trial = 0; trial < 6; ++trial) {
        const size_t i = std::uniform_int_distribution<size_t>(0, param.size() - 1)(rng);
        const double keep = param[i], h = 1e-6;
        param[i] = keep + h;
        const double up = loss(p);
        param[i] = keep - h;
        const double down = loss(p);
        param[i] = keep;
        INFO(name << "[" << i << "]");
        CHECK((up - down) / (2 * h) == Approx(grad[i]).epsilon(1e-5).margin(1e-7));
      }
    };
    probe(p.x, r.dx, "x");
    probe(p.router, r.drouter, "router");
    probe(p.w1, r.dw1, "w1");
    probe(p.w2, r.dw2, "w2");
    probe(p.w3, r.dw3, "w3");
  }
}

TEST_CASE("moe: float backward on 2 devices against finite differences of its own forward", "[nn][moe]") {
  // Independent of the reference: perturb one input coordinate of the float layer.
  Problem p = make_problem(4, 2, 2, 16, 42);
  const Result base = expert_parallel(p, 2);
  auto ep_loss = [&](const Problem& q) {
    Result r = expert_parallel(q, 2);
    double l = q.d_aux * r.aux;
    for (size_t i = 0; i < r.out.size(); ++i) l += q.dout[i] * r.out[i];
    return l;
  };
  std::mt19937 rng(5);
  for (int trial = 0; trial < 4; ++trial) {
    const size_t i = std::uniform_int_distribution<size_t>(0, p.x.size() - 1)(rng);
    const double keep = p.x[i], h = 1e-2;
    p.x[i] = keep + h;
    const double up = ep_loss(p);
    p.x[i] = keep - h;
    const double down = ep_loss(p);
    p.x[i] = keep;
    INFO("x[" << i << "]");
    CHECK((up - down) / (2 * h) == Approx(base.dx[i]).epsilon(2e-2).margin(1e-3));
  }
}

TEST_CASE("moe: skewed routing — all tokens to one expert, and an expert with no tokens", "[nn][moe]") {
  for (int G : {1, 2, 4}) {
    INFO("G = " << G);
    // Every token has x[:,0] > 1; router row 2 gains 6 per unit of x[:,0], row 0 loses 6.
    Problem p = make_problem(4, 1, G, 24, 77);
    for (int64_t t = 0; t < p.tokens(); ++t) p.x[t * p.C] = 1.5 + std::abs(p.x[t * p.C]);
    p.router[2 * p.C] = 6.0;
    p.router[0] = -6.0;
    Result ref = reference(p);
    REQUIRE(ref.counts == std::vector<int64_t>{0, 0, p.tokens(), 0});
    require_match(expert_parallel(p, G), ref);

    p.K = 2;  // second choices spread over experts 1 and 3; expert 0 still gets nothing
    ref = reference(p);
    REQUIRE(ref.counts[0] == 0);
    REQUIRE(ref.counts[2] == p.tokens());
    require_match(expert_parallel(p, G), ref);
  }
}

TEST_CASE("moe: a capacity factor drops the overflow, counted, as the reference does", "[nn][moe]") {
  for (int G : {1, 2, 4}) {
    INFO("G = " << G);
    Problem p = make_problem(4, 2, G, 32, 91);
    for (int64_t t = 0; t < p.tokens(); ++t) p.x[t * p.C] = 1.0 + std::abs(p.x[t * p.C]);
    p.router[p.C] = 2.0;  // expert 1 popular: overflows
    p.capacity = 1.0f;
    Result ref = reference(p);
    REQUIRE(ref.dropped > 0);
    require_match(expert_parallel(p, G), ref);
  }
}

TEST_CASE("moe: bytes moved are exactly the ragged rows (no padding)", "[nn][moe]") {
  Problem p = make_problem(8, 2, 4, 40, 5);
  const int64_t C = p.C;
  tpcli::nn::MoeSizes s{C, p.F, p.E, p.K, static_cast<float>(p.coef), std::nullopt};
  std::vector<int64_t> sent(4), received(4), rows_sent(4), rows_received(4);
  tpcli::dist::run_on_mesh(Mesh::line(4, "data"), [&](Device& dev) {
    auto& group = dev.axis("data");
    const int d = group.rank();
    const int64_t N = p.chunks[d], first = d * N;
    const auto ex = tpcli::nn::local_experts(p.E, 4, d);
    std::vector<float> x(&p.x[first * C], &p.x[first * C] + N * C), router(p.router.begin(), p.router.end());
    std::vector<float> w1(static_cast<size_t>(ex.count * p.F * C), 0.01f), w2 = w1, w3 = w1, out(x.size());
    tpcli::nn::MoeActivations acts;
    tpcli::nn::moe_forward(out, acts, x, {router, w1, w2, w3}, s, N, group);
    sent[d] = static_cast<int64_t>(acts.stats.bytes_sent);
    received[d] = static_cast<int64_t>(acts.stats.bytes_received);
    rows_sent[d] = acts.stats.rows_sent;
    rows_received[d] = acts.stats.rows_received;
    // Expected: rows to other members (and back), plus the counts of their experts, 4 bytes each.
    int64_t to_others = 0, meta_out = 0;
    for (int64_t t = 0; t < N; ++t)
      for (int k = 0; k < p.K; ++k) {
        const int owner = tpcli::nn::expert_owner(acts.expert[t * p.K + k], p.E, 4);
        if (owner != d) ++to_others;
      }
    for (int m = 0; m < 4; ++m)
      if (m != d) meta_out += tpcli::nn::local_experts(p.E, 4, m).count;
    CHECK(acts.stats.rows_sent == N * p.K);
    const int64_t from_others = acts.stats.rows_received - (N * p.K - to_others);
    CHECK(static_cast<int64_t>(acts.stats.bytes_sent) == 4 * (meta_out + (to_others + from_others) * C));
    CHECK(static_cast<int64_t>(acts.stats.bytes_received) == 4 * (ex.count * 3 + (to_others + from_others) * C));
  }, one_thread());
  // What the group sends, it receives.
  CHECK(std::accumulate(sent.begin(), sent.end(), int64_t{0}) ==
        std::accumulate(received.begin(), received.end(), int64_t{0}));
  CHECK(std::accumulate(rows_sent.begin(), rows_sent.end(), int64_t{0}) ==
        std::accumulate(rows_received.begin(), rows_received.end(), int64_t{0}));
}

TEST_CASE("moe: MoeFeedForward with experts also tensor-parallel equals the plain method", "[nn][moe]") {
  // Mesh data x model: tokens split over data (the expert axis), mirrored over model, which splits
  // every expert's hidden rows (AllToSharded w1/w3, ShardedToAll w2 inside each expert).
  for (auto [G, T] : {std::pair{1, 2}, std::pair{2, 2}, std::pair{2, 3}, std::pair{4, 2}}) {
    INFO("data = " << G << ", model = " << T);
    Problem p = make_problem(4, 2, G, 24, static_cast<uint32_t>(G * 10 + T));
    // The layer's loss is sum(dout * out) + sum over devices of aux_d (its backward uses d_aux = 1);
    // with equal chunks that is the reference with d_aux = G.
    for (int64_t n : p.chunks) REQUIRE(n == p.chunks[0]);
    p.d_aux = G;
    const Result ref = reference(p);
    const int64_t C = p.C, F = p.F;
    const int E = p.E;
    tpcli::nn::MoeSizes s{C, F, E, p.K, static_cast<float>(p.coef), std::nullopt};
    std::vector<float> router(p.router.begin(), p.router.end()), w1(p.w1.begin(), p.w1.end()),
        w2(p.w2.begin(), p.w2.end()), w3(p.w3.begin(), p.w3.end());
    Result ep;
    ep.out.assign(ref.out.size(), 0);
    ep.dx = ep.out;
    ep.drouter.assign(ref.drouter.size(), 0);
    ep.dw1.assign(ref.dw1.size(), 0);
    ep.dw2.assign(ref.dw2.size(), 0);
    ep.dw3.assign(ref.dw3.size(), 0);
    std::mutex mu;
    bool gathered_ok = true, names_ok = true;
    tpcli::dist::run_on_mesh(Mesh({{"data", G}, {"model", T}}), [&](Device& dev) {
      auto& data = dev.axis("data");
      const int d = data.rank(), m = dev.axis("model").rank();
      tpcli::nn::MoeFeedForward ffn(s, router, w1, w2, w3, data, dev.axis("model"), "layers.0.");
      const int64_t first = std::accumulate(p.chunks.begin(), p.chunks.begin() + d, int64_t{0}), N = p.chunks[d];
      std::vector<float> x(&p.x[first * C], &p.x[first * C] + N * C), dout(&p.dout[first * C], &p.dout[first * C] + N * C);
      std::vector<float> out(x.size()), dx(x.size());
      ffn.forward(out.data(), x.data(), N);
      auto params = ffn.parameters();
      for (auto& q : params) q.grad->zero();
      ffn.backward(dx.data(), dout.data(), x.data(), N);
      data.all_sum(params[0].grad->span());
      const auto full = ffn.gather_full();
      std::lock_guard lock(mu);
      const char* names[] = {"layers.0.router", "layers.0.experts.w1", "layers.0.experts.w2", "layers.0.experts.w3"};
      for (int i = 0; i < 4; ++i) names_ok = names_ok && params[static_cast<size_t>(i)].name == names[i];
      const std::vector<float>* want[] = {&router, &w1, &w2, &w3};
      for (int i = 0; i < 4; ++i)
        gathered_ok = gathered_ok && full[static_cast<size_t>(i)].first == names[i] &&
                      std::equal(want[i]->begin(), want[i]->end(), full[static_cast<size_t>(i)].second.data());
      if (m == 0) {
        std::copy(out.begin(), out.end(), ep.out.begin() + first * C);
        std::copy(dx.begin(), dx.end(), ep.dx.begin() + first * C);
        ep.aux += ffn.aux_loss() * static_cast<double>(N) / static_cast<double>(p.tokens());
      }
      if (d == 0 && m == 0) {
        std::copy(params[0].grad->data(), params[0].grad->data() + params[0].grad->numel(), ep.drouter.begin());
        ep.counts = ffn.stats().tokens_per_expert;
      }
      // expert grads: local experts x local hidden rows, scattered into the full layout
      const auto ex = tpcli::nn::local_experts(E, G, d);
      const auto h = tpcli::dist::even_split(F, T, m);
      for (int64_t j = 0; j < ex.count; ++j) {
        const int64_t e = ex.offset + j;
        for (int64_t i = 0; i < h.count; ++i)
          for (int64_t c = 0; c < C; ++c) {
            ep.dw1[(e * F + h.offset + i) * C + c] = (*params[1].grad)[(j * h.count + i) * C + c];
            ep.dw3[(e * F + h.offset + i) * C + c] = (*params[3].grad)[(j * h.count + i) * C + c];
            ep.dw2[(e * C + c) * F + h.offset + i] = (*params[2].grad)[(j * C + c) * h.count + i];
          }
      }
    }, one_thread());
    CHECK(names_ok);
    CHECK(gathered_ok);
    require_match(ep, ref);
  }
}

TEST_CASE("moe: the load-balancing loss alone evens out a skewed router (loads within 2x of even)", "[nn][moe]") {
  // Start with nearly every token on expert 0; descend the aux loss only (dout = 0) on 2 devices.
  for (int K : {1, 2}) {
    INFO("K = " << K);
    Problem p = make_problem(4, K, 2, 256, 11);
    for (int64_t t = 0; t < p.tokens(); ++t) p.x[t * p.C] = 1.0 + std::abs(p.x[t * p.C]);
    p.router[0] = 3.0;
    const int64_t C = p.C, F = p.F;
    const int E = p.E;
    tpcli::nn::MoeSizes s{C, F, E, K, 1.0f, std::nullopt};
    std::vector<int64_t> first_counts, last_counts;
    tpcli::dist::run_on_mesh(Mesh::line(2, "data"), [&](Device& dev) {
      auto& g = dev.axis("data");
      const int d = g.rank();
      const int64_t N = p.chunks[d], first = d * p.chunks[0];
      const auto ex = tpcli::nn::local_experts(E, 2, d);
      std::vector<float> x(&p.x[first * C], &p.x[first * C] + N * C), router(p.router.begin(), p.router.end());
      std::vector<float> w1(static_cast<size_t>(ex.count * F * C), 0.1f), w2 = w1, w3 = w1, dw1(w1.size()), dw2(w1.size()),
          dw3(w1.size());
      std::vector<float> out(x.size()), dx(x.size()), dout(x.size(), 0.0f), drouter(router.size());
      tpcli::nn::MoeActivations acts;
      for (int step = 0; step < 100; ++step) {
        tpcli::nn::moe_forward(out, acts, x, {router, w1, w2, w3}, s, N, g);
        if (step == 0) first_counts = acts.stats.tokens_per_expert;
        std::fill(drouter.begin(), drouter.end(), 0.0f);
        tpcli::nn::moe_backward(dx, {drouter, dw1, dw2, dw3}, dout, 1.0f, x, {router, w1, w2, w3}, acts, s, g);
        g.mean(drouter);  // data-parallel: the router is replicated
        for (size_t i = 0; i < router.size(); ++i) router[i] -= 2.0f * drouter[i];
      }
      tpcli::nn::moe_forward(out, acts, x, {router, w1, w2, w3}, s, N, g);
      if (d == 0) last_counts = acts.stats.tokens_per_expert;
    }, one_thread());
    const double even = static_cast<double>(p.tokens() * K) / p.E;
    CHECK(*std::max_element(first_counts.begin(), first_counts.end()) > 1.5 * even);  // skewed at the start
    for (int64_t n : last_counts) {
      CHECK(static_cast<double>(n) <= 2 * even);
      CHECK(static_cast<double>(n) >= even / 2);
    }
  }
}

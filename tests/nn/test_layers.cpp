// Each layer's backward against central finite differences of its forward.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "distributed/group.h"
#include "fd_check.h"
#include "nn/attention.h"
#include "nn/cross_entropy.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/rmsnorm.h"
#include "nn/rope.h"
#include "nn/swiglu.h"
#include "tensor/blas.h"

using namespace tpcli;
using nn::testing::check_gradient;
using nn::testing::dot;
using nn::testing::random_vector;

TEST_CASE("Linear forward matches a serial product - backward matches finite differences", "[nn][linear]") {
  std::mt19937 rng(1);
  const int64_t N = 3, IN = 5, OUT = 4;
  auto w = random_vector(OUT * IN, rng);
  auto x = random_vector(N * IN, rng);
  auto wout = random_vector(N * OUT, rng);
  auto run = [&](std::vector<float>& out) {
    nn::Linear lin(tensor::Tensor({OUT, IN}, w));
    out.assign(N * OUT, 0.0f);
    lin.forward(out.data(), x.data(), N);
  };
  std::vector<float> out;
  run(out);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OUT; ++o) {
      double s = 0;
      for (int64_t i = 0; i < IN; ++i) s += double(x[n * IN + i]) * w[o * IN + i];
      CHECK(out[n * OUT + o] == Approx(s).epsilon(1e-5));
    }
  nn::Linear lin(tensor::Tensor({OUT, IN}, w));
  std::vector<float> dx(N * IN, 0.5f);  // accumulates onto what is there
  lin.backward(dx.data(), wout.data(), x.data(), N);
  for (auto& v : dx) v -= 0.5f;
  auto loss = [&] { std::vector<float> o; run(o); return dot(o, wout); };
  check_gradient(x, dx, loss);
  std::vector<float> dw(lin.grad().span().begin(), lin.grad().span().end());
  check_gradient(w, dw, loss);
  // N == 1 (the matvec path) agrees with the gemm path's first row
  std::vector<float> one(OUT);
  lin.forward(one.data(), x.data(), 1);
  for (int64_t o = 0; o < OUT; ++o) CHECK(one[o] == Approx(out[o]).epsilon(1e-5));
}

TEST_CASE("RMSNorm backward matches finite differences", "[nn][rmsnorm]") {
  std::mt19937 rng(2);
  const int64_t N = 3, C = 6;
  auto x = random_vector(N * C, rng);
  auto w = random_vector(C, rng);
  auto wout = random_vector(N * C, rng);
  auto fwd = [&](std::vector<float>& out, std::vector<float>& rstd) {
    out.assign(N * C, 0.0f);
    rstd.assign(N, 0.0f);
    nn::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
  };
  std::vector<float> out, rstd;
  fwd(out, rstd);
  // forward against the formula in double
  for (int64_t n = 0; n < N; ++n) {
    double ss = 0;
    for (int64_t j = 0; j < C; ++j) ss += double(x[n * C + j]) * x[n * C + j];
    const double r = 1.0 / std::sqrt(ss / C + 1e-5);
    for (int64_t j = 0; j < C; ++j) CHECK(out[n * C + j] == Approx(w[j] * x[n * C + j] * r).epsilon(1e-5));
  }
  std::vector<float> dx(N * C, 0.0f), dw(C, 0.0f);
  nn::rmsnorm_backward(dx.data(), dw.data(), wout.data(), x.data(), w.data(), rstd.data(), N, C);
  auto loss = [&] { std::vector<float> o, r; fwd(o, r); return dot(o, wout); };
  check_gradient(x, dx, loss, 1e-3f);
  check_gradient(w, dw, loss, 1e-3f);
}

TEST_CASE("RoPE follows llama2.c's convention and its backward matches finite differences", "[nn][rope]") {
  const int S = 6, HS = 8;
  nn::RopeTable rope(S, HS, 10000.0f);
  // One head, pos 3, pair i = 1 (elements 2, 3): angle 3 * 10000^(-2/8).
  std::vector<float> v(HS, 0.0f);
  v[2] = 1.0f;
  rope.forward(v.data(), 1, 3);
  const double angle = 3.0 * std::pow(10000.0, -2.0 / 8.0);
  CHECK(v[2] == Approx(std::cos(angle)).epsilon(1e-5));
  CHECK(v[3] == Approx(std::sin(angle)).epsilon(1e-5));
  CHECK(v[0] == 0.0f);

  std::mt19937 rng(3);
  const int heads = 2;
  auto x = random_vector(heads * HS, rng);
  auto wout = random_vector(heads * HS, rng);
  auto loss = [&] { std::vector<float> o = x; rope.forward(o.data(), heads, 5); return dot(o, wout); };
  std::vector<float> dx = wout;
  rope.backward(dx.data(), heads, 5);
  check_gradient(x, dx, loss, 1e-3f);
}

TEST_CASE("attention (causal, grouped-query) backward matches finite differences - decode matches batched",
          "[nn][attention]") {
  std::mt19937 rng(4);
  // T = 70: two row blocks (64 + 6) of the training attention, the second uneven.
  const int64_t B = 2, HS = 4;
  const int64_t T = GENERATE(4, 70);
  std::vector<int> kv_of = {0, 0, 1};  // 3 query heads over 2 kv heads (uneven, like a shard)
  nn::AttentionShape s{3, 2, HS, kv_of};
  const int64_t QKV = s.qkv_dim(), QL = s.q_dim(), KVL = s.kv_dim();
  auto qkv = random_vector(B * T * QKV, rng);
  auto wout = random_vector(B * T * QL, rng);
  std::vector<float> att(B * 3 * T * T);
  auto fwd = [&](std::vector<float>& out) {
    out.assign(B * T * QL, 0.0f);
    nn::attention_forward(out.data(), att.data(), qkv.data(), B, T, s);
  };
  std::vector<float> out;
  fwd(out);
  // Causality: perturbing the last token's k/v leaves the first T-1 outputs unchanged.
  {
    auto saved = qkv;
    for (int64_t i = QL; i < QKV; ++i) qkv[(T - 1) * QKV + i] += 1.0f;
    std::vector<float> out2;
    fwd(out2);
    for (int64_t i = 0; i < (T - 1) * QL; ++i) CHECK(out2[i] == out[i]);
    qkv = saved;
    fwd(out);
  }
  // Decode, position by position with a cache, gives the batched rows of sequence 1.
  const int32_t first_block = 0;
  const std::span<const int32_t> whole_cache(&first_block, 1);
  std::vector<float> kc(T * KVL), vc(T * KVL), o1(QL);
  for (int t = 0; t < T; ++t) {
    const float* row = qkv.data() + (T + t) * QKV;
    std::copy(row + QL, row + QL + KVL, kc.begin() + t * KVL);
    std::copy(row + QL + KVL, row + QKV, vc.begin() + t * KVL);
    nn::attention_decode(o1.data(), row, {kc.data(), vc.data(), whole_cache, T}, t, s);
    for (int64_t i = 0; i < QL; ++i) CHECK(o1[i] == Approx(out[(T + t) * QL + i]).epsilon(1e-5).margin(1e-6));
  }
  std::vector<float> dqkv(B * T * QKV, 0.0f);
  nn::attention_backward(dqkv.data(), wout.data(), qkv.data(), att.data(), B, T, s);
  auto loss = [&] { std::vector<float> o; fwd(o); return dot(o, wout); };
  check_gradient(qkv, dqkv, loss, 1e-3f);
}

TEST_CASE("attention over the KV cache, P rows at once, equals decode row by row bit for bit (any start position)",
          "[nn][attention]") {
  std::mt19937 rng(41);
  const int64_t HS = 8, S = 200;  // 150 rows: three row blocks of the batched path
  std::vector<int> kv_of = {0, 1, 1};
  nn::AttentionShape s{3, 2, static_cast<int>(HS), kv_of};
  const int64_t QKV = s.qkv_dim(), QL = s.q_dim(), KVL = s.kv_dim();
  const int32_t first_block = 0;
  const std::span<const int32_t> whole_cache(&first_block, 1);
  for (const auto& [pos, P] : std::vector<std::pair<int, int64_t>>{{0, 150}, {37, 150}, {5, 2}, {0, 1}}) {
    INFO(P << " rows from position " << pos);
    const auto prefix = random_vector(pos * QKV, rng), qkv = random_vector(P * QKV, rng);  // [pos, QKV], [P, QKV]
    // Reference: decode, one row at a time, the cache filled as it goes.
    std::vector<float> kc(S * KVL), vc(S * KVL), expected(P * QL);
    auto decode_row = [&](const float* row, int t, float* out) {
      std::copy(row + QL, row + QL + KVL, kc.begin() + t * KVL);
      std::copy(row + QL + KVL, row + QKV, vc.begin() + t * KVL);
      nn::attention_decode(out, row, {kc.data(), vc.data(), whole_cache, S}, t, s);
    };
    std::vector<float> ignored(QL);
    for (int t = 0; t < pos; ++t) decode_row(prefix.data() + t * QKV, t, ignored.data());
    const auto prefix_k = kc, prefix_v = vc;
    for (int64_t n = 0; n < P; ++n) decode_row(qkv.data() + n * QKV, pos + static_cast<int>(n), expected.data() + n * QL);
    // Batched, on a cache holding only the prefix; it must write the rows' k and v itself.
    std::vector<float> kb = prefix_k, vb = prefix_v, out(P * QL);
    nn::attention_cached(out.data(), qkv.data(), {kb.data(), vb.data(), whole_cache, S}, pos, P, s);
    CHECK(kb == kc);
    CHECK(vb == vc);
    CHECK(out == expected);  // decode's bits exactly
    // The same rows over a pool of 16-position blocks in scattered order.
    const int64_t BS = 16, blocks = (S + BS - 1) / BS;
    std::vector<int32_t> table;
    for (int64_t b = 0; b < blocks; ++b) table.push_back(static_cast<int32_t>((b * 7 + 3) % blocks));  // 7 coprime to 13
    std::vector<float> kp(blocks * BS * KVL), vp(blocks * BS * KVL), paged(P * QL);
    for (int t = 0; t < pos; ++t) {
      const int64_t at = (table[static_cast<size_t>(t / BS)] * BS + t % BS) * KVL;
      std::copy_n(prefix_k.begin() + t * KVL, KVL, kp.begin() + at);
      std::copy_n(prefix_v.begin() + t * KVL, KVL, vp.begin() + at);
    }
    nn::attention_cached(paged.data(), qkv.data(), {kp.data(), vp.data(), table, BS}, pos, P, s);
    CHECK(paged == expected);
  }
}

TEST_CASE("SwiGLU backward matches finite differences", "[nn][swiglu]") {
  std::mt19937 rng(5);
  const int64_t N = 2, F = 5;
  auto h13 = random_vector(N * 2 * F, rng, 2.0f);
  auto wout = random_vector(N * F, rng);
  auto loss = [&] { std::vector<float> o(N * F); nn::swiglu_forward(o.data(), h13.data(), N, F); return dot(o, wout); };
  std::vector<float> d(N * 2 * F, 0.0f);
  nn::swiglu_backward(d.data(), wout.data(), h13.data(), N, F);
  check_gradient(h13, d, loss, 1e-3f);
}

TEST_CASE("embedding backward scatters into the looked-up rows - bad tokens are errors", "[nn][embedding]") {
  std::mt19937 rng(6);
  const int64_t V = 5, C = 3, N = 4;
  std::vector<int> tok = {1, 3, 1, 0};
  auto table = random_vector(V * C, rng);
  auto wout = random_vector(N * C, rng);
  auto loss = [&] { std::vector<float> o(N * C); nn::embedding_forward(o.data(), tok.data(), table.data(), N, V, C); return dot(o, wout); };
  std::vector<float> d(V * C, 0.0f);
  nn::embedding_backward(d.data(), wout.data(), tok.data(), N, C);
  check_gradient(table, d, loss, 1e-2f);
  std::vector<int> bad = {5};
  std::vector<float> o(C);
  CHECK_THROWS_WITH(nn::embedding_forward(o.data(), bad.data(), table.data(), 1, V, C), Catch::Contains("token 5"));
}

TEST_CASE("softmax cross-entropy: loss against the formula, backward against finite differences", "[nn][cross_entropy]") {
  std::mt19937 rng(7);
  const int64_t N = 3, V = 7;
  auto logits = random_vector(N * V, rng, 2.0f);
  std::vector<int> targets = {0, 6, 3};
  dist::Group single;
  auto loss = [&] {
    std::vector<float> l(N), p(N * V);
    return double(nn::cross_entropy_forward(l.data(), p.data(), logits.data(), targets.data(), 0, N, V, single));
  };
  double ref = 0;
  for (int64_t n = 0; n < N; ++n) {
    double m = -1e30, s = 0;
    for (int64_t v = 0; v < V; ++v) m = std::max(m, double(logits[n * V + v]));
    for (int64_t v = 0; v < V; ++v) s += std::exp(logits[n * V + v] - m);
    ref += std::log(s) + m - logits[n * V + targets[n]];
  }
  CHECK(loss() == Approx(ref / N).epsilon(1e-5));
  {  // probs may alias logits (the model computes them in place)
    std::vector<float> inplace = logits, l(N);
    const float aliased =
        nn::cross_entropy_forward(l.data(), inplace.data(), inplace.data(), targets.data(), 0, N, V, single);
    CHECK(aliased == Approx(ref / N).epsilon(1e-5));
  }
  std::vector<float> l(N), p(N * V), d(N * V, 0.0f);
  nn::cross_entropy_forward(l.data(), p.data(), logits.data(), targets.data(), 0, N, V, single);
  nn::cross_entropy_backward(d.data(), p.data(), targets.data(), 0, N, V, 1.0f / N);
  check_gradient(logits, d, loss, 1e-2f, 1e-4, 2e-2);
}

TEST_CASE("cross-entropy with ignored (-1) targets equals the cross-entropy of the counted rows alone, backward against finite differences", "[nn][cross_entropy]") {
  std::mt19937 rng(11);
  const int64_t N = 5, V = 6;
  auto logits = random_vector(N * V, rng, 2.0f);
  const std::vector<int> targets = {2, nn::IGNORED_TARGET, 5, nn::IGNORED_TARGET, 0};
  const std::vector<int64_t> kept = {0, 2, 4};
  dist::Group single;
  CHECK(nn::counted_targets(targets.data(), N) == 3);
  auto loss = [&] {
    std::vector<float> l(N), p(N * V);
    return double(nn::cross_entropy_forward(l.data(), p.data(), logits.data(), targets.data(), 0, N, V, single));
  };
  // The reference: the plain cross-entropy over the counted rows only.
  std::vector<float> sub_logits;
  std::vector<int> sub_targets;
  for (int64_t n : kept) {
    sub_logits.insert(sub_logits.end(), logits.begin() + n * V, logits.begin() + (n + 1) * V);
    sub_targets.push_back(targets[static_cast<size_t>(n)]);
  }
  const auto K = static_cast<int64_t>(kept.size());
  std::vector<float> sl(K), sp(K * V);
  const float ref = nn::cross_entropy_forward(sl.data(), sp.data(), sub_logits.data(), sub_targets.data(), 0, K, V, single);
  std::vector<float> l(N), p(N * V), d(N * V, 0.0f);
  CHECK(nn::cross_entropy_forward(l.data(), p.data(), logits.data(), targets.data(), 0, N, V, single) == Approx(ref).epsilon(1e-6));
  CHECK(l[1] == 0.0f);
  CHECK(l[3] == 0.0f);
  nn::cross_entropy_backward(d.data(), p.data(), targets.data(), 0, N, V, 1.0f / static_cast<float>(K));
  for (int64_t v = 0; v < V; ++v) {  // ignored rows: no gradient at all
    CHECK(d[1 * V + v] == 0.0f);
    CHECK(d[3 * V + v] == 0.0f);
  }
  check_gradient(logits, d, loss, 1e-2f, 1e-4, 2e-2);
  // No counted row: loss 0.
  const std::vector<int> none(N, nn::IGNORED_TARGET);
  CHECK(nn::cross_entropy_forward(l.data(), p.data(), logits.data(), none.data(), 0, N, V, single) == 0.0f);
}

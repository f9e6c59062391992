// Sharded layers on 1..4 devices against the unsharded layer (serial reference on one thread).
// Device threads only record results; all CHECKs run on the main thread.
#include <catch2/catch.hpp>

#include <random>
#include <span>
#include <vector>

#include "distributed/runtime.h"
#include "fd_check.h"
#include "shards.h"
#include "nn/cross_entropy.h"
#include "nn/linear.h"

using namespace tpcli;
using nn::testing::columns_of;
using nn::testing::random_vector;
using nn::testing::ranges_of;

namespace {

// Full-size reference products.
struct Reference {
  std::vector<float> out, dinp, dw;  // [N, OUT], [N, IN], [OUT, IN]
};

Reference reference(const std::vector<float>& w, const std::vector<float>& x, const std::vector<float>& dout, int64_t N,
                    int64_t OUT, int64_t IN) {
  nn::Linear lin(tensor::Tensor({OUT, IN}, w));
  Reference r;
  r.out.assign(N * OUT, 0.0f);
  r.dinp.assign(N * IN, 0.0f);
  lin.forward(r.out.data(), x.data(), N);
  lin.backward(r.dinp.data(), dout.data(), x.data(), N);
  r.dw.assign(lin.grad().span().begin(), lin.grad().span().end());
  return r;
}

void check_close(const std::vector<float>& got, const std::vector<float>& want, double margin = 0.0) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) CHECK(got[i] == Approx(want[i]).epsilon(1e-5).margin(margin));
}

std::vector<nn::Segment> segments_of(const std::vector<int64_t>& segs, int T, int rank) {
  std::vector<nn::Segment> out;
  for (int64_t s : segs) out.push_back({s, dist::even_split(s, T, rank)});
  return out;
}

}  // namespace

TEST_CASE("AllToShardedLinear with segments equals the full Linear on 1..4 devices", "[nn][sharded]") {
  std::mt19937 rng(11);
  const int64_t N = 3, IN = 6;
  const std::vector<int64_t> segs = {5, 3, 3};  // a fused q|k|v, uneven splits
  const int64_t OUT = 11;
  auto w = random_vector(OUT * IN, rng), x = random_vector(N * IN, rng), dout = random_vector(N * OUT, rng);
  const Reference ref = reference(w, x, dout, N, OUT, IN);
  for (int T = 1; T <= 4; ++T) {
    DYNAMIC_SECTION(T << " devices") {
      std::vector<std::vector<float>> outs(T), dinps(T), dws(T);
      dist::run_on_mesh(dist::Mesh::line(T), [&](dist::Device& dev) {
        dist::Group& g = dev.axis("model");
        nn::Linear full(tensor::Tensor({OUT, IN}, w));
        auto sharded = std::get<nn::AllToShardedLinear>(
            nn::shard_linear(full, nn::Sharding::AllToSharded, g, segments_of(segs, T, g.rank())));
        const int64_t OL = sharded.out_features();
        std::vector<float> out(N * OL), dinp(N * IN, 0.0f);
        sharded.forward(out.data(), x.data(), N);
        const std::vector<float> dl = columns_of(dout, N, OUT, ranges_of(segs, T, g.rank()));  // this device's dout
        sharded.backward(dinp.data(), dl.data(), x.data(), N);
        std::vector<float> dw;
        for (int i = 0; i < sharded.n_parts(); ++i)
          for (float v : sharded.part(i).grad().span()) dw.push_back(v);
        outs[g.rank()] = out;
        dinps[g.rank()] = dinp;
        dws[g.rank()] = dw;
      });
      for (int r = 0; r < T; ++r) {
        const auto rg = ranges_of(segs, T, r);
        check_close(outs[r], columns_of(ref.out, N, OUT, rg));
        // Weight rows of W [OUT, IN] are the columns of one row of OUT*IN values, ranges scaled by IN.
        std::vector<dist::Range> weight_rows;
        for (const dist::Range& q : rg) weight_rows.push_back({q.offset * IN, q.count * IN});
        check_close(dws[r], columns_of(ref.dw, 1, OUT * IN, weight_rows));
        check_close(dinps[r], ref.dinp, 1e-6);  // sum_gradients: every device holds the full input gradient
      }
    }
  }
}

// The layer keeps its segments' weights in one matrix and multiplies once; a copy of it gives each
// segment its own storage and multiplies segment by segment. Both must compute the same thing.
TEST_CASE("AllToShardedLinear: a copy (segments in their own storage) computes what the fused layer does", "[nn][sharded]") {
  std::mt19937 rng(12);
  const int64_t N = 4, IN = 5, OUT = 9;
  const std::vector<int64_t> segs = {3, 3, 3};
  auto w = random_vector(OUT * IN, rng), x = random_vector(N * IN, rng);
  std::vector<std::vector<float>> results[2];  // [fused, copy] per device: out, dinp, then dW
  dist::run_on_mesh(dist::Mesh::line(2), [&](dist::Device& dev) {
    dist::Group& g = dev.axis("model");
    nn::Linear full(tensor::Tensor({OUT, IN}, w));
    auto fused = std::get<nn::AllToShardedLinear>(
        nn::shard_linear(full, nn::Sharding::AllToSharded, g, segments_of(segs, 2, g.rank())));
    nn::AllToShardedLinear copy = fused;
    // The fused layer's gradients in one buffer, segment after segment (as the model lays them out:
    // one weight-gradient product); the copy's each in its own tensor (one product per segment).
    std::vector<float> grads(static_cast<size_t>(fused.out_features() * IN));  // [OUT_local, IN]
    for (int i = 0, row = 0; i < fused.n_parts(); row += fused.part(i).out_features(), ++i)
      fused.part(i).grad() = tensor::Tensor::view(fused.part(i).weight().shape(),
                                                  std::span<float>(grads).subspan(row * IN, fused.part(i).weight().numel()));
    std::mt19937 local_rng(13);
    const auto dout = random_vector(N * fused.out_features(), local_rng);
    for (int which = 0; which < 2; ++which) {
      nn::AllToShardedLinear& layer = which == 0 ? fused : copy;
      std::vector<float> out(N * layer.out_features()), dinp(N * IN, 0.5f), dw;
      layer.forward(out.data(), x.data(), N);
      layer.backward(dinp.data(), dout.data(), x.data(), N);
      for (int i = 0; i < layer.n_parts(); ++i)
        for (float v : layer.part(i).grad().span()) dw.push_back(v);
      if (g.rank() == 0) results[which] = {out, dinp, dw};
    }
  });
  REQUIRE(results[0].size() == 3);
  REQUIRE(results[1].size() == 3);
  for (int k = 0; k < 3; ++k) check_close(results[1][k], results[0][k], 1e-6);
  CHECK(results[0][1][0] != 0.5f);  // the input gradient was added
}

TEST_CASE("ShardedToAllLinear equals the full Linear on 1..4 devices", "[nn][sharded]") {
  std::mt19937 rng(12);
  const int64_t N = 2, OUT = 5;
  const std::vector<int64_t> segs = {7, 3};
  const int64_t IN = 10;
  auto w = random_vector(OUT * IN, rng), x = random_vector(N * IN, rng), dout = random_vector(N * OUT, rng);
  const Reference ref = reference(w, x, dout, N, OUT, IN);
  for (int T = 1; T <= 4; ++T) {
    DYNAMIC_SECTION(T << " devices") {
      std::vector<std::vector<float>> outs(T), dinps(T), dws(T);
      dist::run_on_mesh(dist::Mesh::line(T), [&](dist::Device& dev) {
        dist::Group& g = dev.axis("model");
        nn::Linear full(tensor::Tensor({OUT, IN}, w));
        auto sharded = std::get<nn::ShardedToAllLinear>(
            nn::shard_linear(full, nn::Sharding::ShardedToAll, g, segments_of(segs, T, g.rank())));
        const int64_t IL = sharded.in_features();
        const std::vector<float> xl = columns_of(x, N, IN, ranges_of(segs, T, g.rank()));  // this device's input
        std::vector<float> out(N * OUT), dinp(N * IL, 0.0f);
        sharded.forward(out.data(), xl.data(), N);
        sharded.backward(dinp.data(), dout.data(), xl.data(), N);
        outs[g.rank()] = out;
        dinps[g.rank()] = dinp;
        dws[g.rank()].assign(sharded.local().grad().span().begin(), sharded.local().grad().span().end());
      });
      for (int r = 0; r < T; ++r) {
        const auto rg = ranges_of(segs, T, r);
        check_close(outs[r], ref.out, 1e-6);
        check_close(dinps[r], columns_of(ref.dinp, N, IN, rg));
        check_close(dws[r], columns_of(ref.dw, OUT, IN, rg));
      }
    }
  }
}

TEST_CASE("shard_inplace keeps a plain Linear holding the same slice", "[nn][sharded]") {
  std::mt19937 rng(13);
  const int64_t OUT = 7, IN = 4;
  auto w = random_vector(OUT * IN, rng);
  std::vector<std::vector<float>> got(3);
  dist::run_on_mesh(dist::Mesh::line(3), [&](dist::Device& dev) {
    dist::Group& g = dev.axis("model");
    nn::Linear lin(tensor::Tensor({OUT, IN}, w));
    nn::shard_inplace(lin, nn::Sharding::AllToSharded, g);
    got[g.rank()].assign(lin.weight().span().begin(), lin.weight().span().end());
  });
  for (int r = 0; r < 3; ++r) {
    auto rg = dist::even_split(OUT, 3, r);
    REQUIRE(got[r].size() == static_cast<size_t>(rg.count * IN));
    for (int64_t i = 0; i < rg.count * IN; ++i) CHECK(got[r][i] == w[rg.offset * IN + i]);
  }
  nn::Linear bad(tensor::Tensor({OUT, IN}, w));
  dist::Group single;
  CHECK_THROWS_WITH(nn::shard_linear(bad, nn::Sharding::AllToSharded, single, {{3, {0, 3}}}),
                    Catch::Contains("segments add up to 3"));
}

TEST_CASE("vocabulary-split cross-entropy equals the single-device one", "[nn][sharded][cross_entropy]") {
  std::mt19937 rng(14);
  const int64_t N = 4, V = 11;
  auto logits = random_vector(N * V, rng, 3.0f);
  std::vector<int> targets = {0, 10, 5, 7};
  dist::Group single;
  std::vector<float> l(N), p(N * V), d(N * V, 0.0f);
  const float ref = nn::cross_entropy_forward(l.data(), p.data(), logits.data(), targets.data(), 0, N, V, single);
  nn::cross_entropy_backward(d.data(), p.data(), targets.data(), 0, N, V, 1.0f / N);
  for (int T = 2; T <= 4; ++T) {
    std::vector<float> losses(T);
    std::vector<std::vector<float>> grads(T);
    dist::run_on_mesh(dist::Mesh::line(T), [&](dist::Device& dev) {
      dist::Group& g = dev.axis("model");
      auto r = dist::even_split(V, T, g.rank());
      std::vector<float> local(N * r.count), ll(N), pl(N * r.count), dl(N * r.count, 0.0f);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < r.count; ++j) local[n * r.count + j] = logits[n * V + r.offset + j];
      losses[g.rank()] = nn::cross_entropy_forward(ll.data(), pl.data(), local.data(), targets.data(), r.offset, N,
                                                   r.count, g);
      nn::cross_entropy_backward(dl.data(), pl.data(), targets.data(), r.offset, N, r.count, 1.0f / N);
      grads[g.rank()] = dl;
    });
    for (int r = 0; r < T; ++r) {
      CHECK(losses[r] == Approx(ref).epsilon(1e-5));
      auto rg = dist::even_split(V, T, r);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < rg.count; ++j)
          CHECK(grads[r][n * rg.count + j] == Approx(d[n * V + rg.offset + j]).epsilon(1e-5).margin(1e-7));
    }
  }
}

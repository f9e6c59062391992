// LoRA adapters on the sharded linears (nn/lora.h) on 1..4 devices against a serial reference in
// double, and their gradients against central finite differences. Device threads only record
// results; all CHECKs run on the main thread.
#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include "distributed/runtime.h"
#include "fd_check.h"
#include "shards.h"
#include "nn/linear.h"

using namespace tpcli;
using nn::testing::random_vector;
using nn::testing::ranges_of;

namespace {

// y = x W^T + s (x A^T) B^T and its gradients for a loss with dL/dy = dout, in double.
struct LoraReference {
  std::vector<float> out, dinp, da, db;  // [N, OUT], [N, IN], [r, IN], [OUT, r]
};

LoraReference lora_reference(const std::vector<float>& w, const std::vector<float>& a, const std::vector<float>& b,
                             double s, const std::vector<float>& x, const std::vector<float>& dout, int64_t N,
                             int64_t OUT, int64_t IN, int64_t r) {
  std::vector<double> xa(N * r, 0.0), dxa(N * r, 0.0);  // x A^T, s dout B
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < r; ++k) {
      for (int64_t i = 0; i < IN; ++i) xa[n * r + k] += double(x[n * IN + i]) * a[k * IN + i];
      for (int64_t o = 0; o < OUT; ++o) dxa[n * r + k] += s * double(dout[n * OUT + o]) * b[o * r + k];
    }
  LoraReference ref;
  ref.out.assign(N * OUT, 0.0f);
  ref.dinp.assign(N * IN, 0.0f);
  ref.da.assign(r * IN, 0.0f);
  ref.db.assign(OUT * r, 0.0f);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t o = 0; o < OUT; ++o) {
      double y = 0.0;
      for (int64_t i = 0; i < IN; ++i) y += double(x[n * IN + i]) * w[o * IN + i];
      for (int64_t k = 0; k < r; ++k) y += s * xa[n * r + k] * b[o * r + k];
      ref.out[n * OUT + o] = static_cast<float>(y);
    }
    for (int64_t i = 0; i < IN; ++i) {
      double d = 0.0;
      for (int64_t o = 0; o < OUT; ++o) d += double(dout[n * OUT + o]) * w[o * IN + i];
      for (int64_t k = 0; k < r; ++k) d += dxa[n * r + k] * a[k * IN + i];
      ref.dinp[n * IN + i] = static_cast<float>(d);
    }
  }
  for (int64_t k = 0; k < r; ++k)
    for (int64_t i = 0; i < IN; ++i) {
      double d = 0.0;
      for (int64_t n = 0; n < N; ++n) d += dxa[n * r + k] * x[n * IN + i];
      ref.da[k * IN + i] = static_cast<float>(d);
    }
  for (int64_t o = 0; o < OUT; ++o)
    for (int64_t k = 0; k < r; ++k) {
      double d = 0.0;
      for (int64_t n = 0; n < N; ++n) d += s * double(dout[n * OUT + o]) * xa[n * r + k];
      ref.db[o * r + k] = static_cast<float>(d);
    }
  return ref;
}

// Rows [range) of a row-major [rows, width] matrix.
std::vector<float> rows_of(const std::vector<float>& m, int64_t width, dist::Range range) {
  return {m.begin() + range.offset * width, m.begin() + (range.offset + range.count) * width};
}

using nn::testing::columns_of;

std::vector<float> columns_of(const std::vector<float>& m, int64_t rows, int64_t width, dist::Range range) {
  return columns_of(m, rows, width, std::vector<dist::Range>{range});
}

void check_close(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) CHECK(got[i] == Approx(want[i]).epsilon(1e-5).margin(1e-5));
}

std::vector<float> values(const tensor::Tensor& t) { return {t.span().begin(), t.span().end()}; }

// The adapter with dropout p in a training pass (a fixed mask).
nn::LoraAdapter with_dropout(nn::LoraAdapter ad, float p) {
  ad.dropout = p;
  ad.stream = 77;
  ad.pass_seed = 5;
  return ad;
}

struct DeviceResult {
  std::vector<float> out, dinp, da, db;
  bool base_grad = false;  // whether the frozen base got a gradient
};

}  // namespace

// One adapted part (the middle one of three, like wk in wq|wk|wv): A replicated, B's rows split
// like the part's; the adapter's dxa rides in the base's all-sum.
TEST_CASE("LoRA on AllToShardedLinear equals the unsharded adapted layer on 1..4 devices", "[nn][lora]") {
  std::mt19937 rng(21);
  const int64_t N = 5, IN = 7, r = 3;
  const std::vector<int64_t> segs = {6, 5, 4};
  const int64_t OUT = 15, seg_offset = 6, seg = 5;  // the adapted part: rows [6, 11)
  const double alpha = 6.0, s = alpha / r;
  const auto w = random_vector(OUT * IN, rng), x = random_vector(N * IN, rng), dout = random_vector(N * OUT, rng);
  const auto a = random_vector(r * IN, rng), b = random_vector(seg * r, rng);
  // The reference: W with B's rows placed at the part's rows (zero elsewhere).
  std::vector<float> b_full(OUT * r, 0.0f);
  std::copy(b.begin(), b.end(), b_full.begin() + seg_offset * r);
  const LoraReference ref = lora_reference(w, a, b_full, s, x, dout, N, OUT, IN, r);
  for (int T = 1; T <= 4; ++T) {
    DYNAMIC_SECTION(T << " devices") {
      std::vector<DeviceResult> got(T);
      dist::run_on_mesh(dist::Mesh::line(T), [&](dist::Device& dev) {
        dist::Group& g = dev.axis("model");
        std::vector<nn::Segment> segments;
        for (int64_t n : segs) segments.push_back({n, dist::even_split(n, T, g.rank())});
        auto layer = std::get<nn::AllToShardedLinear>(
            nn::shard_linear(nn::Linear(tensor::Tensor({OUT, IN}, w)), nn::Sharding::AllToSharded, g, segments));
        layer.freeze();
        const dist::Range mine = dist::even_split(seg, T, g.rank());
        layer.set_adapter(1, nn::make_lora_adapter(tensor::Tensor({r, IN}, a),
                                                   tensor::Tensor({mine.count, r}, rows_of(b, r, mine)), alpha));
        const auto dl = columns_of(dout, N, OUT, ranges_of(segs, T, g.rank()));  // this device's dout
        DeviceResult& res = got[g.rank()];
        res.out.assign(N * layer.out_features(), 0.0f);
        res.dinp.assign(N * IN, 0.0f);
        layer.forward(res.out.data(), x.data(), N);
        layer.backward(res.dinp.data(), dl.data(), x.data(), N);
        res.da = values(layer.adapter(1)->a_grad);
        res.db = values(layer.adapter(1)->b_grad);
        for (int i = 0; i < layer.n_parts(); ++i) res.base_grad |= layer.part(i).has_grad();
      });
      for (int rank = 0; rank < T; ++rank) {
        check_close(got[rank].out, columns_of(ref.out, N, OUT, ranges_of(segs, T, rank)));
        check_close(got[rank].dinp, ref.dinp);
        check_close(got[rank].da, ref.da);  // replicated: the whole gradient on every device
        const dist::Range mine = dist::even_split(seg, T, rank);
        check_close(got[rank].db, rows_of(ref.db, r, {seg_offset + mine.offset, mine.count}));
        CHECK_FALSE(got[rank].base_grad);
      }
    }
  }
}

// A split by columns like W, B replicated; the adapter's xa rides in the forward's all-sum.
TEST_CASE("LoRA on ShardedToAllLinear equals the unsharded adapted layer on 1..4 devices", "[nn][lora]") {
  std::mt19937 rng(22);
  const int64_t N = 4, IN = 9, OUT = 6, r = 2;
  const double alpha = 16.0, s = alpha / r;
  const auto w = random_vector(OUT * IN, rng), x = random_vector(N * IN, rng), dout = random_vector(N * OUT, rng);
  const auto a = random_vector(r * IN, rng), b = random_vector(OUT * r, rng);
  const LoraReference ref = lora_reference(w, a, b, s, x, dout, N, OUT, IN, r);
  for (int T = 1; T <= 4; ++T) {
    DYNAMIC_SECTION(T << " devices") {
      std::vector<DeviceResult> got(T);
      dist::run_on_mesh(dist::Mesh::line(T), [&](dist::Device& dev) {
        dist::Group& g = dev.axis("model");
        auto layer = std::get<nn::ShardedToAllLinear>(
            nn::shard_linear(nn::Linear(tensor::Tensor({OUT, IN}, w)), nn::Sharding::ShardedToAll, g));
        layer.freeze();
        const dist::Range mine = dist::even_split(IN, T, g.rank());
        layer.set_adapter(nn::make_lora_adapter(tensor::Tensor({r, mine.count}, columns_of(a, r, IN, mine)),
                                                tensor::Tensor({OUT, r}, b), alpha));
        DeviceResult& res = got[g.rank()];
        const auto x_local = columns_of(x, N, IN, mine);
        res.out.assign(N * OUT, 0.0f);
        res.dinp.assign(N * mine.count, 0.0f);
        layer.forward(res.out.data(), x_local.data(), N);
        layer.backward(res.dinp.data(), dout.data(), x_local.data(), N);
        res.da = values(layer.adapter()->a_grad);
        res.db = values(layer.adapter()->b_grad);
        res.base_grad = layer.local().has_grad();
      });
      for (int rank = 0; rank < T; ++rank) {
        const dist::Range mine = dist::even_split(IN, T, rank);
        check_close(got[rank].out, ref.out);
        check_close(got[rank].dinp, columns_of(ref.dinp, N, IN, mine));
        check_close(got[rank].da, columns_of(ref.da, r, IN, mine));
        check_close(got[rank].db, ref.db);  // replicated: the whole gradient on every device
        CHECK_FALSE(got[rank].base_grad);
      }
    }
  }
}

// The analytic gradients of A, B and the input against central differences of the layer itself
// (not of the reference): loss = sum(out * dout).
TEST_CASE("LoRA gradients match finite differences on both sharded forms", "[nn][lora]") {
  std::mt19937 rng(23);
  const int64_t N = 3, IN = 5, OUT = 4, r = 2;
  auto w = random_vector(OUT * IN, rng), x = random_vector(N * IN, rng), dout = random_vector(N * OUT, rng);
  auto a = random_vector(r * IN, rng), b = random_vector(OUT * r, rng);
  for (bool columns : {false, true})
    for (float dropout : {0.0f, 0.4f}) {
      DYNAMIC_SECTION((columns ? "ShardedToAll" : "AllToSharded") << " dropout " << dropout) {
        dist::Group g;  // one device, on the test thread: the checks below may assert
        const auto loss = [&]() {  // rebuilt from the current a, b, x
          nn::Linear base(tensor::Tensor({OUT, IN}, w));
          auto ad = with_dropout(nn::make_lora_adapter(tensor::Tensor({r, IN}, a), tensor::Tensor({OUT, r}, b), 3.0), dropout);
          std::vector<float> out(N * OUT);
          if (columns) {
            auto layer = std::get<nn::ShardedToAllLinear>(nn::shard_linear(base, nn::Sharding::ShardedToAll, g));
            layer.set_adapter(std::move(ad));
            layer.forward(out.data(), x.data(), N);
          } else {
            auto layer = std::get<nn::AllToShardedLinear>(nn::shard_linear(base, nn::Sharding::AllToSharded, g));
            layer.set_adapter(0, std::move(ad));
            layer.forward(out.data(), x.data(), N);
          }
          return nn::testing::dot(out, dout);
        };
        nn::Linear base(tensor::Tensor({OUT, IN}, w));
        auto ad = with_dropout(nn::make_lora_adapter(tensor::Tensor({r, IN}, a), tensor::Tensor({OUT, r}, b), 3.0), dropout);
        std::vector<float> out(N * OUT), dinp(N * IN, 0.0f), da, db;
        if (columns) {
          auto layer = std::get<nn::ShardedToAllLinear>(nn::shard_linear(base, nn::Sharding::ShardedToAll, g));
          layer.set_adapter(std::move(ad));
          layer.forward(out.data(), x.data(), N);
          layer.backward(dinp.data(), dout.data(), x.data(), N);
          da = values(layer.adapter()->a_grad), db = values(layer.adapter()->b_grad);
        } else {
          auto layer = std::get<nn::AllToShardedLinear>(nn::shard_linear(base, nn::Sharding::AllToSharded, g));
          layer.set_adapter(0, std::move(ad));
          layer.forward(out.data(), x.data(), N);
          layer.backward(dinp.data(), dout.data(), x.data(), N);
          da = values(layer.adapter(0)->a_grad), db = values(layer.adapter(0)->b_grad);
        }
        nn::testing::check_gradient(a, da, loss);
        nn::testing::check_gradient(b, db, loss);
        nn::testing::check_gradient(x, dinp, loss);
      }
    }
}

TEST_CASE("LoRA dropout drops a fraction p of the adapter's inputs, the same for any split of the columns", "[nn][lora]") {
  nn::LoraAdapter ad = with_dropout(nn::make_lora_adapter(tensor::Tensor({1, 64}), tensor::Tensor({1, 1}), 1.0), 0.25f);
  const int64_t N = 500, IN = 64;
  std::vector<float> ones(N * IN, 1.0f), scratch;
  const float* x = nn::lora_input(ad, ones.data(), N, IN, scratch);
  int64_t dropped = 0;
  for (int64_t i = 0; i < N * IN; ++i) {
    if (x[i] == 0.0f) ++dropped;
    else CHECK(x[i] == Approx(1.0f / 0.75f));
  }
  CHECK(static_cast<double>(dropped) / (N * IN) == Approx(0.25).margin(0.01));
  // Columns [40, 64) on their own (a device's part of a split input) draw the same masks.
  nn::LoraAdapter right = ad;
  right.column_offset = 40;
  std::vector<float> part(N * 24, 1.0f), part_scratch;
  const float* y = nn::lora_input(right, part.data(), N, 24, part_scratch);
  bool same = true;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < 24; ++j) same &= y[n * 24 + j] == x[n * IN + 40 + j];
  CHECK(same);
  ad.pass_seed = 0;  // no training pass: no dropout
  CHECK(nn::lora_input(ad, ones.data(), N, IN, scratch) == ones.data());
}

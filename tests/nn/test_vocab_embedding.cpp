// The vocabulary-parallel embedding on 1..5 devices (uneven splits of V = 11) against the plain
// lookup and scatter on one table (serial reference). Device threads record; CHECKs on the main thread.
#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include "distributed/runtime.h"
#include "fd_check.h"
#include "nn/embedding.h"

using namespace tpcli;
using nn::testing::random_vector;

namespace {

constexpr int64_t V = 11, C = 6;  // legend: V vocabulary, C channels, N tokens

struct DeviceResult {
  std::vector<float> out;          // [N, C]
  std::vector<float> local_grad;   // [VL, C] this device's rows of the gradient
  std::vector<float> full_grad;    // [V, C] gathered
  std::vector<float> full_table;   // [V, C] gathered
  int64_t rows_held = 0;
};

std::vector<DeviceResult> run(int T, const std::vector<float>& table, const std::vector<int>& tokens,
                              const std::vector<float>& dout) {
  std::vector<DeviceResult> results(static_cast<size_t>(T));
  dist::run_on_mesh(dist::Mesh::line(T), [&](dist::Device& dev) {
    dist::Group g = dev.axis("model");
    std::vector<dist::Range> vocab;
    for (int m = 0; m < T; ++m) vocab.push_back(dist::even_split(V, T, m));
    const dist::Range mine = vocab[static_cast<size_t>(g.rank())];
    nn::VocabParallelEmbedding emb(nn::slice_rows(table.data(), C, mine), vocab, g);
    DeviceResult& r = results[static_cast<size_t>(g.rank())];
    r.out.resize(tokens.size() * C);
    emb.forward(r.out.data(), tokens);
    emb.backward(dout.data(), tokens);
    emb.backward(dout.data(), tokens);  // gradients accumulate
    r.local_grad.assign(emb.rows().grad().span().begin(), emb.rows().grad().span().end());
    auto full_grad = emb.gather_full(true), full = emb.gather_full(false);
    r.full_grad.assign(full_grad.span().begin(), full_grad.span().end());
    r.full_table.assign(full.span().begin(), full.span().end());
    r.rows_held = emb.rows().out_features();
  });
  return results;
}

}  // namespace

TEST_CASE("vocab-parallel embedding: lookup, gradient and gather equal the one-table embedding", "[nn][embedding]") {
  std::mt19937 rng(5);
  const std::vector<float> table = random_vector(V * C, rng);
  const std::vector<int> tokens = {3, 10, 0, 3, 7, 5, 10, 1};  // repeats; first and last rows
  const int64_t N = static_cast<int64_t>(tokens.size());
  const std::vector<float> dout = random_vector(N * C, rng);
  std::vector<float> expected_out(N * C), expected_grad(V * C, 0.0f);
  nn::embedding_forward(expected_out.data(), tokens.data(), table.data(), N, V, C);
  nn::embedding_backward(expected_grad.data(), dout.data(), tokens.data(), N, C);
  nn::embedding_backward(expected_grad.data(), dout.data(), tokens.data(), N, C);
  for (int T = 1; T <= 5; ++T) {
    const auto got = run(T, table, tokens, dout);
    int64_t rows = 0;
    for (int r = 0; r < T; ++r) {
      INFO(T << " devices, device " << r);
      const dist::Range mine = dist::even_split(V, T, r);
      CHECK(got[r].rows_held == mine.count);
      rows += got[r].rows_held;
      CHECK(got[r].out == expected_out);  // copies: exact
      CHECK(got[r].full_table == table);
      CHECK(got[r].full_grad == expected_grad);
      // The gradient lives on the owner's rows only: this device's part is its rows of the full one.
      CHECK(got[r].local_grad == std::vector<float>(expected_grad.begin() + mine.offset * C,
                                                    expected_grad.begin() + (mine.offset + mine.count) * C));
    }
    CHECK(rows == V);  // one copy of the table over the whole group
  }
}

TEST_CASE("vocab-parallel embedding: a token outside the vocabulary fails on every device", "[nn][embedding]") {
  std::mt19937 rng(6);
  const std::vector<float> table = random_vector(V * C, rng);
  for (int bad : {-1, static_cast<int>(V)}) {
    std::vector<int> failures(3, 0);
    CHECK_THROWS_WITH(dist::run_on_mesh(dist::Mesh::line(3),
                                        [&](dist::Device& dev) {
                                          dist::Group g = dev.axis("model");
                                          std::vector<dist::Range> vocab;
                                          for (int m = 0; m < 3; ++m) vocab.push_back(dist::even_split(V, 3, m));
                                          nn::VocabParallelEmbedding emb(
                                              nn::slice_rows(table.data(), C, vocab[static_cast<size_t>(g.rank())]),
                                              vocab, g);
                                          std::vector<float> out(2 * C);
                                          const std::vector<int> tokens = {2, bad};
                                          try {
                                            emb.forward(out.data(), tokens);
                                          } catch (const std::out_of_range&) {
                                            failures[static_cast<size_t>(g.rank())] = 1;
                                            throw;
                                          }
                                        }),
                      Catch::Contains("token " + std::to_string(bad)));
    CHECK(failures == std::vector<int>{1, 1, 1});  // each device refused before communicating
  }
}

// Tensor basics: shapes, zero fill, row views, reshape, and errors naming the shape.
#include <catch2/catch.hpp>

#include <span>
#include <vector>

#include "tensor/tensor.h"

using namespace tpcli::tensor;

TEST_CASE("tensor: shape, numel, zero fill and values") {
  Tensor t({2, 3, 4});
  CHECK(t.rank() == 3);
  CHECK(t.numel() == 24);
  CHECK(t.dim(0) == 2);
  CHECK(t.dim(-1) == 4);
  CHECK_THROWS_WITH(t.dim(3), Catch::Contains("[2, 3, 4]"));
  for (int64_t i = 0; i < t.numel(); ++i) CHECK(t[i] == 0.0f);
  CHECK(to_string(t.shape()) == "[2, 3, 4]");
  CHECK(numel({}) == 1);
  CHECK_THROWS(numel({2, -1}));
  CHECK_THROWS_WITH(Tensor({2, 2}, {1.0f, 2.0f, 3.0f}), Catch::Contains("3 values do not fill shape [2, 2]"));
  Tensor empty;
  CHECK(empty.empty());
}

TEST_CASE("tensor: a view writes into storage it does not own, and a copy of it owns its floats") {
  std::vector<float> storage(10, 0.0f);
  Tensor v = Tensor::view({2, 3}, std::span<float>(storage).subspan(2, 6));
  CHECK(v.is_view());
  CHECK(v.numel() == 6);
  v.fill(1.0f);
  v.rows(1, 1)[2] = 5.0f;
  CHECK(storage == std::vector<float>{0, 0, 1, 1, 1, 1, 1, 5, 0, 0});
  Tensor copy = v;  // owning
  CHECK_FALSE(copy.is_view());
  copy[0] = 9.0f;
  CHECK(storage[2] == 1.0f);
  Tensor assigned({1});
  assigned = v;
  CHECK_FALSE(assigned.is_view());
  CHECK(assigned.shape() == Shape{2, 3});
  CHECK(assigned[5] == 5.0f);
  Tensor moved = std::move(v);  // still the same storage
  moved[0] = 7.0f;
  CHECK(storage[2] == 7.0f);
  CHECK_THROWS_WITH(Tensor::view({4}, std::span<float>(storage).subspan(0, 3)),
                    Catch::Contains("3 floats cannot have shape [4]"));
}

TEST_CASE("tensor: rows are views into the owner's storage") {
  Tensor t({3, 2}, {0, 1, 2, 3, 4, 5});
  auto r = t.rows(1, 2);
  REQUIRE(r.size() == 4);
  CHECK(r[0] == 2.0f);
  r[0] = 42.0f;
  CHECK(t[2] == 42.0f);
  CHECK(t.rows(3, 0).empty());
  CHECK_THROWS(t.rows(2, 2));
  CHECK_THROWS(t.rows(-1, 1));
  t.fill(7.0f);
  CHECK(t[5] == 7.0f);
  t.reshape({2, 3});
  CHECK(t.dim(1) == 3);
  CHECK(t.rows(1, 1).size() == 3);
  CHECK_THROWS_WITH(t.reshape({4, 2}), Catch::Contains("cannot reshape [2, 3] to [4, 2]"));
}

TEST_CASE("huge-page arena: buffers of a scope share chunks, freed ranges are reused, chunks go back when empty") {
#if !defined(__SANITIZE_ADDRESS__)  // (the arena is off under AddressSanitizer)
  const size_t chunks_before = HugePageArena::chunks_alive(), bytes_before = HugePageArena::bytes_in_use();
  Tensor outside({300, 1024});  // 1.2 MB, no scope: its own allocation
  std::vector<Tensor> weights;
  {
    HugePageArena scope;
    Tensor small({100});  // under 64 KB: never from the arena
    for (int i = 0; i < 6; ++i) weights.emplace_back(Shape{300, 1024});  // 7.2 MB: one 32 MB chunk
    CHECK(HugePageArena::chunks_alive() == chunks_before + 1);
    CHECK(HugePageArena::bytes_in_use() == bytes_before + 6 * 300 * 1024 * sizeof(float));
    // Back to back, 2 MB-aligned chunk: the second starts where the first ends (rounded to 64 B).
    CHECK(weights[1].data() == weights[0].data() + 300 * 1024);
    const float* second = weights[1].data();
    weights[1] = Tensor();  // a constructor's temporary dies...
    Tensor again({200, 1024});  // ...and a later buffer takes its place (first fit)
    CHECK(again.data() == second);
    again.fill(2.0f);
    weights.push_back(std::move(again));
  }
  int64_t wrong = 0;  // the reused range holds what its new owner wrote, the others their zeros
  for (const Tensor& w : weights)
    for (float v : w.span()) wrong += v != 0.0f && v != 2.0f;
  CHECK(wrong == 0);
  CHECK(HugePageArena::chunks_alive() == chunks_before + 1);  // its buffers still live
  weights.clear();
  CHECK(HugePageArena::chunks_alive() == chunks_before);
  CHECK(HugePageArena::bytes_in_use() == bytes_before);
  outside.fill(1.0f);
#endif
}

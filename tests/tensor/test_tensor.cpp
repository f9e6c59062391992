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

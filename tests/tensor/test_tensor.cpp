// Tensor basics: shapes, zero fill, row views, reshape, and errors naming the shape.
#include <catch2/catch.hpp>

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

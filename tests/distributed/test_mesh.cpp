// Mesh: rank <-> coordinates (row-major in declaration order) and sub-groups, vs hand-written tables.
#include <catch2/catch.hpp>

#include "distributed/group.h"
#include "distributed/mesh.h"

using tpcli::dist::Mesh;

TEST_CASE("mesh: ranks and coordinates are row-major in declaration order") {
  const Mesh mesh({{"data", 2}, {"model", 4}});
  CHECK(mesh.size() == 8);
  CHECK(mesh.to_string() == "data=2,model=4");
  CHECK(mesh.coords(0) == std::vector<int>{0, 0});
  CHECK(mesh.coords(3) == std::vector<int>{0, 3});
  CHECK(mesh.coords(5) == std::vector<int>{1, 1});
  for (int r = 0; r < mesh.size(); ++r) {
    const std::vector<int> c = mesh.coords(r);
    CHECK(c[0] * 4 + c[1] == r);
    CHECK(mesh.rank_of(c) == r);
  }
  const Mesh cube({{"a", 2}, {"b", 3}, {"c", 2}});
  CHECK(cube.coords(7) == std::vector<int>{1, 0, 1});  // 7 = 1*6 + 0*2 + 1
  CHECK(cube.axis_index("c") == 2);
  CHECK(cube.axis_size("b") == 3);
  CHECK(cube.axis_size("missing") == 1);
  CHECK_FALSE(cube.has_axis("missing"));
  CHECK_THROWS_WITH(cube.axis_index("x"), Catch::Contains("no axis 'x'") && Catch::Contains("a=2,b=3,c=2"));
  CHECK_THROWS(mesh.coords(8));
  CHECK_THROWS(mesh.rank_of({2, 0}));
  CHECK_THROWS(mesh.rank_of({0}));
}

TEST_CASE("mesh: group_members along each axis and along both") {
  const Mesh mesh({{"data", 2}, {"model", 4}});
  CHECK(mesh.group_members(5, {"model"}) == std::vector<int>{4, 5, 6, 7});
  CHECK(mesh.group_members(5, {"data"}) == std::vector<int>{1, 5});
  CHECK(mesh.group_members(2, {"data"}) == std::vector<int>{2, 6});
  CHECK(mesh.group_members(5, {"data", "model"}) == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(mesh.group_members(5, {}) == std::vector<int>{5});
  CHECK(mesh.group_members(5, {"expert"}) == std::vector<int>{5});  // absent axis: size 1
}

TEST_CASE("mesh: invalid axes are rejected with the offending name") {
  CHECK_THROWS_WITH(Mesh({{"data", 2}, {"data", 2}}), Catch::Contains("duplicate axis name 'data'"));
  CHECK_THROWS_WITH(Mesh({{"model", 0}}), Catch::Contains("'model' has size 0"));
  CHECK_THROWS_WITH(Mesh({{"", 2}}), Catch::Contains("empty name"));
  CHECK(Mesh().size() == 1);
  CHECK(Mesh::line(3).to_string() == "model=3");
}

TEST_CASE("mesh: even_split deals the remainder to the first parts") {
  using tpcli::dist::even_split;
  const std::vector<int64_t> ten_over_four{3, 3, 2, 2}, two_over_four{1, 1, 0, 0};
  CHECK(tpcli::dist::even_split_counts(10, 4) == ten_over_four);
  CHECK(tpcli::dist::even_split_counts(2, 4) == two_over_four);
  CHECK(even_split(10, 4, 2).offset == 6);
  CHECK(even_split(10, 4, 3).offset == 8);
  CHECK(even_split(0, 3, 1).count == 0);
  CHECK_THROWS(even_split(10, 0, 0));
  CHECK_THROWS(even_split(10, 4, 4));
}

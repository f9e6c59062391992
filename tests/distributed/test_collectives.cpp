// Every collective of the thread backend vs serial references (tests/distributed/collective_checks.h).
#include <catch2/catch.hpp>

#include "distributed/collective_checks.h"
#include "distributed/runtime.h"

using namespace tpcli::dist;
using namespace tpcli::testing;

namespace {

void run_line(int members, const std::function<void(Group&)>& body) {
  run_on_mesh(Mesh::line(members), [&](Device& dev) { body(dev.world()); });
}

const int GROUP_SIZES[] = {1, 2, 3, 4, 8};
const int64_t LENGTHS[] = {0, 1, 7, 1000};

}  // namespace

TEST_CASE("collectives: every op vs serial reference, sizes 1..8, lengths 0..1000") {
  for (int S : GROUP_SIZES) {
    for (int64_t n : LENGTHS) {
      INFO("group size " << S << ", length " << n);
      CHECK_NOTHROW(run_line(S, [&](Group& g) { check_every_collective(g, n, 100 * S + static_cast<uint64_t>(n)); }));
    }
  }
}

TEST_CASE("collectives: 1<<20 floats through the large (multi-barrier) paths") {
  const int64_t n = 1 << 20;
  CHECK_NOTHROW(run_line(2, [&](Group& g) { check_all_sum(g, n, 1); }));
  CHECK_NOTHROW(run_line(8, [&](Group& g) {
    check_all_sum(g, n, 2);
    check_reduce_scatter(g, n + 5, 3);  // uneven: 5 members get one more
  }));
  CHECK_NOTHROW(run_line(3, [&](Group& g) {
    check_all_max(g, n, 4);
    check_all_gather(g, n / 3, 5);
    check_broadcast(g, n, 1, 6);
  }));
}

TEST_CASE("collectives: all_sum adds as a balanced tree in rank order, bit for bit, small and large, 1..8 members") {
  for (int S : {1, 2, 3, 4, 5, 6, 7, 8})
    for (int64_t n : {int64_t{1000}, int64_t{1} << 18}) {
      INFO(S << " members, " << n << " floats");
      CHECK_NOTHROW(run_line(S, [&](Group& g) {
        std::vector<float> x = member_input(7, g.rank(), n);
        g.all_sum(x);
        expect_close("all_sum as the tree", x, tree_sum(7, 0, S, n), 0.0f, g.rank());
      }));
    }
}

TEST_CASE("collectives: a 2x4 mesh along each axis and along both") {
  const Mesh mesh({{"data", 2}, {"model", 4}});
  const std::vector<std::vector<std::string>> axis_sets{{"data"}, {"model"}, {"data", "model"}, {"model", "data"}};
  for (const auto& axes : axis_sets) {
    INFO("along " << axes[0] << (axes.size() > 1 ? "+" + axes[1] : ""));
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{5000}}) {
      INFO("length " << n);
      CHECK_NOTHROW(run_on_mesh(mesh, [&](Device& dev) {
        // Members of different sub-groups must see different data: seed by the sub-group's first member.
        const std::vector<int> members = mesh.group_members(dev.rank(), axes);
        check_every_collective(dev.axes(axes), n, 1000 * static_cast<uint64_t>(members[0]) + static_cast<uint64_t>(n));
      }));
    }
  }
}

TEST_CASE("collectives: in-place all_gather and reduce_scatter (own chunk aliases the buffer)") {
  for (int S : {2, 3, 8}) {
    for (int64_t chunk : {int64_t{5}, int64_t{3000}}) {
      INFO("S=" << S << " chunk=" << chunk);
      CHECK_NOTHROW(run_line(S, [&](Group& g) {
        const int64_t n = chunk * S;
        std::vector<float> buf = member_input(9, g.rank(), n), ref;
        g.all_gather(std::span<const float>(buf).subspan(static_cast<size_t>(g.rank() * chunk), static_cast<size_t>(chunk)), buf);
        for (int m = 0; m < S; ++m) {
          std::vector<float> y = member_input(9, m, n);
          ref.insert(ref.end(), y.begin() + m * chunk, y.begin() + (m + 1) * chunk);
        }
        expect_close("in-place all_gather", buf, ref, 0.0f, g.rank());

        std::vector<float> x = member_input(10, g.rank(), n);
        const Range mine = even_split(n, S, g.rank());
        g.reduce_scatter(x, std::span<float>(x).subspan(static_cast<size_t>(mine.offset), static_cast<size_t>(mine.count)));
        const std::vector<float> sum = serial_sum(10, S, n);
        expect_close("in-place reduce_scatter",
                     std::span<const float>(x).subspan(static_cast<size_t>(mine.offset), static_cast<size_t>(mine.count)),
                     std::span<const float>(sum).subspan(static_cast<size_t>(mine.offset), static_cast<size_t>(mine.count)),
                     sum_tol(S), g.rank());
      }));
    }
  }
}

TEST_CASE("collectives: 1000 random collectives back to back (shared seed, random order and sizes)") {
  for (int S : {3, 8}) {
    INFO("group size " << S);
    CHECK_NOTHROW(run_line(S, [&](Group& g) { check_random_sequence(g, 1000, 20000, 77 + static_cast<uint64_t>(S)); }));
  }
  // Interleaved on two axes of a mesh: collectives of different sub-groups overlap in time.
  const Mesh mesh({{"data", 2}, {"model", 4}});
  CHECK_NOTHROW(run_on_mesh(mesh, [&](Device& dev) {
    for (int round = 0; round < 20; ++round) {
      check_random_sequence(dev.axis("model"), 25, 5000, 500 + static_cast<uint64_t>(round * 2 + dev.coord("data")));
      check_random_sequence(dev.axis("data"), 25, 5000, 900 + static_cast<uint64_t>(round * 8 + dev.coord("model")));
    }
  }));
}

namespace {

// Every device makes the same bad call; the run must fail with `text` in the message.
void expect_usage_error(int S, const std::function<void(Group&)>& bad_call, const std::string& text) {
  try {
    run_line(S, bad_call);
    FAIL("no error; expected one containing '" << text << "'");
  } catch (const DeviceError& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find(text) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("collectives: clear errors where a shape is not allowed") {
  std::vector<float> seven(7), out7(7), six(6);
  expect_usage_error(2, [&](Group& g) { std::vector<float> i(7), o(7); g.all_to_all(i, o); },
                     "7 floats do not split into 2 equal chunks");
  expect_usage_error(3, [&](Group& g) { std::vector<float> i(7), o(2); g.reduce_scatter(i, o); },
                     "keeps 3 of 7");  // member 0 of 3 keeps 3 of 7
  expect_usage_error(2, [&](Group& g) { std::vector<float> i(3), o(5); g.all_gather(i, o); },
                     "out has 5 floats, expected size 2 x in 3");
  expect_usage_error(2, [&](Group& g) {
    std::vector<float> i(3), o(3);
    g.ppermute(i, o, {{0, 1}, {1, 1}});
  }, "destination 1 appears twice");
  expect_usage_error(2, [&](Group& g) {
    std::vector<float> i(3), o(3);
    g.ppermute(i, o, {{0, 2}});
  }, "outside group of 2");
  expect_usage_error(2, [&](Group& g) { std::vector<float> x(3); g.broadcast(x, 2); }, "root 2 outside group of 2");
  expect_usage_error(2, [&](Group& g) {
    std::vector<float> i(3), o(4);
    const std::vector<int64_t> counts{1, 3};
    g.all_gather_v(i, o, counts);
  }, "counts say");
  expect_usage_error(2, [&](Group& g) {
    std::vector<float> i(3);
    std::vector<int64_t> recv;
    const std::vector<int64_t> counts{1, 1};
    g.all_to_all_v(i, counts, recv);
  }, "send counts sum to 2 but in has 3");
  expect_usage_error(2, [&](Group& g) {
    std::vector<float> o(8);
    g.all_gather(std::span<const float>(o).subspan(1, 4), o);
  }, "in overlaps out");
}

TEST_CASE("collectives: typed forms through the large (unstaged) byte paths, and every member's CommStats") {
  // 1<<15 int32 per member: the byte gather's 128 KB contributions go past the staging buffers.
  CHECK_NOTHROW(run_line(3, [&](Group& g) { check_typed_collectives(g, int64_t{1} << 15, 9); }));
  CommStats stats[3];
  run_on_mesh(Mesh::line(3), [&](Device& dev) {
    std::vector<int32_t> x(10, 1);
    const CommStats before = dev.stats();
    dev.world().all_sum(std::span<int32_t>(x));
    CHECK(x == std::vector<int32_t>(10, 3));
    const CommStats after = dev.stats();
    stats[dev.rank()] = {after.bytes_sent - before.bytes_sent, after.bytes_received - before.bytes_received,
                         after.calls - before.calls};
  });
  for (const CommStats& s : stats) {  // 40 bytes to each of the 2 others, 40 from each
    CHECK(s.bytes_sent == 80);
    CHECK(s.bytes_received == 80);
    CHECK(s.calls == 1);
  }
}

TEST_CASE("collectives: an int32 sum outside int32 fails on every member, never wraps") {
  expect_usage_error(2, [&](Group& g) {
    std::vector<int32_t> x{1, std::numeric_limits<int32_t>::max()};
    g.all_sum(std::span<int32_t>(x));
  }, "element 1 sums to 4294967294, outside int32");
  expect_usage_error(2, [&](Group& g) {
    std::vector<int32_t> i(3), o(5);
    g.all_gather(std::span<const int32_t>(i), std::span<int32_t>(o));
  }, "out has 5 int32s, expected size 2 x in 3");
  expect_usage_error(2, [&](Group& g) {
    std::vector<std::byte> x(3);
    g.broadcast(std::span<std::byte>(x), 2);
  }, "root 2 outside group of 2");
}

TEST_CASE("collectives: bf16 sums round once, where rounding each partial sum would differ") {
  // (1 + 2^-8) + (2^-8 + 0), the tree of 4 members: in bf16 (8 significant bits) 1 + 2^-8 rounds
  // to 1 (ties to even) and so does the total; widened and rounded once, 1 + 2^-7.
  run_line(4, [&](Group& g) {
    const float mine[4] = {1.0f, 0.00390625f, 0.00390625f, 0.0f};
    std::vector<Bf16> x{{tpcli::tensor::f32_to_bf16(mine[g.rank()])}};
    g.all_sum(std::span<Bf16>(x));
    CHECK(tpcli::tensor::bf16_to_f32(x[0].bits) == 1.0078125f);
  });
}

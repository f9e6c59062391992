// Every collective of the thread backend vs serial references (tests/dist/collective_checks.h).
#include <catch2/catch.hpp>

#include "dist/collective_checks.h"
#include "dist/runtime.h"

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

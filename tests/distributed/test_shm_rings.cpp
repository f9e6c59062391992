// Shared-memory rings: records arrive whole and in order through a second mapping (as a peer
// process sees them), the ring refuses a record it has no room for, and wraps around its end.
#include <catch2/catch.hpp>

#include <chrono>
#include <numeric>
#include <thread>
#include <vector>

#include "distributed/zmq/shm_rings.h"

using namespace tpcli::dist;

namespace {

RingRecord record(uint64_t seq, int64_t floats) {
  RingRecord h;
  h.seq = seq;
  h.total = floats;
  h.floats = floats;
  return h;
}

std::vector<float> payload(uint64_t seq, int64_t floats) {
  std::vector<float> x(static_cast<size_t>(floats));
  std::iota(x.begin(), x.end(), static_cast<float>(seq * 1000));
  return x;
}

}  // namespace

TEST_CASE("shm rings: a peer's mapping sees whole records in order, across many wrap-arounds") {
  ShmSegment owner = ShmSegment::create(2);
  ShmSegment peer = ShmSegment::open(owner.descriptor(), 2);  // what process 1 maps
  const int64_t max = ShmSegment::MAX_RECORD_FLOATS;
  uint64_t written = 0, read = 0;
  // Odd sizes so that records end at every offset; 2000 records pass the ring many times.
  auto size_of = [&](uint64_t seq) { return static_cast<int64_t>(seq * 7919 % static_cast<uint64_t>(max + 1)); };
  while (read < 2000) {
    while (written < 2000) {
      const std::vector<float> data = payload(written, size_of(written));
      if (!peer.try_write(1, record(written, size_of(written)), data.data())) break;
      ++written;
    }
    RingRecord h;
    std::span<const float> got;
    REQUIRE(owner.peek(1, h, got));
    REQUIRE(h.seq == read);
    REQUIRE(h.floats == size_of(read));
    const std::vector<float> want = payload(read, size_of(read));
    REQUIRE(std::equal(got.begin(), got.end(), want.begin(), want.end()));
    owner.consume(1, h);
    ++read;
  }
  RingRecord h;
  std::span<const float> got;
  CHECK_FALSE(owner.peek(1, h, got));
}

TEST_CASE("shm rings: a full ring refuses a record until the reader frees room") {
  ShmSegment owner = ShmSegment::create(2);
  ShmSegment peer = ShmSegment::open(owner.descriptor(), 2);
  const int64_t max = ShmSegment::MAX_RECORD_FLOATS;
  const std::vector<float> data = payload(0, max);
  int fitted = 0;
  while (peer.try_write(0, record(static_cast<uint64_t>(fitted), max), data.data())) ++fitted;
  CHECK(fitted == static_cast<int>(ShmSegment::RING_BYTES / (max * sizeof(float) + 64)));
  RingRecord h;
  std::span<const float> got;
  REQUIRE(owner.peek(0, h, got));
  owner.consume(0, h);
  CHECK(peer.try_write(0, record(99, 0), nullptr));  // an empty record (a barrier) fits before the end
  CHECK(peer.try_write(0, record(100, max), data.data()));  // this one wraps into the freed room
  CHECK_FALSE(peer.try_write(0, record(101, 0), nullptr));
  for (uint64_t seq = 1; seq < static_cast<uint64_t>(fitted); ++seq) {
    REQUIRE(owner.peek(0, h, got));
    CHECK(h.seq == seq);
    owner.consume(0, h);
  }
  REQUIRE(owner.peek(0, h, got));
  CHECK(h.seq == 99);
  owner.consume(0, h);
  REQUIRE(owner.peek(0, h, got));
  CHECK(h.seq == 100);
  CHECK(got.size() == static_cast<size_t>(max));
}

TEST_CASE("shm rings: the doorbell wakes a sleeper and times out when silent") {
  ShmSegment owner = ShmSegment::create(2);
  ShmSegment peer = ShmSegment::open(owner.descriptor(), 2);
  const uint32_t seen = owner.bell();
  auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(owner.wait_bell(seen, std::chrono::milliseconds(30), 0));
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(25));

  std::thread ringer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    peer.ring_bell();
  });
  t0 = std::chrono::steady_clock::now();
  CHECK(owner.wait_bell(seen, std::chrono::seconds(10), 0));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  ringer.join();
}

TEST_CASE("shm rings: a bad descriptor is an error, not a crash") {
  CHECK_THROWS_WITH(ShmSegment::open("nonsense", 2), Catch::Contains("malformed shared-memory descriptor"));
  CHECK_THROWS_WITH(ShmSegment::open("1:999999", 2), Catch::Contains("cannot open /proc/1/fd/999999"));
  ShmSegment owner = ShmSegment::create(2);
  CHECK_THROWS_WITH(ShmSegment::open(owner.descriptor(), 3), Catch::Contains("is not a tpcli segment"));
}

// tpcli::dist — shared-memory rings between processes on one host, the fast path under the zmq
// transport. ZeroMQ stays for start-up, control (abort, bye) and for noticing a dead peer; data
// between two processes that share a host moves through memory.
//
// Every process owns one segment (a memfd, so nothing is left behind when processes die): a
// doorbell, then one ring per sending process. Process p writes into ring p of q's segment and
// rings q's doorbell; q reads ring p in place (the receiver reduces straight out of the ring, no
// copy), frees the space and rings p's doorbell so a sender waiting for space wakes up. Peers open
// the segment through /proc/<pid>/fd/<fd>, which works for any process of the same user and pid
// namespace.
//
// A ring is single-producer, single-consumer (the transport serialises each side). Records are a
// 64-byte header and a payload padded to 64 bytes; a record never wraps (a PAD record, or a gap
// shorter than a header, sends the reader back to the start).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace tpcli::dist {

struct RingRecord {
  uint64_t comm = 0;   // MessageKey
  uint64_t seq = 0;
  int32_t src = 0;
  int32_t dst = 0;
  int64_t total = 0;   // floats in the whole message
  int64_t offset = 0;  // of this record's floats within the message
  int64_t floats = 0;  // in this record; -1: a PAD record
  uint64_t unused = 0;
};
static_assert(sizeof(RingRecord) == 56);

// One process's segment, mapped by its owner (create) or by a peer (open).
class ShmSegment {
 public:
  static constexpr size_t RING_BYTES = size_t{4} << 20;  // per sending process
  static constexpr int64_t MAX_RECORD_FLOATS = 65536;    // 256 KB: the sender writes record i+1 while
                                                         // the receiver reduces record i

  // A new segment for a run of `processes` processes.
  static ShmSegment create(int processes);
  // Peer's segment from its descriptor(); throws std::runtime_error on failure.
  static ShmSegment open(const std::string& descriptor, int processes);

  ShmSegment() = default;
  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ~ShmSegment();
  explicit operator bool() const { return base_ != nullptr; }

  // "pid:fd" of the owner's memfd: how a peer finds it.
  std::string descriptor() const;

  // ---- producer side (ring `from` of this segment) ----
  // Appends one record unless the ring lacks space. `data` is header.floats floats.
  bool try_write(int from, const RingRecord& header, const float* data);

  // ---- consumer side (this process reads its own segment) ----
  // The oldest unread record of ring `from`, or false when it is empty. payload stays valid until
  // consume(from).
  bool peek(int from, RingRecord& header, std::span<const float>& payload);
  void consume(int from, const RingRecord& header);

  // ---- doorbell: "something arrived or space was freed" ----
  uint32_t bell() const;
  void ring_bell();
  // Until bell() != seen or `wait` passes (spins `spin` rounds, then sleeps on the futex). True if
  // it rang.
  bool wait_bell(uint32_t seen, std::chrono::microseconds wait, int spin) const;

 private:
  struct Header;  // shm_rings.cpp
  struct Ring;

  ShmSegment(void* base, size_t bytes, int fd, int processes);
  Header& header() const;
  Ring& ring(int from) const;
  char* ring_data(int from) const;

  void* base_ = nullptr;
  size_t bytes_ = 0;
  int fd_ = -1;
  int processes_ = 0;
};

// An identity shared exactly by processes that can open each other's segments and whose memory is
// the same: hostname, boot id, and the network and pid namespaces (network namespaces stand for
// separate hosts in tests, so they must not look alike).
std::string host_identity();

}  // namespace tpcli::dist

// tpcli::dist — collectives, per-device view (jax.shard_map style).
//
// Every member of a group makes the same calls in the same order. A Group is a small value handle
// over a backend (threads in one process, or ZeroMQ across processes): backends implement
// `Communicator`; users only see `Group`. A size-1 group is a no-op fast path. The handle checks
// each call's arguments, counts the bytes it moves for this device (into the device's CommStats)
// and records its trace span. What a run adds around every collective of any backend (a modelled
// link, stop-watch stamps) is a communicator wrapped around the backend's, made by the runtime
// (distributed/links.h, distributed/collective_watch.h), so the handle does not know about it.
//
// Shard states (ggml's vocabulary): *split* along an axis, *mirrored* (same on every member),
// *partial* (each member holds a term of a sum). all_sum: partial -> mirrored; reduce_scatter:
// partial -> split; all_gather: split -> mirrored.
//
// Element types: f32 everywhere (the backends' own algorithms: the fast path); int32 and bf16 for
// all_sum, all_max and all_gather(_v); raw bytes for broadcast and all_gather. The backends move the typed data
// as bytes (Communicator::all_gather_bytes / broadcast_bytes) and Group does their arithmetic, so a
// typed result is the same bits on every backend:
//   int32  sums are exact integer sums (a sum outside int32 throws std::overflow_error on every
//          member); max is exact.
//   bf16   every member's values are widened to f32 and combined in distributed/tree_reduce.h's
//          order, the order of an f32 all_sum on every backend, then rounded once to nearest even:
//          bf16 all_sum(x) == round(f32 all_sum(widen(x))).
// A typed reduction moves each member's n elements to every other (n (S-1) elements sent and
// received): meant for the small integer payloads (counts, ids, commands) and for bf16 payloads
// that are not the bandwidth-bound activations.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace tpcli::dist {

// Raised in every waiting member when any member of the run fails (exception, dead peer,
// timeout). The message names the failing rank and what it said.
class CollectiveAborted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct CommStats {
  uint64_t bytes_sent = 0;      // bytes this device put on the wire (or into shared buffers)
  uint64_t bytes_received = 0;  // bytes this device read from other members
  uint64_t calls = 0;
  void add(uint64_t sent, uint64_t received) { bytes_sent += sent; bytes_received += received; ++calls; }
};

using Perm = std::vector<std::pair<int, int>>;  // (source, destination) pairs, ranks in the group

// A bfloat16 as stored: the upper 16 bits of an f32 (tensor::bf16_to_f32 / f32_to_bf16 convert).
// Its own type so a span of it is a bf16 payload, not any 16-bit integer.
struct Bf16 {
  uint16_t bits = 0;
  friend bool operator==(Bf16, Bf16) = default;
};

class Communicator;

// A started collective (Communicator::start). wait() returns once its data is in place and gives
// the time it got there; it rethrows the collective's error (CollectiveAborted when any device of
// the run failed). Called once, from the member's thread.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual std::chrono::steady_clock::time_point wait() = 0;
};

// A collective to run later: the blocking call made on the communicator it is given.
using CollectiveCall = std::function<void(Communicator&)>;

// Backend contract. One object per member; called only from that member's thread.
// Argument checks (sizes, ranks) are done by Group before these are called.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void all_sum(std::span<float> x) = 0;
  virtual void all_max(std::span<float> x) = 0;
  // out = concat over members m of in_m; counts[m] = in_m.size() (known to every member).
  virtual void all_gather_v(std::span<const float> in, std::span<float> out, std::span<const int64_t> counts) = 0;
  // out = chunk `rank` of the elementwise sum of every member's in; chunks are given by counts.
  virtual void reduce_scatter_v(std::span<const float> in, std::span<float> out, std::span<const int64_t> counts) = 0;
  // send_counts[m] floats of in (consecutive, in member order) go to member m; returns what arrived,
  // in source order, and fills recv_counts[m] = floats received from m.
  virtual std::vector<float> all_to_all_v(std::span<const float> in, std::span<const int64_t> send_counts,
                                          std::vector<int64_t>& recv_counts) = 0;
  // JAX ppermute: each (src, dst) sends src's in to dst's out; members that are no destination get zeros.
  virtual void ppermute(std::span<const float> in, std::span<float> out, const Perm& perm) = 0;
  virtual void broadcast(std::span<float> x, int root) = 0;
  virtual void barrier() = 0;
  // Raw bytes, what the typed collectives travel as (Group's int32, bf16 and byte forms): out =
  // concat over members m of in_m, counts[m] = in_m's bytes (known to every member; in does not
  // overlap out); broadcast_bytes: the root's x to every member.
  virtual void all_gather_bytes(std::span<const std::byte> in, std::span<std::byte> out,
                                std::span<const int64_t> counts) = 0;
  virtual void broadcast_bytes(std::span<std::byte> x, int root) = 0;
  // Equal chunks (in.size() == out.size() == size() * chunk). Default: through all_to_all_v and a
  // copy; backends override it when they can write into out directly.
  virtual void all_to_all(std::span<const float> in, std::span<float> out);
  // Non-blocking form of any collective: `call` runs on a communicator of the same members that
  // carries only started collectives (so they cannot interleave with blocking ones), in the order
  // they were started, while this member's thread goes on. Every member starts the same calls in
  // the same order. Default: runs `call` on this communicator now (blocking), so a backend without
  // an asynchronous path stays correct.
  virtual std::unique_ptr<PendingCollective> start(CollectiveCall call);
  // The modelled link time of this member's last blocking collective, in ns, for its trace span;
  // -1 when its links are not modelled (distributed/links.h's wrapper overrides it).
  virtual int64_t last_modelled_ns() const { return -1; }
};

class Trace;  // distributed/trace.h

// The handle Group's start_* return. Buffers passed to start_* must stay alive and untouched (out
// unread) until wait() returns; destroying an unwaited handle waits (and swallows its error, as
// the error reaches the run through the other members anyway).
class Pending {
 public:
  Pending() = default;  // already complete
  // bytes: this member's sent + received; payload: the array the link model charges (as for a
  // blocking call's trace event, distributed/trace.h).
  Pending(std::unique_ptr<PendingCollective> op, Trace* trace, int track, const char* name, int64_t started_ns,
          int64_t bytes, int64_t payload);
  Pending(Pending&&) noexcept;
  Pending& operator=(Pending&&) noexcept;
  ~Pending();
  void wait();
  bool done() const { return !op_; }

 private:
  std::unique_ptr<PendingCollective> op_;
  Trace* trace_ = nullptr;
  int track_ = 0;
  const char* name_ = "";
  int64_t started_ns_ = 0, bytes_ = -1, payload_ = -1;
};

class Group {
 public:
  Group() = default;  // the size-1 group of a lone device
  Group(std::shared_ptr<Communicator> comm, CommStats* stats);
  // Same, and every collective is recorded as a span on `track` of `trace` (when not null).
  Group(std::shared_ptr<Communicator> comm, CommStats* stats, Trace* trace, int track);

  int rank() const;
  int size() const;

  // psum: partial -> mirrored, in place.
  void all_sum(std::span<float> x);
  void all_max(std::span<float> x);
  // pmean: all_sum then divide by size().
  void mean(std::span<float> x);
  // Tiled all_gather: out.size() == size() * in.size(); out = concat of every member's in.
  void all_gather(std::span<const float> in, std::span<float> out);
  // Uneven all_gather: counts[m] = member m's in.size() (every member passes the same counts).
  void all_gather_v(std::span<const float> in, std::span<float> out, std::span<const int64_t> counts);
  // psum_scatter: in.size() == n on every member; out = this member's chunk of the sum, where the n
  // elements are dealt out by even_split (the first n % size members get one more).
  void reduce_scatter(std::span<const float> in, std::span<float> out);
  // psum_scatter with chunk sizes: member m keeps counts[m] floats of the sum, in member order.
  void reduce_scatter_v(std::span<const float> in, std::span<float> out, std::span<const int64_t> counts);
  // Equal chunks: in.size() == out.size() == size() * chunk; chunk m of in goes to member m, chunk m
  // of out came from member m. Errors if in.size() is not a multiple of size().
  void all_to_all(std::span<const float> in, std::span<float> out);
  // Ragged: see Communicator::all_to_all_v.
  std::vector<float> all_to_all_v(std::span<const float> in, std::span<const int64_t> send_counts,
                                  std::vector<int64_t>& recv_counts);
  // Sources unique, destinations unique, ranks in [0, size()); in.size() == out.size().
  void ppermute(std::span<const float> in, std::span<float> out, const Perm& perm);
  void broadcast(std::span<float> x, int root);
  void barrier();

  // Typed forms (see the file comment for their arithmetic); same checks and meaning as above.
  void all_sum(std::span<int32_t> x);
  void all_sum(std::span<Bf16> x);
  void all_max(std::span<int32_t> x);
  void all_max(std::span<Bf16> x);
  void all_gather(std::span<const int32_t> in, std::span<int32_t> out);
  void all_gather(std::span<const Bf16> in, std::span<Bf16> out);
  void all_gather_v(std::span<const int32_t> in, std::span<int32_t> out, std::span<const int64_t> counts);
  void all_gather_v(std::span<const Bf16> in, std::span<Bf16> out, std::span<const int64_t> counts);
  // Raw bytes: records of a declared layout (every member passes the same number of bytes).
  void all_gather(std::span<const std::byte> in, std::span<std::byte> out);
  // The root's bytes to every member (x.size() equal on every member).
  void broadcast(std::span<std::byte> x, int root);

  // Asynchronous forms (start now, wait() on the handle): the same checks, results and byte counts
  // as the blocking calls above. With a trace, the transfer shows on a track of its own.
  [[nodiscard]] Pending start_all_sum(std::span<float> x);
  [[nodiscard]] Pending start_all_gather(std::span<const float> in, std::span<float> out);
  [[nodiscard]] Pending start_reduce_scatter(std::span<const float> in, std::span<float> out);
  [[nodiscard]] Pending start_ppermute(std::span<const float> in, std::span<float> out, const Perm& perm);
  [[nodiscard]] Pending start_all_to_all(std::span<const float> in, std::span<float> out);
  [[nodiscard]] Pending start_broadcast(std::span<float> x, int root);

  const CommStats* stats() const { return stats_; }

 private:
  struct Cost;      // group.cpp: one call's counted bytes and trace payload
  class CallScope;  // group.cpp: counts a blocking call and records its span
  Pending start(const Cost& cost, CollectiveCall call);
  template <class T>
  std::vector<int64_t> equal_gather_counts(std::span<const T> in, std::span<T> out) const;
  template <class T>
  void check_all_gather(std::span<const T> in, std::span<T> out, std::span<const int64_t> counts) const;
  template <class T>
  void gather_typed(std::span<const T> in, std::span<T> out, std::span<const int64_t> counts);
  template <class T>
  std::vector<T> gather_all(const char* name, std::span<const T> x);
  std::vector<int64_t> check_reduce_scatter(std::span<const float> in, std::span<float> out) const;
  void check_reduce_scatter_v(std::span<const float> in, std::span<float> out, std::span<const int64_t> counts) const;
  uint64_t check_all_to_all(std::span<const float> in, std::span<float> out) const;
  void check_broadcast(int root) const;
  std::pair<bool, bool> check_ppermute(std::span<const float> in, std::span<float> out, const Perm& perm) const;

  std::shared_ptr<Communicator> comm_;  // null: size-1 group
  CommStats* stats_ = nullptr;          // this device's counters (may be null)
  Trace* trace_ = nullptr;              // collective spans go here (may be null)
  int track_ = 0;
};

// The even split used everywhere a length is dealt out over parts: part i gets
// n / parts + (i < n % parts ? 1 : 0) elements, starting after the parts before it.
struct Range {
  int64_t offset = 0;
  int64_t count = 0;
};
Range even_split(int64_t n, int parts, int index);
std::vector<int64_t> even_split_counts(int64_t n, int parts);

}  // namespace tpcli::dist

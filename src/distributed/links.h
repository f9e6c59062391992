// tpcli::dist — modelled links: what each collective would cost on a real interconnect.
//
// Thread devices move data at memory speed, so communication never shows. With a LinkSpec, every
// collective on a modelled axis completes no earlier than the time its algorithm needs on that
// axis's links (JAX's scaling-book arithmetic), so one can see and measure what overlapping
// communication with compute buys. S = group size, B = bytes of the array the call is about (the
// all-sum's x, the all-gather's out, the reduce-scatter's in, the ppermute's in), bw = bytes/s per
// direction per link, L = latency per hop:
//
//   collective          ring                         switch (every pair one hop)
//   all_sum, all_max    2(S-1)/S B/bw + 2(S-1) L     2(S-1)/S B/bw + 2 L
//   all_gather, r.-s.   (S-1)/S B/bw + (S-1) L       (S-1)/S B/bw + L
//   ppermute            B/bw + hops L                B/bw + L
//   all_to_all(_v)      (S-1)/2 B/bw + (S-1) L       (S-1)/S B/bw + L
//   broadcast           B/bw + (S-1) L               2(S-1)/S B/bw + 2 L
//   barrier             2(S-1) L                     2 L
//
// hops = the longest ring distance of the permutation's pairs. Each member's link has two
// directions, each carrying one transfer at a time: a ppermute whose pairs all move the same way
// round the ring occupies that direction only (so two started in opposite directions overlap, as
// in the bidirectional collective matmul); every other collective occupies both.
//
// The model is a communicator wrapped around the transport's (LinkModelledCommunicator), so any
// backend can sit under it and Group stays a plain handle.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "distributed/group.h"

namespace tpcli::dist {

enum class Topology { Ring, Switch };

struct AxisLink {
  double gb_per_s = 0;     // GB/s (1e9 bytes) per direction per link, in [MIN_GB_PER_S, MAX_GB_PER_S]
  double latency_us = 0;   // per hop, in [0, MAX_LATENCY_US]; 0 models bandwidth alone
  Topology topology = Topology::Ring;
  bool operator==(const AxisLink&) const = default;
};

// What a real interconnect can be. Beyond these a modelled collective takes hours or ends at once,
// and a run looks hung: 1 MB/s is a slow WAN, 10 TB/s is beyond any GPU link (NVLink 5: 0.9 TB/s
// per direction), 1 s is beyond a geostationary satellite hop (~0.6 s). config/run_config.cpp
// checks [mesh.links] against the same numbers (config/ cannot include distributed/).
constexpr double MIN_GB_PER_S = 1e-3;
constexpr double MAX_GB_PER_S = 1e4;
constexpr double MAX_LATENCY_US = 1e6;

// Why `link` is no plausible link ("bandwidth 1e-12 GB/s is below ..."), or "" when it is one.
std::string link_problem(const AxisLink& link);

using LinkSpec = std::map<std::string, AxisLink>;  // by mesh axis name; axes not listed are not modelled

enum class CollectiveKind { AllSum, AllGather, ReduceScatter, Ppermute, AllToAll, Broadcast, Barrier };

// Which way round the ring a permutation moves its data (ranks in a group of `size`).
enum class RingDirection { Forward, Backward, Both };
struct PermShape {
  int hops = 1;
  RingDirection direction = RingDirection::Both;
};
PermShape perm_shape(const Perm& perm, int size);

// Seconds the collective takes on `link` for a group of `size` (table above).
double modelled_seconds(const AxisLink& link, int size, CollectiveKind kind, uint64_t bytes, int hops = 1);

// The link a group along `axes` uses: the slowest listed axis of size > 1 (lowest bandwidth,
// highest latency; a ring if any of them is one). Nullopt-like: gb_per_s == 0 when none is listed.
AxisLink group_link(const LinkSpec& spec, const std::vector<std::string>& axes);

// "model=100,1" or "data=10,25,switch" (the --link flag: GB/s, us, [ring|switch]). Throws
// std::invalid_argument naming the flag's value, also for values outside the bounds above.
std::pair<std::string, AxisLink> parse_link_flag(const std::string& text);

// One member's view of its link on one group: when each direction is next free. Used from the
// member's thread and its asynchronous worker, hence the mutex.
class LinkClock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  LinkClock(AxisLink link, int size) : link_(link), size_(size) {}
  // The transfer may start at `ready` (every member has arrived); returns when it completes, and
  // books the directions it uses until then.
  TimePoint book(CollectiveKind kind, uint64_t bytes, PermShape shape, TimePoint ready);
  double seconds(CollectiveKind kind, uint64_t bytes, int hops = 1) const {
    return modelled_seconds(link_, size_, kind, bytes, hops);
  }

 private:
  AxisLink link_;
  int size_;
  std::mutex mutex_;
  TimePoint free_at_[2] = {};  // by direction: forward, backward
};

// A communicator that runs every collective on an inner one and hands each to run(), described as
// the link model sees it (kind, B and ring shape, as in the table above): the base of wrappers that
// add something around every collective of any backend. start() goes to the inner communicator
// unchanged unless a wrapper overrides it.
class ForwardingCommunicator : public Communicator {
 public:
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  void all_sum(std::span<float> x) override;
  void all_max(std::span<float> x) override;
  void all_gather_v(std::span<const float> in, std::span<float> out, std::span<const int64_t> counts) override;
  void reduce_scatter_v(std::span<const float> in, std::span<float> out, std::span<const int64_t> counts) override;
  std::vector<float> all_to_all_v(std::span<const float> in, std::span<const int64_t> send_counts,
                                  std::vector<int64_t>& recv_counts) override;
  void ppermute(std::span<const float> in, std::span<float> out, const Perm& perm) override;
  void broadcast(std::span<float> x, int root) override;
  void barrier() override;
  void all_gather_bytes(std::span<const std::byte> in, std::span<std::byte> out, std::span<const int64_t> counts) override;
  void broadcast_bytes(std::span<std::byte> x, int root) override;
  void all_to_all(std::span<const float> in, std::span<float> out) override;
  std::unique_ptr<PendingCollective> start(CollectiveCall call) override { return inner_.start(std::move(call)); }
  int64_t last_modelled_ns() const override { return inner_.last_modelled_ns(); }

 protected:
  explicit ForwardingCommunicator(Communicator& inner) : inner_(inner) {}

  struct Call {
    CollectiveKind kind;
    uint64_t bytes;  // B
    PermShape shape{};
  };
  // The collective itself: makes its call on the communicator it is given. A reference to a
  // callable, not a std::function, so forwarding a collective allocates nothing.
  class CallOn {
   public:
    template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, CallOn>>>
    CallOn(F&& f) : f_(&f), call_([](void* g, Communicator& c) { (*static_cast<std::remove_reference_t<F>*>(g))(c); }) {}
    void operator()(Communicator& c) const { call_(f_, c); }

   private:
    void* f_;
    void (*call_)(void*, Communicator&);
  };
  // Runs `on` (on inner_, or on what the wrapper chooses) with what the wrapper adds around it.
  virtual void run(const Call& call, CallOn on) = 0;

  Communicator& inner_;
};

class CollectiveWatch;  // distributed/collective_watch.h

// Wraps a group's communicator so that each collective completes no earlier than its modelled time
// on `link` (the table above), measured from when its data moved (every member had arrived); a
// started one is booked from when this member started it. A null `watch` holds until then in any
// case; otherwise the hold ends early, throwing CollectiveAborted, when the watch ends the run.
class LinkModelledCommunicator : public ForwardingCommunicator {
 public:
  LinkModelledCommunicator(std::shared_ptr<Communicator> inner, AxisLink link, CollectiveWatch* watch);
  std::unique_ptr<PendingCollective> start(CollectiveCall call) override;
  int64_t last_modelled_ns() const override { return last_modelled_ns_; }

 protected:
  void run(const Call& call, CallOn on) override;

 private:
  std::shared_ptr<Communicator> owned_;  // inner_
  std::shared_ptr<LinkClock> link_;      // shared with started calls still on the worker
  CollectiveWatch* watch_;
  int64_t last_modelled_ns_ = -1;
};

}  // namespace tpcli::dist

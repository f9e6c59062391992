// tpcli::dist — modelled link times (formulas: links.h), and the communicator that holds each
// collective until its modelled time.
#include "distributed/links.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "distributed/collective_watch.h"

namespace tpcli::dist {

PermShape perm_shape(const Perm& perm, int size) {
  PermShape shape{0, RingDirection::Both};
  bool forward = false, backward = false;
  for (const auto& [src, dst] : perm) {
    if (src == dst) continue;
    const int ahead = ((dst - src) % size + size) % size, behind = size - ahead;
    shape.hops = std::max(shape.hops, std::min(ahead, behind));
    (ahead <= behind ? forward : backward) = true;
    if (size == 2) forward = backward = true;  // two members: one link, both ways
  }
  if (forward != backward) shape.direction = forward ? RingDirection::Forward : RingDirection::Backward;
  shape.hops = std::max(shape.hops, 1);
  return shape;
}

double modelled_seconds(const AxisLink& link, int size, CollectiveKind kind, uint64_t bytes, int hops) {
  if (size <= 1 || link.gb_per_s <= 0) return 0.0;
  const double S = size, B = static_cast<double>(bytes), bw = link.gb_per_s * 1e9, L = link.latency_us * 1e-6;
  const bool ring = link.topology == Topology::Ring;
  switch (kind) {
    case CollectiveKind::AllSum: return 2 * (S - 1) / S * B / bw + (ring ? 2 * (S - 1) : 2) * L;
    case CollectiveKind::AllGather:
    case CollectiveKind::ReduceScatter: return (S - 1) / S * B / bw + (ring ? S - 1 : 1) * L;
    case CollectiveKind::Ppermute: return B / bw + (ring ? hops : 1) * L;
    case CollectiveKind::AllToAll: return (ring ? (S - 1) / 2 : (S - 1) / S) * B / bw + (ring ? S - 1 : 1) * L;
    case CollectiveKind::Broadcast: return ring ? B / bw + (S - 1) * L : 2 * (S - 1) / S * B / bw + 2 * L;
    case CollectiveKind::Barrier: return (ring ? 2 * (S - 1) : 2) * L;
  }
  return 0.0;
}

AxisLink group_link(const LinkSpec& spec, const std::vector<std::string>& axes) {
  AxisLink worst;
  bool any = false;
  for (const std::string& a : axes) {
    const auto it = spec.find(a);
    if (it == spec.end()) continue;
    const AxisLink& l = it->second;
    worst.gb_per_s = any ? std::min(worst.gb_per_s, l.gb_per_s) : l.gb_per_s;
    worst.latency_us = any ? std::max(worst.latency_us, l.latency_us) : l.latency_us;
    worst.topology = (any && worst.topology == Topology::Ring) ? Topology::Ring : l.topology;
    any = true;
  }
  return any ? worst : AxisLink{};
}

namespace {

// 1e12, 0.001, 100: as the user would write it.
std::string short_number(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

}  // namespace

std::string link_problem(const AxisLink& link) {
  const std::string bw = "bandwidth " + short_number(link.gb_per_s) + " GB/s";
  if (!std::isfinite(link.gb_per_s) || link.gb_per_s <= 0) return bw + " is not a finite number > 0";
  if (link.gb_per_s < MIN_GB_PER_S)
    return bw + " is below " + short_number(MIN_GB_PER_S) + " GB/s (1 MB/s, a slow WAN)";
  if (link.gb_per_s > MAX_GB_PER_S)
    return bw + " is beyond " + short_number(MAX_GB_PER_S) + " GB/s (10 TB/s, faster than any interconnect)";
  const std::string lat = "latency " + short_number(link.latency_us) + " us";
  if (!std::isfinite(link.latency_us) || link.latency_us < 0) return lat + " is not a finite number >= 0";
  if (link.latency_us > MAX_LATENCY_US)
    return lat + " is beyond " + short_number(MAX_LATENCY_US) + " us (1 s, more than a satellite hop)";
  return {};
}

namespace {

double parse_number(const std::string& text, const std::string& what, const std::string& flag) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(what, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != what.size())
    throw std::invalid_argument("--link " + text + ": '" + what + "' is not a number (" + flag + ")");
  return v;
}

}  // namespace

std::pair<std::string, AxisLink> parse_link_flag(const std::string& text) {
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    throw std::invalid_argument("--link " + text + ": expected AXIS=GBPS,LATENCY_US[,ring|switch], e.g. model=100,1");
  std::vector<std::string> parts;
  size_t at = eq + 1;
  for (;;) {
    const auto comma = text.find(',', at);
    parts.push_back(text.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  if (parts.size() < 2 || parts.size() > 3)
    throw std::invalid_argument("--link " + text + ": expected AXIS=GBPS,LATENCY_US[,ring|switch], e.g. model=100,1");
  AxisLink link;
  link.gb_per_s = parse_number(text, parts[0], "bandwidth in GB/s");
  link.latency_us = parse_number(text, parts[1], "latency in us");
  if (const std::string problem = link_problem(link); !problem.empty())
    throw std::invalid_argument("--link " + text + ": " + problem);
  if (parts.size() == 3) {
    if (parts[2] == "ring") link.topology = Topology::Ring;
    else if (parts[2] == "switch" || parts[2] == "full") link.topology = Topology::Switch;
    else throw std::invalid_argument("--link " + text + ": topology '" + parts[2] + "' is not ring or switch");
  }
  return {text.substr(0, eq), link};
}

LinkClock::TimePoint LinkClock::book(CollectiveKind kind, uint64_t bytes, PermShape shape, TimePoint ready) {
  const auto duration = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(seconds(kind, bytes, shape.hops)));
  const bool one_way = kind == CollectiveKind::Ppermute && link_.topology == Topology::Ring &&
                       shape.direction != RingDirection::Both;
  std::lock_guard<std::mutex> lock(mutex_);
  TimePoint start = ready;
  if (one_way) {
    TimePoint& free = free_at_[shape.direction == RingDirection::Forward ? 0 : 1];
    start = std::max(start, free);
    free = start + duration;
  } else {
    start = std::max({start, free_at_[0], free_at_[1]});
    free_at_[0] = free_at_[1] = start + duration;
  }
  return start + duration;
}

// ---- forwarding: each collective described as the link model sees it ----

namespace {
constexpr uint64_t F = sizeof(float);
}  // namespace

void ForwardingCommunicator::all_sum(std::span<float> x) {
  run({CollectiveKind::AllSum, x.size() * F}, [&](Communicator& c) { c.all_sum(x); });
}

void ForwardingCommunicator::all_max(std::span<float> x) {
  run({CollectiveKind::AllSum, x.size() * F}, [&](Communicator& c) { c.all_max(x); });
}

void ForwardingCommunicator::all_gather_v(std::span<const float> in, std::span<float> out,
                                          std::span<const int64_t> counts) {
  run({CollectiveKind::AllGather, out.size() * F}, [&](Communicator& c) { c.all_gather_v(in, out, counts); });
}

void ForwardingCommunicator::reduce_scatter_v(std::span<const float> in, std::span<float> out,
                                              std::span<const int64_t> counts) {
  run({CollectiveKind::ReduceScatter, in.size() * F}, [&](Communicator& c) { c.reduce_scatter_v(in, out, counts); });
}

std::vector<float> ForwardingCommunicator::all_to_all_v(std::span<const float> in, std::span<const int64_t> send_counts,
                                                        std::vector<int64_t>& recv_counts) {
  std::vector<float> out;
  run({CollectiveKind::AllToAll, in.size() * F},
      [&](Communicator& c) { out = c.all_to_all_v(in, send_counts, recv_counts); });
  return out;
}

void ForwardingCommunicator::all_to_all(std::span<const float> in, std::span<float> out) {
  run({CollectiveKind::AllToAll, in.size() * F}, [&](Communicator& c) { c.all_to_all(in, out); });
}

void ForwardingCommunicator::ppermute(std::span<const float> in, std::span<float> out, const Perm& perm) {
  run({CollectiveKind::Ppermute, in.size() * F, perm_shape(perm, size())},
      [&](Communicator& c) { c.ppermute(in, out, perm); });
}

void ForwardingCommunicator::broadcast(std::span<float> x, int root) {
  run({CollectiveKind::Broadcast, x.size() * F}, [&](Communicator& c) { c.broadcast(x, root); });
}

void ForwardingCommunicator::all_gather_bytes(std::span<const std::byte> in, std::span<std::byte> out,
                                              std::span<const int64_t> counts) {
  run({CollectiveKind::AllGather, out.size()}, [&](Communicator& c) { c.all_gather_bytes(in, out, counts); });
}

void ForwardingCommunicator::broadcast_bytes(std::span<std::byte> x, int root) {
  run({CollectiveKind::Broadcast, x.size()}, [&](Communicator& c) { c.broadcast_bytes(x, root); });
}

void ForwardingCommunicator::barrier() {
  run({CollectiveKind::Barrier, 0}, [](Communicator& c) { c.barrier(); });
}

// ---- the modelled link ----

namespace {

// Holds the calling device until `done`, or throws when the run ends first (watch non-null).
// sleep_until alone wakes ~50-100 us late (the kernel's timer slack, a VM's timer), which is more
// than a small collective's whole modelled time: a token of decode makes ~26 of them. So: sleep
// until shortly before, then yield until the time comes.
void hold_until(std::chrono::steady_clock::time_point done, CollectiveWatch* watch) {
  constexpr auto SLEEP_MARGIN = std::chrono::microseconds(200);
  if (done - std::chrono::steady_clock::now() > SLEEP_MARGIN) {
    if (watch)
      watch->sleep_until(done - SLEEP_MARGIN);
    else
      std::this_thread::sleep_until(done - SLEEP_MARGIN);
  }
  while (std::chrono::steady_clock::now() < done) std::this_thread::yield();
}

// The view a started call runs on, on the worker: each collective, once its data moved, is booked
// on the link from when the member started it (`started`), and the booked end kept for wait().
class BookingCommunicator : public ForwardingCommunicator {
 public:
  BookingCommunicator(Communicator& inner, LinkClock& link, LinkClock::TimePoint started, LinkClock::TimePoint& done)
      : ForwardingCommunicator(inner), link_(link), started_(started), done_(done) {}

 protected:
  void run(const Call& call, CallOn on) override {
    on(inner_);
    done_ = link_.book(call.kind, call.bytes, call.shape, started_);
  }

 private:
  LinkClock& link_;
  LinkClock::TimePoint started_;
  LinkClock::TimePoint& done_;
};

// A started call on a modelled link: wait() returns once the data moved and the booked transfer
// ended.
class ModelledPending : public PendingCollective {
 public:
  ModelledPending(std::unique_ptr<PendingCollective> inner, std::shared_ptr<LinkClock::TimePoint> done,
                  CollectiveWatch* watch)
      : inner_(std::move(inner)), done_(std::move(done)), watch_(watch) {}
  LinkClock::TimePoint wait() override {
    const auto moved = inner_->wait();  // synchronises with the worker that wrote *done_
    hold_until(*done_, watch_);
    return std::max(moved, *done_);
  }

 private:
  std::unique_ptr<PendingCollective> inner_;
  std::shared_ptr<LinkClock::TimePoint> done_;
  CollectiveWatch* watch_;
};

}  // namespace

LinkModelledCommunicator::LinkModelledCommunicator(std::shared_ptr<Communicator> inner, AxisLink link,
                                                   CollectiveWatch* watch)
    : ForwardingCommunicator(*inner), owned_(std::move(inner)),
      link_(std::make_shared<LinkClock>(link, owned_->size())), watch_(watch) {}

void LinkModelledCommunicator::run(const Call& call, CallOn on) {
  last_modelled_ns_ = -1;
  on(inner_);
  // The data moved (every member had arrived): now the modelled transfer runs its course.
  const auto now = std::chrono::steady_clock::now();
  const auto done = link_->book(call.kind, call.bytes, call.shape, now);
  last_modelled_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(done - now).count();
  hold_until(done, watch_);
}

// The transfer is booked from the moment this member started it (members of an SPMD program start
// it together; a late member still delays the end through the real exchange, which wait() also
// waits for), not from when the worker thread got a core: on a busy machine that comes later, and
// would charge scheduling delays to the link. wait() holds until the booked end.
std::unique_ptr<PendingCollective> LinkModelledCommunicator::start(CollectiveCall call) {
  auto done = std::make_shared<LinkClock::TimePoint>();
  CollectiveCall booked = [call = std::move(call), link = link_, done,
                           started = std::chrono::steady_clock::now()](Communicator& c) {
    BookingCommunicator view(c, *link, started, *done);
    call(view);
  };
  return std::make_unique<ModelledPending>(inner_.start(std::move(booked)), std::move(done), watch_);
}

}  // namespace tpcli::dist

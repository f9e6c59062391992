// tpcli::dist — the Group handle: argument checks, the size-1 fast path, byte counting, trace spans.
//
// n = elements a member passes, S = group size, r = this member's rank in the group.
// Bytes are counted as the direct (point-to-point) algorithm moves them: what of this member's data
// other members receive (sent) and what of theirs lands here (received); own data is free.
#include "distributed/group.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <thread>

#include "distributed/collective_watch.h"
#include "distributed/links.h"
#include "distributed/trace.h"

namespace tpcli::dist {

namespace {

constexpr uint64_t F = sizeof(float);

[[noreturn]] void fail(const char* op, const std::string& what) {
  throw std::invalid_argument(std::string("group.") + op + ": " + what);
}

bool overlap(const float* a, size_t na, const float* b, size_t nb) {
  if (na == 0 || nb == 0) return false;
  return a < b + nb && b < a + na;
}

int64_t sum_counts(const char* op, std::span<const int64_t> counts) {
  int64_t total = 0;
  for (size_t m = 0; m < counts.size(); ++m) {
    if (counts[m] < 0) fail(op, "counts[" + std::to_string(m) + "] = " + std::to_string(counts[m]) + " is negative");
    total += counts[m];
  }
  return total;
}

}  // namespace

void Communicator::all_to_all(std::span<const float> in, std::span<float> out) {
  std::vector<int64_t> send(static_cast<size_t>(size()), static_cast<int64_t>(in.size()) / size()), recv;
  std::vector<float> got = all_to_all_v(in, send, recv);
  std::copy(got.begin(), got.end(), out.begin());
}

Group::Group(std::shared_ptr<Communicator> comm, CommStats* stats) : comm_(std::move(comm)), stats_(stats) {}

Group::Group(std::shared_ptr<Communicator> comm, CommStats* stats, Trace* trace, int track)
    : comm_(std::move(comm)), stats_(stats), trace_(trace), track_(track) {}

int Group::rank() const { return comm_ ? comm_->rank() : 0; }
int Group::size() const { return comm_ ? comm_->size() : 1; }

// One call's counted bytes (see the file comment) and what it books on a modelled link.
struct Group::Cost {
  const char* name;
  uint64_t sent = 0, received = 0;
  CollectiveKind kind = CollectiveKind::Barrier;
  uint64_t bytes = 0;  // the size the link model charges (distributed/links.h)
  PermShape shape{};
};

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

// Which device's waits a call stamps, in which watch (null: none).
struct WatchedDevice {
  CollectiveWatch* watch;
  int device;
};

// Counts one call's bytes, holds it until its modelled link time has passed, and records its trace
// span when it ends (also on an exception).
class CallScope {
 public:
  CallScope(CommStats* stats, Trace* trace, int track, LinkClock* link, WatchedDevice watched, const char* name,
            uint64_t sent, uint64_t received, CollectiveKind kind, uint64_t bytes, PermShape shape = {})
      : trace_(trace), track_(track), link_(link), watch_(watched.watch), name_(name), kind_(kind), bytes_(bytes),
        shape_(shape), counted_(static_cast<int64_t>(sent + received)), waiting_(watched.watch, watched.device) {
    if (stats) stats->add(sent, received);
    if (trace_) start_ns_ = trace_->now_ns();
  }
  // The data moved (every member had arrived): now the modelled transfer runs its course.
  void transferred() {
    if (!link_) return;
    const auto now = std::chrono::steady_clock::now();
    const auto done = link_->book(kind_, bytes_, shape_, now);
    modelled_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(done - now).count();
    hold_until(done, watch_);
  }
  ~CallScope() {
    if (trace_) trace_->record({track_, name_, "collective", start_ns_, trace_->now_ns() - start_ns_, counted_, modelled_ns_,
                                 static_cast<int64_t>(bytes_)});
  }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  Trace* trace_;
  int track_;
  LinkClock* link_;
  CollectiveWatch* watch_;
  const char* name_;
  CollectiveKind kind_;
  uint64_t bytes_;
  PermShape shape_;
  int64_t counted_;
  int64_t start_ns_ = 0, modelled_ns_ = -1;
  CollectiveWatch::Waiting waiting_;
};

// A started call whose modelled transfer is booked when its data has moved; wait() then holds
// until the modelled end.
class ModelledPending : public PendingCollective {
 public:
  ModelledPending(std::unique_ptr<PendingCollective> inner, std::shared_ptr<std::chrono::steady_clock::time_point> done,
                  CollectiveWatch* watch)
      : inner_(std::move(inner)), done_(std::move(done)), watch_(watch) {}
  std::chrono::steady_clock::time_point wait() override {
    const auto moved = inner_->wait();  // synchronises with the worker that wrote *done_
    hold_until(*done_, watch_);
    return std::max(moved, *done_);
  }

 private:
  std::unique_ptr<PendingCollective> inner_;
  std::shared_ptr<std::chrono::steady_clock::time_point> done_;
  CollectiveWatch* watch_;
};

// A started call whose wait() is stamped as the device waiting in a collective.
class WatchedPending : public PendingCollective {
 public:
  WatchedPending(std::unique_ptr<PendingCollective> inner, WatchedDevice watched)
      : inner_(std::move(inner)), watched_(watched) {}
  std::chrono::steady_clock::time_point wait() override {
    CollectiveWatch::Waiting waiting(watched_.watch, watched_.device);
    return inner_->wait();
  }

 private:
  std::unique_ptr<PendingCollective> inner_;
  WatchedDevice watched_;
};

class CompletedPending : public PendingCollective {
 public:
  std::chrono::steady_clock::time_point wait() override { return at_; }

 private:
  std::chrono::steady_clock::time_point at_ = std::chrono::steady_clock::now();
};

}  // namespace

std::unique_ptr<PendingCollective> Communicator::start(CollectiveCall call) {
  call(*this);
  return std::make_unique<CompletedPending>();
}

Pending::Pending(std::unique_ptr<PendingCollective> op, Trace* trace, int track, const char* name, int64_t started_ns,
                 int64_t bytes, int64_t payload)
    : op_(std::move(op)), trace_(trace), track_(track), name_(name), started_ns_(started_ns), bytes_(bytes),
      payload_(payload) {}

Pending::Pending(Pending&& other) noexcept { *this = std::move(other); }

Pending& Pending::operator=(Pending&& other) noexcept {
  if (this != &other) {
    op_.reset();  // an unwaited handle being replaced is finished by its own destructor
    op_ = std::move(other.op_);
    trace_ = other.trace_;
    track_ = other.track_;
    name_ = other.name_;
    started_ns_ = other.started_ns_;
    bytes_ = other.bytes_;
    payload_ = other.payload_;
  }
  return *this;
}

// The backend's handle finishes an unwaited call itself (see PendingCollective implementations).
Pending::~Pending() = default;

void Pending::wait() {
  if (!op_) return;
  std::unique_ptr<PendingCollective> op = std::move(op_);
  const int64_t wait_ns = trace_ ? trace_->now_ns() : 0;
  const auto done = op->wait();
  if (!trace_) return;
  const int64_t end_ns = trace_->now_ns(), done_ns = std::min(end_ns, trace_->ns_of(done));
  // The transfer on the device's transfer track; the time its thread sat waiting on its own track.
  trace_->record({Trace::ASYNC_TRACK_BASE + track_, name_, "collective", started_ns_, done_ns - started_ns_, bytes_, -1,
                  payload_});
  if (end_ns - wait_ns > 0) trace_->record({track_, "wait", "collective", wait_ns, end_ns - wait_ns});
}

void Group::all_sum(std::span<float> x) {
  const uint64_t S = static_cast<uint64_t>(size()), b = x.size() * F;
  CallScope scope(stats_, trace_, track_, link_.get(), {watch_, watch_device_},
                  "all_sum", 2 * b * (S - 1) / S, 2 * b * (S - 1) / S,
                  CollectiveKind::AllSum, b);
  if (S > 1) comm_->all_sum(x);
  scope.transferred();
}

void Group::all_max(std::span<float> x) {
  const uint64_t S = static_cast<uint64_t>(size()), b = x.size() * F;
  CallScope scope(stats_, trace_, track_, link_.get(), {watch_, watch_device_},
                  "all_max", 2 * b * (S - 1) / S, 2 * b * (S - 1) / S,
                  CollectiveKind::AllSum, b);
  if (S > 1) comm_->all_max(x);
  scope.transferred();
}

void Group::mean(std::span<float> x) {
  all_sum(x);
  if (size() == 1) return;
  const float inv = 1.0f / static_cast<float>(size());
  for (float& v : x) v *= inv;
}

// all_gather's counts (in.size() from every member), once out is checked to hold them all.
std::vector<int64_t> Group::equal_gather_counts(std::span<const float> in, std::span<float> out) const {
  if (out.size() != in.size() * static_cast<size_t>(size()))
    fail("all_gather", "out has " + std::to_string(out.size()) + " floats, expected size " + std::to_string(size()) +
                           " x in " + std::to_string(in.size()));
  return std::vector<int64_t>(static_cast<size_t>(size()), static_cast<int64_t>(in.size()));
}

void Group::all_gather(std::span<const float> in, std::span<float> out) {
  const std::vector<int64_t> counts = equal_gather_counts(in, out);
  all_gather_v(in, out, counts);
}

void Group::check_all_gather(std::span<const float> in, std::span<float> out, std::span<const int64_t> counts) const {
  const int S = size(), r = rank();
  if (counts.size() != static_cast<size_t>(S))
    fail("all_gather", std::to_string(counts.size()) + " counts for a group of " + std::to_string(S));
  const int64_t total = sum_counts("all_gather", counts);
  if (static_cast<int64_t>(in.size()) != counts[static_cast<size_t>(r)])
    fail("all_gather", "member " + std::to_string(r) + " passes " + std::to_string(in.size()) +
                           " floats but counts say " + std::to_string(counts[static_cast<size_t>(r)]));
  if (static_cast<int64_t>(out.size()) != total)
    fail("all_gather", "out has " + std::to_string(out.size()) + " floats, counts sum to " + std::to_string(total));
  const int64_t own_offset = std::accumulate(counts.begin(), counts.begin() + r, int64_t{0});
  // In place is allowed only when in is exactly this member's chunk of out.
  if (overlap(in.data(), in.size(), out.data(), out.size()) && in.data() != out.data() + own_offset)
    fail("all_gather", "in overlaps out other than as this member's own chunk");
}

void Group::all_gather_v(std::span<const float> in, std::span<float> out, std::span<const int64_t> counts) {
  check_all_gather(in, out, counts);
  const int S = size();
  const uint64_t own = in.size() * F, total = out.size() * F;
  CallScope scope(stats_, trace_, track_, link_.get(), {watch_, watch_device_},
                  "all_gather", own * static_cast<uint64_t>(S - 1), total - own,
                  CollectiveKind::AllGather, total);
  if (S > 1) {
    comm_->all_gather_v(in, out, counts);
  } else if (!in.empty() && in.data() != out.data()) {
    std::memcpy(out.data(), in.data(), in.size() * F);
  }
  scope.transferred();
}

// Returns the chunk sizes (even_split of in over the members).
std::vector<int64_t> Group::check_reduce_scatter(std::span<const float> in, std::span<float> out) const {
  const int S = size(), r = rank();
  std::vector<int64_t> counts = even_split_counts(static_cast<int64_t>(in.size()), S);
  const int64_t mine = counts[static_cast<size_t>(r)];
  if (static_cast<int64_t>(out.size()) != mine)
    fail("reduce_scatter", "out has " + std::to_string(out.size()) + " floats; member " + std::to_string(r) + " of " +
                               std::to_string(S) + " keeps " + std::to_string(mine) + " of " +
                               std::to_string(in.size()) + " (even_split)");
  const int64_t own_offset = even_split(static_cast<int64_t>(in.size()), S, r).offset;
  if (overlap(in.data(), in.size(), out.data(), out.size()) && out.data() != in.data() + own_offset)
    fail("reduce_scatter", "out overlaps in other than as this member's own chunk");
  return counts;
}

void Group::reduce_scatter(std::span<const float> in, std::span<float> out) {
  reduce_scatter_v(in, out, check_reduce_scatter(in, out));
}

void Group::check_reduce_scatter_v(std::span<const float> in, std::span<float> out,
                                   std::span<const int64_t> counts) const {
  const int S = size(), r = rank();
  if (counts.size() != static_cast<size_t>(S))
    fail("reduce_scatter", std::to_string(counts.size()) + " counts for a group of " + std::to_string(S));
  if (sum_counts("reduce_scatter", counts) != static_cast<int64_t>(in.size()))
    fail("reduce_scatter", "counts do not sum to in's " + std::to_string(in.size()) + " floats");
  if (static_cast<int64_t>(out.size()) != counts[static_cast<size_t>(r)])
    fail("reduce_scatter", "out has " + std::to_string(out.size()) + " floats but counts give member " +
                               std::to_string(r) + " " + std::to_string(counts[static_cast<size_t>(r)]));
  const int64_t own_offset = std::accumulate(counts.begin(), counts.begin() + r, int64_t{0});
  if (overlap(in.data(), in.size(), out.data(), out.size()) && out.data() != in.data() + own_offset)
    fail("reduce_scatter", "out overlaps in other than as this member's own chunk");
}

void Group::reduce_scatter_v(std::span<const float> in, std::span<float> out, std::span<const int64_t> counts) {
  check_reduce_scatter_v(in, out, counts);
  const int S = size();
  const uint64_t b = in.size() * F, own = out.size() * F;
  CallScope scope(stats_, trace_, track_, link_.get(), {watch_, watch_device_},
                  "reduce_scatter", b - own, own * static_cast<uint64_t>(S - 1),
                  CollectiveKind::ReduceScatter, b);
  if (S > 1) {
    comm_->reduce_scatter_v(in, out, counts);
  } else if (!in.empty() && in.data() != out.data()) {
    std::memcpy(out.data(), in.data(), in.size() * F);
  }
  scope.transferred();
}

// Returns the bytes this member sends (= receives): every chunk but its own.
uint64_t Group::check_all_to_all(std::span<const float> in, std::span<float> out) const {
  const int S = size();
  if (in.size() != out.size())
    fail("all_to_all", "in has " + std::to_string(in.size()) + " floats but out has " + std::to_string(out.size()));
  if (in.size() % static_cast<size_t>(S) != 0)
    fail("all_to_all", std::to_string(in.size()) + " floats do not split into " + std::to_string(S) +
                           " equal chunks (use all_to_all_v for ragged chunks)");
  if (overlap(in.data(), in.size(), out.data(), out.size())) fail("all_to_all", "in and out overlap");
  return (in.size() - in.size() / static_cast<size_t>(S)) * F;
}

void Group::all_to_all(std::span<const float> in, std::span<float> out) {
  const int S = size();
  const uint64_t moved = check_all_to_all(in, out);
  CallScope scope(stats_, trace_, track_, link_.get(), {watch_, watch_device_},
                  "all_to_all", moved, moved, CollectiveKind::AllToAll,
                  in.size() * F);
  if (S > 1) {
    comm_->all_to_all(in, out);
  } else if (!in.empty()) {
    std::memcpy(out.data(), in.data(), in.size() * F);
  }
  scope.transferred();
}

std::vector<float> Group::all_to_all_v(std::span<const float> in, std::span<const int64_t> send_counts,
                                       std::vector<int64_t>& recv_counts) {
  const int S = size(), r = rank();
  if (send_counts.size() != static_cast<size_t>(S))
    fail("all_to_all_v", std::to_string(send_counts.size()) + " send counts for a group of " + std::to_string(S));
  const int64_t total = sum_counts("all_to_all_v", send_counts);
  if (total != static_cast<int64_t>(in.size()))
    fail("all_to_all_v", "send counts sum to " + std::to_string(total) + " but in has " + std::to_string(in.size()) +
                             " floats");
  if (S == 1) {
    CallScope scope(stats_, trace_, track_, nullptr, {watch_, watch_device_},
                    "all_to_all_v", 0, 0, CollectiveKind::AllToAll, 0);
    recv_counts.assign(1, total);
    return std::vector<float>(in.begin(), in.end());
  }
  std::vector<float> out;
  {
    // Bytes are known only once the data arrived: counted below, not by the scope.
    CallScope scope(nullptr, trace_, track_, link_.get(), {watch_, watch_device_},
                    "all_to_all_v", 0, 0, CollectiveKind::AllToAll, in.size() * F);
    out = comm_->all_to_all_v(in, send_counts, recv_counts);
    scope.transferred();
  }
  const uint64_t self = static_cast<uint64_t>(send_counts[static_cast<size_t>(r)]) * F;
  if (stats_) stats_->add(in.size() * F - self, out.size() * F - self);
  return out;
}

// Returns (this member sends, this member receives).
std::pair<bool, bool> Group::check_ppermute(std::span<const float> in, std::span<float> out, const Perm& perm) const {
  const int S = size(), r = rank();
  if (in.size() != out.size())
    fail("ppermute", "in has " + std::to_string(in.size()) + " floats but out has " + std::to_string(out.size()));
  std::vector<char> is_src(static_cast<size_t>(S), 0), is_dst(static_cast<size_t>(S), 0);
  bool sends = false, receives = false;
  for (const auto& [src, dst] : perm) {
    if (src < 0 || src >= S || dst < 0 || dst >= S)
      fail("ppermute", "pair (" + std::to_string(src) + ", " + std::to_string(dst) + ") outside group of " +
                           std::to_string(S));
    if (is_src[static_cast<size_t>(src)]++) fail("ppermute", "source " + std::to_string(src) + " appears twice");
    if (is_dst[static_cast<size_t>(dst)]++) fail("ppermute", "destination " + std::to_string(dst) + " appears twice");
    sends |= src == r && dst != r;
    receives |= dst == r && src != r;
  }
  if (overlap(in.data(), in.size(), out.data(), out.size()) && in.data() != out.data())
    fail("ppermute", "in and out overlap");
  if (in.data() == out.data() && !in.empty() && S > 1) fail("ppermute", "in and out are the same buffer");
  return {sends, receives};
}

// A size-1 group's ppermute: a copy, or zeros when the member is no destination.
static void ppermute_alone(std::span<const float> in, std::span<float> out, const Perm& perm) {
  if (perm.empty()) {
    std::fill(out.begin(), out.end(), 0.0f);
  } else if (in.data() != out.data() && !in.empty()) {
    std::memcpy(out.data(), in.data(), in.size() * F);
  }
}

void Group::ppermute(std::span<const float> in, std::span<float> out, const Perm& perm) {
  const auto [sends, receives] = check_ppermute(in, out, perm);
  const uint64_t b = in.size() * F;
  CallScope scope(stats_, trace_, track_, link_.get(), {watch_, watch_device_},
                  "ppermute", sends ? b : 0, receives ? b : 0,
                  CollectiveKind::Ppermute, b, perm_shape(perm, size()));
  if (size() > 1) {
    comm_->ppermute(in, out, perm);
  } else {
    ppermute_alone(in, out, perm);
  }
  scope.transferred();
}

// ---- asynchronous forms ----

Pending Group::start(const Cost& cost, CollectiveCall call) {
  if (stats_) stats_->add(cost.sent, cost.received);
  const int64_t started_ns = trace_ ? trace_->now_ns() : 0;
  const int64_t bytes = static_cast<int64_t>(cost.sent + cost.received), payload = static_cast<int64_t>(cost.bytes);
  const auto watched = [this](std::unique_ptr<PendingCollective> op) -> std::unique_ptr<PendingCollective> {
    if (!watch_ || watch_device_ < 0) return op;  // no stamps: no wrapper on a hot path
    return std::make_unique<WatchedPending>(std::move(op), WatchedDevice{watch_, watch_device_});
  };
  if (!link_)
    return Pending(watched(comm_->start(std::move(call))), trace_, track_, cost.name, started_ns, bytes, payload);
  // The transfer is booked from the moment this member started it (members of an SPMD program
  // start it together; a late member still delays the end through the real exchange, which wait()
  // also waits for), not from when the worker thread got a core: on a busy machine that comes
  // later, and would charge scheduling delays to the link. wait() holds until the booked end.
  auto done = std::make_shared<std::chrono::steady_clock::time_point>();
  CollectiveCall booked = [call = std::move(call), link = link_, cost, done,
                           started = std::chrono::steady_clock::now()](Communicator& c) {
    call(c);
    *done = link->book(cost.kind, cost.bytes, cost.shape, started);
  };
  auto modelled = std::make_unique<ModelledPending>(comm_->start(std::move(booked)), done, watch_);
  return Pending(watched(std::move(modelled)), trace_, track_, cost.name, started_ns, bytes, payload);
}

Pending Group::start_all_sum(std::span<float> x) {
  const uint64_t S = static_cast<uint64_t>(size()), b = x.size() * F;
  if (S == 1) return Pending();
  return start({"all_sum", 2 * b * (S - 1) / S, 2 * b * (S - 1) / S, CollectiveKind::AllSum, b},
               [x](Communicator& c) { c.all_sum(x); });
}

Pending Group::start_all_gather(std::span<const float> in, std::span<float> out) {
  const std::vector<int64_t> counts = equal_gather_counts(in, out);
  check_all_gather(in, out, counts);
  if (size() == 1) {
    if (!in.empty() && in.data() != out.data()) std::memcpy(out.data(), in.data(), in.size() * F);
    return Pending();
  }
  const uint64_t own = in.size() * F, total = out.size() * F;
  return start({"all_gather", own * static_cast<uint64_t>(size() - 1), total - own, CollectiveKind::AllGather, total},
               [in, out, counts = std::move(counts)](Communicator& c) { c.all_gather_v(in, out, counts); });
}

Pending Group::start_reduce_scatter(std::span<const float> in, std::span<float> out) {
  std::vector<int64_t> counts = check_reduce_scatter(in, out);
  if (size() == 1) {
    if (!in.empty() && in.data() != out.data()) std::memcpy(out.data(), in.data(), in.size() * F);
    return Pending();
  }
  const uint64_t b = in.size() * F, own = out.size() * F;
  return start({"reduce_scatter", b - own, own * static_cast<uint64_t>(size() - 1), CollectiveKind::ReduceScatter, b},
               [in, out, counts = std::move(counts)](Communicator& c) { c.reduce_scatter_v(in, out, counts); });
}

Pending Group::start_ppermute(std::span<const float> in, std::span<float> out, const Perm& perm) {
  const auto [sends, receives] = check_ppermute(in, out, perm);
  if (size() == 1) {
    ppermute_alone(in, out, perm);
    return Pending();
  }
  const uint64_t b = in.size() * F;
  return start({"ppermute", sends ? b : 0, receives ? b : 0, CollectiveKind::Ppermute, b, perm_shape(perm, size())},
               [in, out, perm](Communicator& c) { c.ppermute(in, out, perm); });
}

void Group::check_broadcast(int root) const {
  if (root < 0 || root >= size())
    fail("broadcast", "root " + std::to_string(root) + " outside group of " + std::to_string(size()));
}

void Group::broadcast(std::span<float> x, int root) {
  const int S = size();
  check_broadcast(root);
  const uint64_t b = x.size() * F;
  const bool is_root = rank() == root;
  CallScope scope(stats_, trace_, track_, link_.get(), {watch_, watch_device_},
                  "broadcast", is_root ? b * static_cast<uint64_t>(S - 1) : 0,
                  is_root ? 0 : b, CollectiveKind::Broadcast, b);
  if (S > 1) comm_->broadcast(x, root);
  scope.transferred();
}

Pending Group::start_all_to_all(std::span<const float> in, std::span<float> out) {
  const uint64_t moved = check_all_to_all(in, out);
  if (size() == 1) {
    if (!in.empty()) std::memcpy(out.data(), in.data(), in.size() * F);
    return Pending();
  }
  return start({"all_to_all", moved, moved, CollectiveKind::AllToAll, in.size() * F},
               [in, out](Communicator& c) { c.all_to_all(in, out); });
}

Pending Group::start_broadcast(std::span<float> x, int root) {
  check_broadcast(root);
  const int S = size();
  if (S == 1) return Pending();
  const uint64_t b = x.size() * F;
  const bool is_root = rank() == root;
  return start({"broadcast", is_root ? b * static_cast<uint64_t>(S - 1) : 0, is_root ? 0 : b, CollectiveKind::Broadcast, b},
               [x, root](Communicator& c) { c.broadcast(x, root); });
}

void Group::barrier() {
  CallScope scope(stats_, trace_, track_, link_.get(), {watch_, watch_device_},
                  "barrier", 0, 0, CollectiveKind::Barrier, 0);
  if (size() > 1) comm_->barrier();
  scope.transferred();
}

Range even_split(int64_t n, int parts, int index) {
  if (n < 0 || parts < 1 || index < 0 || index >= parts)
    throw std::invalid_argument("even_split: cannot take part " + std::to_string(index) + " of " +
                                std::to_string(n) + " split into " + std::to_string(parts));
  const int64_t base = n / parts, extra = n % parts;
  return {index * base + std::min<int64_t>(index, extra), base + (index < extra ? 1 : 0)};
}

std::vector<int64_t> even_split_counts(int64_t n, int parts) {
  std::vector<int64_t> counts(static_cast<size_t>(parts));
  for (int i = 0; i < parts; ++i) counts[static_cast<size_t>(i)] = even_split(n, parts, i).count;
  return counts;
}

}  // namespace tpcli::dist

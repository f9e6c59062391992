// tpcli::dist — the Group handle: argument checks, the size-1 fast path, byte counting, trace spans.
//
// n = elements a member passes, S = group size, r = this member's rank in the group.
// Bytes are counted as the direct (point-to-point) algorithm moves them: what of this member's data
// other members receive (sent) and what of theirs lands here (received); own data is free.
#include "distributed/group.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <type_traits>

#include "distributed/trace.h"
#include "distributed/tree_reduce.h"
#include "tensor/quant_formats.h"

namespace tpcli::dist {

namespace {

constexpr uint64_t F = sizeof(float);

[[noreturn]] void fail(const char* op, const std::string& what) {
  throw std::invalid_argument(std::string("group.") + op + ": " + what);
}

template <class T>
bool overlap(const T* a, size_t na, const T* b, size_t nb) {
  if (na == 0 || nb == 0) return false;
  return a < b + nb && b < a + na;
}

// The element's name in error messages.
template <class T>
const char* units() {
  if constexpr (std::is_same_v<T, float>) return "floats";
  if constexpr (std::is_same_v<T, int32_t>) return "int32s";
  if constexpr (std::is_same_v<T, Bf16>) return "bf16s";
  return "bytes";
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

// One call's counted bytes (see the file comment) and the array its trace span is about.
struct Group::Cost {
  const char* name;
  uint64_t sent = 0, received = 0;
  uint64_t payload = 0;  // the array the call is about (distributed/links.h's B)
};

// Counts one blocking call's bytes and records its trace span when it ends (also on an exception),
// with the modelled link time the communicator reports, if it went through one.
class Group::CallScope {
 public:
  // count = false: the caller counts the call itself, once its bytes are known.
  CallScope(const Group& group, const Cost& cost, bool count = true)
      : trace_(group.trace_), track_(group.track_), comm_(group.size() > 1 ? group.comm_.get() : nullptr), cost_(cost) {
    if (count && group.stats_) group.stats_->add(cost.sent, cost.received);
    if (trace_) start_ns_ = trace_->now_ns();
  }
  ~CallScope() {
    if (!trace_) return;
    const int64_t modelled_ns = comm_ ? comm_->last_modelled_ns() : -1;
    trace_->record({track_, cost_.name, "collective", start_ns_, trace_->now_ns() - start_ns_,
                    static_cast<int64_t>(cost_.sent + cost_.received), modelled_ns, static_cast<int64_t>(cost_.payload)});
  }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  Trace* trace_;
  int track_;
  const Communicator* comm_;  // null: the call moved nothing (size-1 group)
  Cost cost_;
  int64_t start_ns_ = 0;
};

namespace {

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
  CallScope scope(*this, {"all_sum", 2 * b * (S - 1) / S, 2 * b * (S - 1) / S, b});
  if (S > 1) comm_->all_sum(x);
}

void Group::all_max(std::span<float> x) {
  const uint64_t S = static_cast<uint64_t>(size()), b = x.size() * F;
  CallScope scope(*this, {"all_max", 2 * b * (S - 1) / S, 2 * b * (S - 1) / S, b});
  if (S > 1) comm_->all_max(x);
}

void Group::mean(std::span<float> x) {
  all_sum(x);
  if (size() == 1) return;
  const float inv = 1.0f / static_cast<float>(size());
  for (float& v : x) v *= inv;
}

// all_gather's counts (in.size() from every member), once out is checked to hold them all.
template <class T>
std::vector<int64_t> Group::equal_gather_counts(std::span<const T> in, std::span<T> out) const {
  if (out.size() != in.size() * static_cast<size_t>(size()))
    fail("all_gather", "out has " + std::to_string(out.size()) + " " + units<T>() + ", expected size " +
                           std::to_string(size()) + " x in " + std::to_string(in.size()));
  return std::vector<int64_t>(static_cast<size_t>(size()), static_cast<int64_t>(in.size()));
}

void Group::all_gather(std::span<const float> in, std::span<float> out) {
  const std::vector<int64_t> counts = equal_gather_counts(in, out);
  all_gather_v(in, out, counts);
}

template <class T>
void Group::check_all_gather(std::span<const T> in, std::span<T> out, std::span<const int64_t> counts) const {
  const int S = size(), r = rank();
  if (counts.size() != static_cast<size_t>(S))
    fail("all_gather", std::to_string(counts.size()) + " counts for a group of " + std::to_string(S));
  const int64_t total = sum_counts("all_gather", counts);
  if (static_cast<int64_t>(in.size()) != counts[static_cast<size_t>(r)])
    fail("all_gather", "member " + std::to_string(r) + " passes " + std::to_string(in.size()) + " " + units<T>() +
                           " but counts say " + std::to_string(counts[static_cast<size_t>(r)]));
  if (static_cast<int64_t>(out.size()) != total)
    fail("all_gather", "out has " + std::to_string(out.size()) + " " + units<T>() + ", counts sum to " +
                           std::to_string(total));
  const int64_t own_offset = std::accumulate(counts.begin(), counts.begin() + r, int64_t{0});
  // In place is allowed only when in is exactly this member's chunk of out.
  if (overlap(in.data(), in.size(), out.data(), out.size()) && in.data() != out.data() + own_offset)
    fail("all_gather", "in overlaps out other than as this member's own chunk");
}

void Group::all_gather_v(std::span<const float> in, std::span<float> out, std::span<const int64_t> counts) {
  check_all_gather(in, out, counts);
  const int S = size();
  const uint64_t own = in.size() * F, total = out.size() * F;
  CallScope scope(*this, {"all_gather", own * static_cast<uint64_t>(S - 1), total - own, total});
  if (S > 1) {
    comm_->all_gather_v(in, out, counts);
  } else if (!in.empty() && in.data() != out.data()) {
    std::memcpy(out.data(), in.data(), in.size() * F);
  }
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
  CallScope scope(*this, {"reduce_scatter", b - own, own * static_cast<uint64_t>(S - 1), b});
  if (S > 1) {
    comm_->reduce_scatter_v(in, out, counts);
  } else if (!in.empty() && in.data() != out.data()) {
    std::memcpy(out.data(), in.data(), in.size() * F);
  }
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
  CallScope scope(*this, {"all_to_all", moved, moved, in.size() * F});
  if (S > 1) {
    comm_->all_to_all(in, out);
  } else if (!in.empty()) {
    std::memcpy(out.data(), in.data(), in.size() * F);
  }
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
    CallScope scope(*this, {"all_to_all_v", 0, 0, 0});
    recv_counts.assign(1, total);
    return std::vector<float>(in.begin(), in.end());
  }
  std::vector<float> out;
  {
    // Bytes are known only once the data arrived: counted below, not by the scope.
    CallScope scope(*this, {"all_to_all_v", 0, 0, in.size() * F}, false);
    out = comm_->all_to_all_v(in, send_counts, recv_counts);
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
  CallScope scope(*this, {"ppermute", sends ? b : 0, receives ? b : 0, b});
  if (size() > 1) {
    comm_->ppermute(in, out, perm);
  } else {
    ppermute_alone(in, out, perm);
  }
}

// ---- asynchronous forms ----

Pending Group::start(const Cost& cost, CollectiveCall call) {
  if (stats_) stats_->add(cost.sent, cost.received);
  const int64_t started_ns = trace_ ? trace_->now_ns() : 0;
  return Pending(comm_->start(std::move(call)), trace_, track_, cost.name, started_ns,
                 static_cast<int64_t>(cost.sent + cost.received), static_cast<int64_t>(cost.payload));
}

Pending Group::start_all_sum(std::span<float> x) {
  const uint64_t S = static_cast<uint64_t>(size()), b = x.size() * F;
  if (S == 1) return Pending();
  return start({"all_sum", 2 * b * (S - 1) / S, 2 * b * (S - 1) / S, b},
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
  return start({"all_gather", own * static_cast<uint64_t>(size() - 1), total - own, total},
               [in, out, counts = std::move(counts)](Communicator& c) { c.all_gather_v(in, out, counts); });
}

Pending Group::start_reduce_scatter(std::span<const float> in, std::span<float> out) {
  std::vector<int64_t> counts = check_reduce_scatter(in, out);
  if (size() == 1) {
    if (!in.empty() && in.data() != out.data()) std::memcpy(out.data(), in.data(), in.size() * F);
    return Pending();
  }
  const uint64_t b = in.size() * F, own = out.size() * F;
  return start({"reduce_scatter", b - own, own * static_cast<uint64_t>(size() - 1), b},
               [in, out, counts = std::move(counts)](Communicator& c) { c.reduce_scatter_v(in, out, counts); });
}

Pending Group::start_ppermute(std::span<const float> in, std::span<float> out, const Perm& perm) {
  const auto [sends, receives] = check_ppermute(in, out, perm);
  if (size() == 1) {
    ppermute_alone(in, out, perm);
    return Pending();
  }
  const uint64_t b = in.size() * F;
  return start({"ppermute", sends ? b : 0, receives ? b : 0, b},
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
  CallScope scope(*this, {"broadcast", is_root ? b * static_cast<uint64_t>(S - 1) : 0, is_root ? 0 : b, b});
  if (S > 1) comm_->broadcast(x, root);
}

Pending Group::start_all_to_all(std::span<const float> in, std::span<float> out) {
  const uint64_t moved = check_all_to_all(in, out);
  if (size() == 1) {
    if (!in.empty()) std::memcpy(out.data(), in.data(), in.size() * F);
    return Pending();
  }
  return start({"all_to_all", moved, moved, in.size() * F},
               [in, out](Communicator& c) { c.all_to_all(in, out); });
}

Pending Group::start_broadcast(std::span<float> x, int root) {
  check_broadcast(root);
  const int S = size();
  if (S == 1) return Pending();
  const uint64_t b = x.size() * F;
  const bool is_root = rank() == root;
  return start({"broadcast", is_root ? b * static_cast<uint64_t>(S - 1) : 0, is_root ? 0 : b, b},
               [x, root](Communicator& c) { c.broadcast(x, root); });
}

void Group::barrier() {
  CallScope scope(*this, {"barrier", 0, 0, 0});
  if (size() > 1) comm_->barrier();
}

// ---- typed forms: the members' bytes through the backend, the arithmetic here ----

namespace {

// x = the elementwise sum of the S members' rows of all ([S, n]), exact: added in int64, and a sum
// outside int32 fails (every member holds the same rows, so every member throws).
void sum_int32(std::span<int32_t> x, const std::vector<int32_t>& all, int S) {
  const size_t n = x.size();
  for (size_t i = 0; i < n; ++i) {
    int64_t sum = 0;
    for (int m = 0; m < S; ++m) sum += all[static_cast<size_t>(m) * n + i];
    if (sum < std::numeric_limits<int32_t>::min() || sum > std::numeric_limits<int32_t>::max())
      throw std::overflow_error("group.all_sum: element " + std::to_string(i) + " sums to " + std::to_string(sum) +
                                ", outside int32");
    x[i] = static_cast<int32_t>(sum);
  }
}

void max_int32(std::span<int32_t> x, const std::vector<int32_t>& all, int S) {
  const size_t n = x.size();
  for (size_t i = 0; i < n; ++i) {
    int32_t most = all[i];
    for (int m = 1; m < S; ++m) most = std::max(most, all[static_cast<size_t>(m) * n + i]);
    x[i] = most;
  }
}

// x = the members' rows of all ([S, n]) widened to f32, combined in tree_reduce's order (an f32
// all_sum's on every backend), rounded once to nearest even.
template <class Op>
void reduce_bf16(std::span<Bf16> x, const std::vector<Bf16>& all, int S, Op op) {
  const size_t n = x.size();
  std::vector<float> wide(all.size());  // [S, n]
  for (size_t i = 0; i < all.size(); ++i) wide[i] = tensor::bf16_to_f32(all[i].bits);
  std::vector<const float*> parts(static_cast<size_t>(S));  // [S]
  for (int m = 0; m < S; ++m) parts[static_cast<size_t>(m)] = wide.data() + static_cast<size_t>(m) * n;
  std::vector<float> acc(n);  // [n]
  tree_reduce(acc.data(), parts.data(), S, 0, static_cast<int64_t>(n), op);
  for (size_t i = 0; i < n; ++i) x[i].bits = tensor::f32_to_bf16(acc[i]);
}

struct WideSum {
  float operator()(float a, float b) const { return a + b; }
};
struct WideMax {
  float operator()(float a, float b) const { return a < b ? b : a; }  // the backends' max
};

}  // namespace

// Every member's x, in member order ([S, n]); counted as the direct algorithm moves it. Empty for
// a size-1 group (nothing to combine).
template <class T>
std::vector<T> Group::gather_all(const char* name, std::span<const T> x) {
  const int S = size();
  const uint64_t b = x.size_bytes(), others = static_cast<uint64_t>(S - 1);
  CallScope scope(*this, {name, b * others, b * others, b});
  if (S == 1) return {};
  std::vector<T> all(x.size() * static_cast<size_t>(S));
  const std::vector<int64_t> counts(static_cast<size_t>(S), static_cast<int64_t>(b));
  comm_->all_gather_bytes(std::as_bytes(x), std::as_writable_bytes(std::span<T>(all)), counts);
  return all;
}

void Group::all_sum(std::span<int32_t> x) {
  const std::vector<int32_t> all = gather_all<int32_t>("all_sum", x);
  if (!all.empty()) sum_int32(x, all, size());
}

void Group::all_sum(std::span<Bf16> x) {
  const std::vector<Bf16> all = gather_all<Bf16>("all_sum", x);
  if (!all.empty()) reduce_bf16(x, all, size(), WideSum{});
}

void Group::all_max(std::span<int32_t> x) {
  const std::vector<int32_t> all = gather_all<int32_t>("all_max", x);
  if (!all.empty()) max_int32(x, all, size());
}

void Group::all_max(std::span<Bf16> x) {
  const std::vector<Bf16> all = gather_all<Bf16>("all_max", x);
  if (!all.empty()) reduce_bf16(x, all, size(), WideMax{});
}

template <class T>
void Group::gather_typed(std::span<const T> in, std::span<T> out, std::span<const int64_t> counts) {
  check_all_gather(in, out, counts);
  const int S = size();
  const uint64_t own = in.size_bytes(), total = out.size_bytes();
  CallScope scope(*this, {"all_gather", own * static_cast<uint64_t>(S - 1), total - own, total});
  if (S == 1) {
    if (!in.empty() && in.data() != out.data()) std::memcpy(out.data(), in.data(), own);
    return;
  }
  std::vector<int64_t> bytes(counts.begin(), counts.end());
  for (int64_t& c : bytes) c *= static_cast<int64_t>(sizeof(T));
  // In place (in is this member's chunk of out) the byte gather, which takes disjoint buffers,
  // reads a copy.
  std::vector<T> copy;
  if (overlap(in.data(), in.size(), out.data(), out.size())) in = copy = std::vector<T>(in.begin(), in.end());
  comm_->all_gather_bytes(std::as_bytes(in), std::as_writable_bytes(out), bytes);
}

void Group::all_gather_v(std::span<const int32_t> in, std::span<int32_t> out, std::span<const int64_t> counts) {
  gather_typed(in, out, counts);
}

void Group::all_gather_v(std::span<const Bf16> in, std::span<Bf16> out, std::span<const int64_t> counts) {
  gather_typed(in, out, counts);
}

void Group::all_gather(std::span<const int32_t> in, std::span<int32_t> out) {
  gather_typed(in, out, std::span<const int64_t>(equal_gather_counts(in, out)));
}

void Group::all_gather(std::span<const Bf16> in, std::span<Bf16> out) {
  gather_typed(in, out, std::span<const int64_t>(equal_gather_counts(in, out)));
}

void Group::all_gather(std::span<const std::byte> in, std::span<std::byte> out) {
  gather_typed(in, out, std::span<const int64_t>(equal_gather_counts(in, out)));
}

void Group::broadcast(std::span<std::byte> x, int root) {
  const int S = size();
  check_broadcast(root);
  const uint64_t b = x.size();
  const bool is_root = rank() == root;
  CallScope scope(*this, {"broadcast", is_root ? b * static_cast<uint64_t>(S - 1) : 0, is_root ? 0 : b, b});
  if (S > 1) comm_->broadcast_bytes(x, root);
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

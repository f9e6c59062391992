// tpcli::dist — thread backend: collectives through shared memory between device threads.
//
// S = group size, r = this member's index in the group, n = floats a member passes, p = parity of
// the member's collective counter (descriptors and staging buffers are double-buffered by it).
//
// Protocol of every collective: publish a descriptor (op, n, pointers) into this member's slot,
// barrier, read the other members' published data, and — when it read their *own* buffers rather
// than staging copies — barrier again so nobody changes a buffer another member is still reading.
// Why double buffering is safe: a member rewrites slot data of parity p at its collective j+2 only
// after passing a barrier of collective j+1, which nobody reaches before finishing its reads of j.
#include "distributed/threads/thread_backend.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "distributed/async_worker.h"
#include "distributed/futex.h"
#include "distributed/tree_reduce.h"
#include "tensor/blas.h"

namespace tpcli::dist {

namespace {

constexpr int64_t STAGED_MAX = 4096;  // floats (16 KB): contributions up to this are copied to staging
constexpr int64_t BLOCK = 2048;       // floats per reduction block (8 KB, stays in L1)
constexpr int64_t STAGED_BYTES = STAGED_MAX * static_cast<int64_t>(sizeof(float));  // the same staging, for bytes

enum class Op {
  AllSum, AllMax, AllGather, ReduceScatter, AllToAll, AllToAllV, Ppermute, Broadcast, Barrier, AllGatherBytes,
  BroadcastBytes
};

const char* op_name(Op op) {
  switch (op) {
    case Op::AllSum: return "all_sum";
    case Op::AllMax: return "all_max";
    case Op::AllGather: return "all_gather";
    case Op::ReduceScatter: return "reduce_scatter";
    case Op::AllToAll: return "all_to_all";
    case Op::AllToAllV: return "all_to_all_v";
    case Op::Ppermute: return "ppermute";
    case Op::Broadcast: return "broadcast";
    case Op::Barrier: return "barrier";
    case Op::AllGatherBytes: return "all_gather (bytes)";
    case Op::BroadcastBytes: return "broadcast (bytes)";
  }
  return "?";
}

uint64_t hash(std::span<const int64_t> counts) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t c : counts) h = (h ^ static_cast<uint64_t>(c)) * 1099511628211ull;
  return h;
}

uint64_t hash(const Perm& perm) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the pairs
  for (const auto& [src, dst] : perm) {
    h = (h ^ static_cast<uint64_t>(src)) * 1099511628211ull;
    h = (h ^ static_cast<uint64_t>(dst)) * 1099511628211ull;
  }
  return h ^ perm.size();
}

inline void copy_floats(float* dst, const float* src, int64_t n) {
  if (n > 0 && dst != src) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

inline void copy_bytes(std::byte* dst, const std::byte* src, int64_t n) {
  if (n > 0 && dst != src) std::memcpy(dst, src, static_cast<size_t>(n));
}

struct SumOp {
  float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  float operator()(float a, float b) const { return a < b ? b : a; }  // std::max semantics
};

}  // namespace

// ---- shared state of one member set ----

struct Descriptor {
  Op op = Op::Barrier;
  int64_t n = 0;                    // floats (bytes for the byte ops) this member passes
  int root = 0;                     // broadcast
  const float* src = nullptr;       // this member's contribution (own buffer or staging copy)
  float* inout = nullptr;           // all_sum/all_max big path: the member's buffer
  const int64_t* counts = nullptr;  // all_to_all_v send counts, all_gather_v counts
  const std::byte* bytes = nullptr;  // the byte ops: this member's contribution (own buffer or staging)
  std::byte* bytes_out = nullptr;    // all_gather_bytes big path: the member's out
  uint64_t key = 0;                 // must agree on every member: perm / counts hash, broadcast root
};

struct alignas(64) MemberSlot {
  Descriptor desc[2];             // by parity
  std::vector<float> stage[2];    // [STAGED_MAX] by parity
  uint64_t barriers = 0;          // owned by the member's thread
  uint64_t ops = 0;               // owned by the member's thread
};

struct ThreadGroupState {
  ThreadGroupState(ThreadBackend& f, std::vector<int> m) : fabric(f), members(std::move(m)), size(static_cast<int>(members.size())), slots(members.size()) {
    for (MemberSlot& s : slots)
      for (auto& st : s.stage) st.resize(STAGED_MAX);
  }

  ThreadBackend& fabric;
  const std::vector<int> members;  // mesh ranks, ascending
  const int size;
  std::vector<MemberSlot> slots;   // [size]
  // Barrier word: high 32 bits = barriers completed (mod 2^32), low 32 bits = members arrived at
  // the current one. One word, so a member can take back its arrival atomically (see leave()).
  alignas(64) std::atomic<uint64_t> bar{0};
  alignas(64) std::atomic<uint32_t> wake{0};    // futex word: bumped on completion, abort, a member leaving
  std::atomic<uint32_t> sleepers{0};            // members asleep on wake (kick skips the syscall without)
  std::atomic<int> finished_member{-1};         // mesh rank of a member that returned from its body

  // Throws when the collective can never complete (run aborted, or a member already left).
  void check_events(int r) const {
    if (fabric.aborted()) throw CollectiveAborted(fabric.abort_message());
    const int f = finished_member.load(std::memory_order_acquire);
    if (f >= 0)
      throw CollectiveAborted("device " + std::to_string(f) + " returned while device " +
                              std::to_string(members[static_cast<size_t>(r)]) +
                              " waits for it in a collective (do all devices make the same collective calls?)");
  }

  bool has_event() const {
    return fabric.aborted() || finished_member.load(std::memory_order_acquire) >= 0;
  }

  void kick() {
    wake.fetch_add(1, std::memory_order_seq_cst);
    futex_wake_all(wake, sleepers, FutexScope::Process);
  }

  static uint32_t generation(uint64_t word) { return static_cast<uint32_t>(word >> 32); }

  // leavable: only the first barrier of a collective. Once it completes, every member runs to the
  // collective's later barriers without waiting on anyone, and the others may be reading this
  // member's buffers until those complete: leaving there would free memory under their feet.
  void arrive_and_wait(int r, bool leavable) {
    const uint64_t k = ++slots[static_cast<size_t>(r)].barriers;
    const uint32_t open_gen = static_cast<uint32_t>(k - 1);
    // Arrive; the last arrival completes the barrier in the same atomic step, so a member taking
    // back its arrival (leave) can never slip in between.
    const uint64_t completed = static_cast<uint64_t>(static_cast<uint32_t>(k)) << 32;
    uint64_t v = bar.load(std::memory_order_relaxed);
    while (!bar.compare_exchange_weak(v, (v & 0xffffffffu) + 1 == static_cast<uint64_t>(size) ? completed : v + 1,
                                      std::memory_order_acq_rel, std::memory_order_relaxed)) {
    }
    if ((v & 0xffffffffu) + 1 == static_cast<uint64_t>(size)) {
      kick();
      return;
    }
    const auto ready = [&] {
      return generation(bar.load(std::memory_order_acquire)) != open_gen || (leavable && has_event());
    };
    spin_until(ready, fabric.spin_budget());
    for (;;) {
      if (generation(bar.load(std::memory_order_acquire)) != open_gen) return;
      if (leavable && has_event()) leave(r, open_gen);
      // Sleep at once (never yield: see distributed/futex.h). Any change after this load — completion,
      // abort, a member leaving — bumps wake, so the futex returns rather than sleep through it.
      const uint32_t w = wake.load(std::memory_order_seq_cst);
      if (generation(bar.load(std::memory_order_acquire)) != open_gen) return;
      if (leavable && has_event()) leave(r, open_gen);
      futex_wait(wake, w, sleepers, FutexScope::Process);
    }
  }

  // Take back this member's arrival and throw — unless the barrier completed meanwhile: then the
  // others may already read this member's buffers, so it must finish the collective (and throws at
  // its next barrier). Without this a member could free a buffer another member still reads.
  void leave(int r, uint32_t open_gen) {
    uint64_t now = bar.load(std::memory_order_acquire);
    while (generation(now) == open_gen) {
      if (bar.compare_exchange_weak(now, now - 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
        check_events(r);  // throws: events are sticky
        throw CollectiveAborted("thread backend: collective abandoned");
      }
    }
  }
};

// ---- one member's view ----

class ThreadCommunicator : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadGroupState> state, int r) : st_(std::move(state)), r_(r) {}

  int rank() const override { return r_; }
  int size() const override { return st_->size; }

  void all_sum(std::span<float> x) override { reduce_all(Op::AllSum, x, SumOp{}); }
  void all_max(std::span<float> x) override { reduce_all(Op::AllMax, x, MaxOp{}); }

  void all_gather_v(std::span<const float> in, std::span<float> out, std::span<const int64_t> counts) override {
    const int64_t most = *std::max_element(counts.begin(), counts.end());
    const bool staged = most <= STAGED_MAX;  // counts are the same on every member: same decision
    Descriptor& d = begin(Op::AllGather, static_cast<int64_t>(in.size()));
    d.key = hash(counts);
    d.inout = out.data();
    publish(d, in, staged);
    sync();
    check_same_key("counts differ between members");
    if (staged) {  // pull every staged chunk into out
      int64_t off = 0;
      for (int m = 0; m < size(); ++m) {
        copy_floats(out.data() + off, m == r_ ? in.data() : peer(m).src, counts[static_cast<size_t>(m)]);
        off += counts[static_cast<size_t>(m)];
      }
      return;
    }
    // Push this member's chunk into every member's out: in is read once, each out written once
    // (only member r writes chunk r anywhere, so an in-place member's own chunk stays untouched).
    int64_t own = 0;
    for (int m = 0; m < r_; ++m) own += counts[static_cast<size_t>(m)];
    for (int m = 0; m < size(); ++m) copy_floats(peer(m).inout + own, in.data(), static_cast<int64_t>(in.size()));
    sync_again();
  }

  void reduce_scatter_v(std::span<const float> in, std::span<float> out, std::span<const int64_t> counts) override {
    const bool staged = static_cast<int64_t>(in.size()) <= STAGED_MAX;
    Descriptor& d = begin(Op::ReduceScatter, static_cast<int64_t>(in.size()));
    publish(d, in, staged);
    sync();
    check_same_n();
    int64_t off = 0;
    for (int m = 0; m < r_; ++m) off += counts[static_cast<size_t>(m)];
    tree_reduce(out.data(), sources().data(), size(), off, static_cast<int64_t>(out.size()), SumOp{});
    if (!staged) sync_again();
  }

  void all_to_all(std::span<const float> in, std::span<float> out) override {
    const bool staged = static_cast<int64_t>(in.size()) <= STAGED_MAX;
    Descriptor& d = begin(Op::AllToAll, static_cast<int64_t>(in.size()));
    publish(d, in, staged);
    sync();
    check_same_n();
    const int64_t chunk = static_cast<int64_t>(in.size()) / size();
    for (int m = 0; m < size(); ++m)
      copy_floats(out.data() + m * chunk, (m == r_ ? in.data() : peer(m).src) + r_ * chunk, chunk);
    if (!staged) sync_again();
  }

  std::vector<float> all_to_all_v(std::span<const float> in, std::span<const int64_t> send_counts,
                                  std::vector<int64_t>& recv_counts) override {
    Descriptor& d = begin(Op::AllToAllV, static_cast<int64_t>(in.size()));
    d.counts = send_counts.data();
    publish(d, in, false);
    sync();
    const int S = size();
    recv_counts.assign(static_cast<size_t>(S), 0);
    std::vector<int64_t> offsets(static_cast<size_t>(S), 0);  // [S] where my piece starts in m's in
    int64_t total = 0;
    for (int m = 0; m < S; ++m) check_op(m, peer(m));
    for (int m = 0; m < S; ++m) {
      const Descriptor& o = peer(m);
      for (int j = 0; j < r_; ++j) offsets[static_cast<size_t>(m)] += o.counts[j];
      recv_counts[static_cast<size_t>(m)] = o.counts[r_];
      total += o.counts[r_];
    }
    std::vector<float> out(static_cast<size_t>(total));  // [total] in source order
    int64_t off = 0;
    for (int m = 0; m < S; ++m) {
      copy_floats(out.data() + off, peer(m).src + offsets[static_cast<size_t>(m)], recv_counts[static_cast<size_t>(m)]);
      off += recv_counts[static_cast<size_t>(m)];
    }
    sync_again();
    return out;
  }

  void ppermute(std::span<const float> in, std::span<float> out, const Perm& perm) override {
    const bool staged = static_cast<int64_t>(in.size()) <= STAGED_MAX;
    Descriptor& d = begin(Op::Ppermute, static_cast<int64_t>(in.size()));
    d.key = hash(perm);
    publish(d, in, staged);
    sync();
    check_same_n();
    check_same_key("permutations differ between members");
    const auto from = std::find_if(perm.begin(), perm.end(), [&](const auto& e) { return e.second == r_; });
    if (from == perm.end()) {
      std::fill(out.begin(), out.end(), 0.0f);
    } else {
      copy_floats(out.data(), from->first == r_ ? in.data() : peer(from->first).src, static_cast<int64_t>(in.size()));
    }
    if (!staged) sync_again();
  }

  void broadcast(std::span<float> x, int root) override {
    const bool staged = static_cast<int64_t>(x.size()) <= STAGED_MAX;
    Descriptor& d = begin(Op::Broadcast, static_cast<int64_t>(x.size()));
    d.root = root;
    d.key = static_cast<uint64_t>(root);
    if (r_ == root) publish(d, x, staged);
    sync();
    check_same_n();
    check_same_key("roots differ between members");
    if (r_ != root) copy_floats(x.data(), peer(root).src, static_cast<int64_t>(x.size()));
    if (!staged) sync_again();
  }

  // all_gather_v's algorithm over bytes (counts in bytes).
  void all_gather_bytes(std::span<const std::byte> in, std::span<std::byte> out, std::span<const int64_t> counts) override {
    const int64_t most = *std::max_element(counts.begin(), counts.end());
    const bool staged = most <= STAGED_BYTES;  // counts are the same on every member: same decision
    Descriptor& d = begin(Op::AllGatherBytes, static_cast<int64_t>(in.size()));
    d.key = hash(counts);
    d.bytes_out = out.data();
    publish_bytes(d, in, staged);
    sync();
    check_same_key("counts differ between members");
    int64_t own = 0;
    if (staged) {
      for (int m = 0; m < size(); ++m) {
        copy_bytes(out.data() + own, m == r_ ? in.data() : peer(m).bytes, counts[static_cast<size_t>(m)]);
        own += counts[static_cast<size_t>(m)];
      }
      return;
    }
    for (int m = 0; m < r_; ++m) own += counts[static_cast<size_t>(m)];
    for (int m = 0; m < size(); ++m) copy_bytes(peer(m).bytes_out + own, in.data(), static_cast<int64_t>(in.size()));
    sync_again();
  }

  void broadcast_bytes(std::span<std::byte> x, int root) override {
    const bool staged = static_cast<int64_t>(x.size()) <= STAGED_BYTES;
    Descriptor& d = begin(Op::BroadcastBytes, static_cast<int64_t>(x.size()));
    d.root = root;
    d.key = static_cast<uint64_t>(root);
    if (r_ == root) publish_bytes(d, x, staged);
    sync();
    check_same_n();
    check_same_key("roots differ between members");
    if (r_ != root) copy_bytes(x.data(), peer(root).bytes, static_cast<int64_t>(x.size()));
    if (!staged) sync_again();
  }

  void barrier() override {
    begin(Op::Barrier, 0);
    sync();
    for (int m = 0; m < size(); ++m) check_op(m, peer(m));
  }

  // Started collectives run on channel 1 of the same members, on this member's worker thread.
  std::unique_ptr<PendingCollective> start(CollectiveCall call) override {
    if (!worker_) {
      ThreadBackend& fabric = st_->fabric;
      const int rank = st_->members[static_cast<size_t>(r_)];
      worker_ = std::make_unique<AsyncWorker>(fabric.channel_communicator(rank, st_->members, 1),
                                              [&fabric, rank](const std::string& why) { fabric.abort(rank, why); });
    }
    return worker_->submit(std::move(call));
  }

 private:
  MemberSlot& slot(int m) const { return st_->slots[static_cast<size_t>(m)]; }
  const Descriptor& peer(int m) const { return slot(m).desc[parity_]; }
  void sync() { st_->arrive_and_wait(r_, true); }          // a collective's first barrier
  void sync_again() { st_->arrive_and_wait(r_, false); }   // its later barriers

  Descriptor& begin(Op op, int64_t n) {
    st_->check_events(r_);
    MemberSlot& me = slot(r_);
    parity_ = static_cast<int>(me.ops++ & 1);
    Descriptor& d = me.desc[parity_];
    d = Descriptor{};
    d.op = op;
    d.n = n;
    return d;
  }

  void publish(Descriptor& d, std::span<const float> data, bool staged) {
    if (staged) {
      std::vector<float>& st = slot(r_).stage[parity_];
      copy_floats(st.data(), data.data(), static_cast<int64_t>(data.size()));
      d.src = st.data();
    } else {
      d.src = data.data();
    }
  }

  // The staging buffer holds either kind: its floats' storage, as bytes.
  void publish_bytes(Descriptor& d, std::span<const std::byte> data, bool staged) {
    if (staged) {
      std::byte* st = std::as_writable_bytes(std::span<float>(slot(r_).stage[parity_])).data();
      copy_bytes(st, data.data(), static_cast<int64_t>(data.size()));
      d.bytes = st;
    } else {
      d.bytes = data.data();
    }
  }

  std::vector<const float*> sources() const {
    std::vector<const float*> s(static_cast<size_t>(size()));
    for (int m = 0; m < size(); ++m) s[static_cast<size_t>(m)] = peer(m).src;
    return s;
  }

  [[noreturn]] void mismatch(const char* op, int m, const std::string& what) const {
    throw std::invalid_argument(std::string("thread backend: ") + op + ": " + what + " (member " +
                                std::to_string(m) + " vs member 0 of a group of " + std::to_string(size()) + ")");
  }

  void check_op(int m, const Descriptor& o) const {
    const Descriptor& first = peer(0);
    if (o.op != first.op)
      throw std::invalid_argument(std::string("thread backend: member ") + std::to_string(m) + " called " +
                                  op_name(o.op) + " while member 0 called " + op_name(first.op) +
                                  " (collectives must be called in the same order)");
  }

  // Every member runs the same comparison over the same published values, so either all members
  // throw or none does (one member leaving alone could free a buffer the others still read).
  void check_same_key(const char* what) const {
    for (int m = 0; m < size(); ++m) check_op(m, peer(m));
    for (int m = 1; m < size(); ++m)
      if (peer(m).key != peer(0).key) mismatch(op_name(peer(r_).op), m, what);
  }

  void check_same_n() const {
    for (int m = 0; m < size(); ++m) check_op(m, peer(m));
    for (int m = 1; m < size(); ++m)
      if (peer(m).n != peer(0).n)
        mismatch(op_name(peer(0).op), m,
                 "lengths differ: " + std::to_string(peer(m).n) + " vs " + std::to_string(peer(0).n) + " floats");
  }

  // all_sum / all_max. Small: everyone reduces every staged copy (one barrier). Large: member r
  // owns slice r; it reduces that slice across every member's buffer, block by block, and writes
  // the result straight back into every member's buffer while the block is still in cache. Each
  // buffer is read once and written once: exactly the memory traffic of the bound. Only member r
  // touches slice r of any buffer, so there is no conflict; the closing barrier keeps each buffer
  // alive until the others have written into it.
  template <class Reduce>
  void reduce_all(Op op, std::span<float> x, Reduce reduce) {
    const int64_t n = static_cast<int64_t>(x.size());
    const bool staged = n <= STAGED_MAX;
    Descriptor& d = begin(op, n);
    d.inout = x.data();
    publish(d, x, staged);
    sync();
    check_same_n();
    const int S = size();
    if (staged) {
      tree_reduce(x.data(), sources().data(), S, 0, n, reduce);  // the same bits on every member
      return;
    }
    // Slices aligned to 16 floats (a cache line) so two members never write the same line.
    const int64_t per = ((n + S - 1) / S + 15) / 16 * 16;
    const int64_t lo = std::min(n, r_ * per), len = std::min(n, lo + per) - lo;
    std::vector<float*> bufs(static_cast<size_t>(S));  // [S] every member's buffer
    for (int m = 0; m < S; ++m) bufs[static_cast<size_t>(m)] = peer(m).inout;
    alignas(64) float acc[BLOCK];  // [BLOCK] reduction of one block
    for (int64_t b = lo; b < lo + len; b += BLOCK) {
      const int64_t blen = std::min(BLOCK, lo + len - b);
      tree_reduce(acc, bufs.data(), S, b, blen, reduce);
      for (float* buf : bufs) copy_floats(buf + b, acc, blen);
    }
    sync_again();
  }

  std::shared_ptr<ThreadGroupState> st_;
  int r_;
  int parity_ = 0;
  std::unique_ptr<AsyncWorker> worker_;  // made by the first start(); last, so it stops first
};

// ---- the fabric ----

ThreadBackend::ThreadBackend(int world_size)
    : world_size_(world_size),
      // Spinning only pays while every device can own a core; beyond that, block almost at once.
      // A spin pays only when the last member is running on another core right now and arrives
      // within about a futex wake-up's cost; beyond that it burns a core that the late member, or
      // another program, needs (a spin of tens of microseconds made 2 devices on a busy machine
      // many times slower; BENCHMARKS.md).
      spin_budget_(world_size <= tensor::available_cores() ? std::chrono::microseconds(4)
                                                           : std::chrono::microseconds(0)),
      finished_(static_cast<size_t>(std::max(world_size, 0)), 0) {
  if (world_size < 1) throw std::invalid_argument("thread backend: world size " + std::to_string(world_size) + " < 1");
}

ThreadBackend::~ThreadBackend() = default;

std::shared_ptr<Communicator> ThreadBackend::communicator(int rank, const std::vector<int>& members) {
  return channel_communicator(rank, members, 0);
}

std::shared_ptr<Communicator> ThreadBackend::channel_communicator(int rank, const std::vector<int>& members,
                                                                  int channel) {
  const auto pos = std::find(members.begin(), members.end(), rank);
  if (pos == members.end())
    throw std::invalid_argument("thread backend: rank " + std::to_string(rank) + " is not among the group's members");
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i] < 0 || members[i] >= world_size_ || (i > 0 && members[i] <= members[i - 1]))
      throw std::invalid_argument("thread backend: group members must be ascending ranks in [0, " +
                                  std::to_string(world_size_) + ")");
  std::shared_ptr<ThreadGroupState> state;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& entry = groups_[{channel, members}];
    if (!entry) {
      entry = std::make_shared<ThreadGroupState>(*this, members);
      for (int m : members)
        if (finished_[static_cast<size_t>(m)]) entry->finished_member.store(m, std::memory_order_release);
    }
    state = entry;
  }
  return std::make_shared<ThreadCommunicator>(std::move(state), static_cast<int>(pos - members.begin()));
}

void ThreadBackend::abort(int failed_rank, const std::string& message) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (aborted_.load(std::memory_order_relaxed)) return;
  abort_message_ = "device " + std::to_string(failed_rank) + " failed: " + message;
  aborted_.store(true, std::memory_order_release);
  for (auto& [key, state] : groups_) state->kick();
}

void ThreadBackend::device_finished(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (rank < 0 || rank >= world_size_) return;
  finished_[static_cast<size_t>(rank)] = 1;
  for (auto& [key, state] : groups_) {
    if (!std::binary_search(key.second.begin(), key.second.end(), rank)) continue;
    state->finished_member.store(rank, std::memory_order_release);
    state->kick();
  }
}

}  // namespace tpcli::dist

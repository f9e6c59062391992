// tpcli::dist — collectives over the ZeroMQ transport (algorithms: see zmq_backend.h).
//
// S = group size, r = this member's index, n = floats passed; slice m = even_split(n, S, m).
#include "distributed/zmq/zmq_backend.h"

#include "distributed/zmq/zmq_transport.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "distributed/async_worker.h"
#include "distributed/tree_reduce.h"

namespace tpcli::dist {

namespace {

constexpr int64_t SMALL_FLOATS = 16384;  // 64 KB: below this a reduction is one all-to-all step
constexpr uint64_t PHASES = 4;           // message phases per call

struct SumOp {
  float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  float operator()(float a, float b) const { return a < b ? b : a; }  // as the thread backend
};

uint64_t group_id(const std::vector<int>& members, int occurrence) {
  uint64_t h = fnv1a(std::string_view(reinterpret_cast<const char*>(members.data()), members.size() * sizeof(int)));
  return fnv1a(std::string_view(reinterpret_cast<const char*>(&occurrence), sizeof occurrence), h);
}

std::vector<int64_t> offsets_of(std::span<const int64_t> counts) {
  std::vector<int64_t> off(counts.size() + 1, 0);  // [S + 1]
  for (size_t m = 0; m < counts.size(); ++m) off[m + 1] = off[m] + counts[m];
  return off;
}

class ZmqCommunicator : public Communicator {
 public:
  ZmqCommunicator(std::shared_ptr<ZmqTransport> transport, std::vector<int> members, int index, uint64_t id)
      : t_(std::move(transport)), members_(std::move(members)), r_(index), id_(id) {}

  int rank() const override { return r_; }
  int size() const override { return static_cast<int>(members_.size()); }

  void all_sum(std::span<float> x) override { all_reduce(x, SumOp{}, "all_sum"); }
  void all_max(std::span<float> x) override { all_reduce(x, MaxOp{}, "all_max"); }

  void all_gather_v(std::span<const float> in, std::span<float> out, std::span<const int64_t> counts) override {
    const uint64_t call = calls_++;
    const std::vector<int64_t> off = offsets_of(counts);
    // In place (Group allows `in` to be this member's chunk of out) the receives write elsewhere.
    for (int m = 0; m < size(); ++m)
      if (m != r_) send(m, call, 0, in);
    if (!in.empty() && in.data() != out.data() + off[r_])  // in place: no copy (`in` may still be read)
      std::memmove(out.data() + off[r_], in.data(), in.size_bytes());
    for (int m = 0; m < size(); ++m)
      if (m != r_) receive_into(m, call, 0, "all_gather", out.subspan(off[m], counts[m]));
    flush("all_gather");
  }

  void reduce_scatter_v(std::span<const float> in, std::span<float> out, std::span<const int64_t> counts) override {
    const uint64_t call = calls_++;
    const std::vector<int64_t> off = offsets_of(counts);
    for (int m = 0; m < size(); ++m)
      if (m != r_) send(m, call, 0, in.subspan(off[m], counts[m]));
    const std::span<float> acc = scratch(counts[r_]);  // [counts[r]] the sum of slice r
    reduce_in_order(acc, in.subspan(off[r_], counts[r_]), call, 0, "reduce_scatter", SumOp{});
    flush("reduce_scatter");  // out may be this member's chunk of in (Group allows it): sent parts first
    std::copy(acc.begin(), acc.end(), out.begin());
  }

  std::vector<float> all_to_all_v(std::span<const float> in, std::span<const int64_t> send_counts,
                                  std::vector<int64_t>& recv_counts) override {
    const uint64_t call = calls_++;
    const std::vector<int64_t> off = offsets_of(send_counts);
    for (int m = 0; m < size(); ++m)
      if (m != r_) send(m, call, 0, in.subspan(off[m], send_counts[m]));
    std::vector<float> out;  // [sum of recv_counts] in source order
    recv_counts.assign(static_cast<size_t>(size()), 0);
    for (int m = 0; m < size(); ++m) {
      const size_t base = out.size();
      if (m == r_) {
        const auto own = in.subspan(off[m], send_counts[m]);
        out.insert(out.end(), own.begin(), own.end());
      } else {
        t_->receive(key_from(m, call, 0), "all_to_all_v", [&](int64_t total, int64_t at, std::span<const float> c) {
          out.resize(base + static_cast<size_t>(total));  // chunks may come in any order
          std::copy(c.begin(), c.end(), out.begin() + static_cast<std::ptrdiff_t>(base + at));
        });
      }
      recv_counts[static_cast<size_t>(m)] = static_cast<int64_t>(out.size() - base);
    }
    flush("all_to_all_v");
    return out;
  }

  void all_to_all(std::span<const float> in, std::span<float> out) override {
    const uint64_t call = calls_++;
    const size_t chunk = in.size() / members_.size();
    for (int m = 0; m < size(); ++m)
      if (m != r_) send(m, call, 0, in.subspan(m * chunk, chunk));
    std::copy_n(in.begin() + r_ * chunk, chunk, out.begin() + r_ * chunk);
    for (int m = 0; m < size(); ++m)
      if (m != r_) receive_into(m, call, 0, "all_to_all", out.subspan(m * chunk, chunk));
    flush("all_to_all");
  }

  void ppermute(std::span<const float> in, std::span<float> out, const Perm& perm) override {
    const uint64_t call = calls_++;
    std::optional<int> from;
    for (const auto& [src, dst] : perm) {
      if (src == r_ && dst != r_) send(dst, call, 0, in);
      if (dst == r_) from = src;
    }
    if (!from) {
      std::fill(out.begin(), out.end(), 0.0f);
    } else if (*from == r_) {
      std::copy(in.begin(), in.end(), out.begin());
    } else {
      receive_into(*from, call, 0, "ppermute", out);
    }
    flush("ppermute");
  }

  void broadcast(std::span<float> x, int root) override {
    const uint64_t call = calls_++;
    const int S = size();
    if (static_cast<int64_t>(x.size()) <= SMALL_FLOATS || S == 2) {
      if (r_ == root) {
        for (int m = 0; m < S; ++m)
          if (m != r_) send(m, call, 0, x);
      } else {
        receive_into(root, call, 0, "broadcast", x);
      }
      flush("broadcast");
      return;
    }
    // Scatter the slices from the root, then every member passes its slice to the non-roots.
    const std::vector<int64_t> counts = even_split_counts(static_cast<int64_t>(x.size()), S);
    const std::vector<int64_t> off = offsets_of(counts);
    auto slice = [&](int m) { return x.subspan(off[m], counts[m]); };
    if (r_ == root) {
      for (int m = 0; m < S; ++m)
        if (m != r_) send(m, call, 0, slice(m));
    } else {
      receive_into(root, call, 0, "broadcast", slice(r_));
    }
    for (int m = 0; m < S; ++m)
      if (m != r_ && m != root) send(m, call, 1, slice(r_));
    if (r_ != root)
      for (int m = 0; m < S; ++m)
        if (m != r_) receive_into(m, call, 1, "broadcast", slice(m));
    flush("broadcast");
  }

  // The byte collectives: direct sends, as all_gather_v and the small broadcast.
  void all_gather_bytes(std::span<const std::byte> in, std::span<std::byte> out, std::span<const int64_t> counts) override {
    const uint64_t call = calls_++;
    const std::vector<int64_t> off = offsets_of(counts);
    const std::vector<float> words = to_words(in);
    for (int m = 0; m < size(); ++m)
      if (m != r_) send(m, call, 0, words);
    if (!in.empty()) std::memcpy(out.data() + off[r_], in.data(), in.size());
    for (int m = 0; m < size(); ++m)
      if (m != r_) receive_bytes(m, call, 0, "all_gather", out.subspan(off[m], counts[m]));
    flush("all_gather");
  }

  void broadcast_bytes(std::span<std::byte> x, int root) override {
    const uint64_t call = calls_++;
    if (r_ == root) {
      const std::vector<float> words = to_words(x);
      for (int m = 0; m < size(); ++m)
        if (m != r_) send(m, call, 0, words);
      flush("broadcast");
    } else {
      receive_bytes(root, call, 0, "broadcast", x);
      flush("broadcast");
    }
  }

  void barrier() override {
    const uint64_t call = calls_++;
    for (int m = 0; m < size(); ++m)
      if (m != r_) send(m, call, 0, {});
    for (int m = 0; m < size(); ++m)
      if (m != r_) receive_into(m, call, 0, "barrier", {});
    flush("barrier");
  }

  // Started collectives run on this member's worker thread through a communicator of the same
  // members with an id of its own (the transport is thread-safe; the tags keep the two apart).
  std::unique_ptr<PendingCollective> start(CollectiveCall call) override {
    if (!worker_) {
      const uint64_t channel_id = fnv1a("async", id_);
      const int rank = members_[static_cast<size_t>(r_)];
      worker_ = std::make_unique<AsyncWorker>(
          std::make_shared<ZmqCommunicator>(t_, members_, r_, channel_id),
          [t = t_, rank](const std::string& why) { t->abort("device " + std::to_string(rank) + " failed: " + why); });
    }
    return worker_->submit(std::move(call));
  }

 private:
  MessageKey key_to(int m, uint64_t call, int phase) const {
    return {id_, call * PHASES + static_cast<uint64_t>(phase), members_[static_cast<size_t>(r_)],
            members_[static_cast<size_t>(m)]};
  }
  MessageKey key_from(int m, uint64_t call, int phase) const {
    return {id_, call * PHASES + static_cast<uint64_t>(phase), members_[static_cast<size_t>(m)],
            members_[static_cast<size_t>(r_)]};
  }

  void send(int m, uint64_t call, int phase, std::span<const float> data) { t_->send(key_to(m, call, phase), data); }
  // Waits until this member's sends have left its buffers.
  void flush(const char* what) { t_->flush(what, members_[static_cast<size_t>(r_)]); }

  // The message from member m must fill `out` exactly.
  void receive_into(int m, uint64_t call, int phase, const char* what, std::span<float> out) {
    const int64_t total = t_->receive(key_from(m, call, phase), what, [&](int64_t n, int64_t at, std::span<const float> c) {
      if (n != static_cast<int64_t>(out.size())) length_error(what, m, n, out.size());
      std::copy(c.begin(), c.end(), out.begin() + at);
    });
    (void)total;
  }

  // Bytes travel as the transport's 4-byte words (float spans there are storage: nothing adds
  // them), the last word zero-padded. The copy is what the send reads until the flush.
  static size_t words_of(size_t bytes) { return (bytes + sizeof(float) - 1) / sizeof(float); }
  static std::vector<float> to_words(std::span<const std::byte> bytes) {
    std::vector<float> words(words_of(bytes.size()), 0.0f);
    if (!bytes.empty()) std::memcpy(words.data(), bytes.data(), bytes.size());
    return words;
  }

  // The byte message from member m must fill `out` exactly (in whole words).
  void receive_bytes(int m, uint64_t call, int phase, const char* what, std::span<std::byte> out) {
    t_->receive(key_from(m, call, phase), what, [&](int64_t n, int64_t at, std::span<const float> c) {
      if (n != static_cast<int64_t>(words_of(out.size()))) length_error(what, m, n, words_of(out.size()));
      const size_t from = static_cast<size_t>(at) * sizeof(float);
      if (from < out.size()) std::memcpy(out.data() + from, c.data(), std::min(c.size_bytes(), out.size() - from));
    });
  }

  [[noreturn]] void length_error(const char* what, int m, int64_t got, size_t expected) const {
    throw std::runtime_error("zmq: " + std::string(what) + ": device " + std::to_string(members_[static_cast<size_t>(m)]) +
                             " sent " + std::to_string(got) + " floats, device " +
                             std::to_string(members_[static_cast<size_t>(r_)]) + " expected " +
                             std::to_string(expected) + " (collectives called in a different order or with different sizes)");
  }

  // acc = every member's contribution (this member's is `mine`; acc may be mine) combined in
  // distributed/tree_reduce.h's order, received by rank, never in arrival order.
  template <class Op>
  void reduce_in_order(std::span<float> acc, std::span<const float> mine, uint64_t call, int phase, const char* what,
                       Op op) {
    const int S = size();
    const size_t len = acc.size();
    parts_.resize(static_cast<size_t>(S) * len);
    std::vector<const float*> from(static_cast<size_t>(S));  // [S] each member's contribution
    for (int m = 0; m < S; ++m) {
      float* part = parts_.data() + static_cast<size_t>(m) * len;
      from[static_cast<size_t>(m)] = m == r_ ? mine.data() : part;
      if (m == r_) continue;
      t_->receive(key_from(m, call, phase), what, [&](int64_t n, int64_t at, std::span<const float> c) {
        if (n != static_cast<int64_t>(len)) length_error(what, m, n, len);
        std::copy(c.begin(), c.end(), part + at);
      });
    }
    tree_reduce(acc.data(), from.data(), S, 0, static_cast<int64_t>(len), op);
  }

  template <class Op>
  void all_reduce(std::span<float> x, Op op, const char* what) {
    const uint64_t call = calls_++;
    const int S = size();
    const int64_t n = static_cast<int64_t>(x.size());
    if (n <= SMALL_FLOATS) {
      for (int m = 0; m < S; ++m)
        if (m != r_) send(m, call, 0, x);
      const std::span<float> acc = scratch(n);  // [n]
      reduce_in_order(acc, x, call, 0, what, op);
      flush(what);  // x was sent: it must have left before it is overwritten
      std::copy(acc.begin(), acc.end(), x.begin());
      return;
    }
    const std::vector<int64_t> counts = even_split_counts(n, S);
    const std::vector<int64_t> off = offsets_of(counts);
    auto slice = [&](int m) { return x.subspan(off[m], counts[m]); };
    for (int m = 0; m < S; ++m)
      if (m != r_) send(m, call, 0, slice(m));
    // Slice r was not sent: it is reduced in place.
    const std::span<float> acc = slice(r_);  // [counts[r]] reduced slice r
    reduce_in_order(acc, slice(r_), call, 0, what, op);
    // Phase 1 overwrites the slices phase 0 sent. Their receivers are all in phase 0 (or done with
    // it), so this cannot wait for anything but their reading.
    flush(what);
    for (int m = 0; m < S; ++m)
      if (m != r_) send(m, call, 1, slice(r_));
    for (int m = 0; m < S; ++m)
      if (m != r_) receive_into(m, call, 1, what, slice(m));
    flush(what);
  }

  // A reduction's accumulator, kept between calls: a fresh one per call would page-fault in every
  // byte of a large all_sum again.
  std::span<float> scratch(int64_t n) {
    if (scratch_.size() < static_cast<size_t>(n)) scratch_.resize(static_cast<size_t>(n));
    return std::span<float>(scratch_.data(), static_cast<size_t>(n));
  }

  std::shared_ptr<ZmqTransport> t_;
  std::vector<float> scratch_;  // see scratch()
  std::vector<float> parts_;    // [S, len] the members' contributions to a reduction
  std::vector<int> members_;  // [S] mesh ranks, ascending
  int r_;
  uint64_t id_;        // the same on every member of this communicator
  uint64_t calls_ = 0;  // collectives made so far: tags their messages
  std::unique_ptr<AsyncWorker> worker_;  // made by the first start(); last, so it stops first
};

}  // namespace

ZmqBackend::ZmqBackend(const ZmqConfig& config, const Mesh& mesh)
    : transport_(std::make_shared<ZmqTransport>(config, mesh.size())) {}

std::shared_ptr<Communicator> ZmqBackend::communicator(int rank, const std::vector<int>& members) {
  const auto pos = std::find(members.begin(), members.end(), rank);
  if (pos == members.end())
    throw std::invalid_argument("zmq backend: rank " + std::to_string(rank) + " is not among the group's members");
  if (!transport_->is_local(rank))
    throw std::invalid_argument("zmq backend: device " + std::to_string(rank) + " is not hosted by process " +
                                std::to_string(transport_->config().rank));
  int occurrence;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    occurrence = made_[{rank, members}]++;
  }
  return std::make_shared<ZmqCommunicator>(transport_, members, static_cast<int>(pos - members.begin()),
                                           group_id(members, occurrence));
}

void ZmqBackend::abort(int failed_rank, const std::string& message) {
  transport_->abort("device " + std::to_string(failed_rank) + " failed: " + message);
}

void ZmqBackend::device_finished(int rank) { transport_->device_finished(rank); }

bool zmq_available() { return true; }

void use_zmq_backend(RunOptions& options, const ZmqConfig& config) {
  options.local_ranks = zmq_local_ranks(config);
  options.make_backend = [config](const Mesh& mesh) -> std::unique_ptr<Backend> {
    return std::make_unique<ZmqBackend>(config, mesh);
  };
}

}  // namespace tpcli::dist

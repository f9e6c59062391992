// tpcli::dist — collectives on MPI (the mapping and the failure handling: mpi_backend.h).
//
// S = group size, r = this member's index in the group, n = floats a member passes.
#include "distributed/mpi/mpi_backend.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <type_traits>

#include "distributed/backend.h"
#include "distributed/threads/thread_backend.h"
#include "distributed/tree_reduce.h"

namespace tpcli::dist {

namespace {

using Clock = std::chrono::steady_clock;

// Set once a device of this process failed: the job then ends by MPI_Abort, at exit at the latest.
// Process-wide, as MPI itself is.
std::atomic<bool> job_failed{false};

// MPI is initialised once per process, the first time anything asks for it, and finalised at exit.
struct MpiProcess {
  int rank = 0;
  int size = 1;
};

const MpiProcess& mpi_process() {
  static const MpiProcess process = [] {
    int provided = MPI_THREAD_SINGLE;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
      throw std::runtime_error("mpi: MPI_Init_thread failed");
    if (provided < MPI_THREAD_MULTIPLE) {
      MPI_Finalize();
      throw std::runtime_error("mpi: this MPI library does not provide MPI_THREAD_MULTIPLE (devices are threads)");
    }
    std::atexit([] {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (finalized) return;
      if (job_failed) MPI_Abort(MPI_COMM_WORLD, 1);  // MPI_Finalize would wait for the stuck peers
      MPI_Finalize();
    });
    MpiProcess p;
    MPI_Comm_rank(MPI_COMM_WORLD, &p.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &p.size);
    return p;
  }();
  return process;
}

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(length));
}

// MPI counts are int: a larger buffer is an error rather than a silent truncation.
int mpi_count(int64_t n, const char* op) {
  if (n < 0 || n > INT_MAX)
    throw std::runtime_error(std::string("mpi: ") + op + ": " + std::to_string(n) + " floats exceed MPI's int count");
  return static_cast<int>(n);
}

std::vector<int> int_counts(std::span<const int64_t> counts, const char* op) {
  std::vector<int> out(counts.size());  // [S]
  for (size_t m = 0; m < counts.size(); ++m) out[m] = mpi_count(counts[m], op);
  return out;
}

std::vector<int> displacements(const std::vector<int>& counts, const char* op) {
  std::vector<int> off(counts.size(), 0);  // [S] start of member m's part
  int64_t at = 0;
  for (size_t m = 0; m < counts.size(); ++m) {
    off[m] = mpi_count(at, op);
    at += counts[m];
  }
  mpi_count(at, op);
  return off;
}

bool overlaps(const float* a, size_t na, const float* b, size_t nb) {
  return na > 0 && nb > 0 && a < b + nb && b < a + na;
}

// Which processes still answer, asked when a collective has waited nearly the timeout: a process
// waiting in any collective answers on a communicator of its own (a copy of the world); one that is
// frozen, dead-locked elsewhere or busy for the whole window does not. Messages carry the asker's
// round, so an answer to an older question never vouches for a process now.
class RollCall {
 public:
  explicit RollCall(MPI_Comm world) : answered_(static_cast<size_t>(mpi_process().size), 0) {
    MPI_Comm_dup(world, &comm_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  ~RollCall() { MPI_Comm_free(&comm_); }

  // Sends a question to each of `processes`; the round to pass to silent().
  int ask(const std::vector<int>& processes) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++round_;
    for (int p : processes) send(p, QUESTION, round_);
    return round_;
  }

  // Answers the questions that came and files the answers; a probe when nothing came.
  void serve() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (;;) {
      int came = 0;
      MPI_Message message;
      MPI_Status status;
      if (MPI_Improbe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &came, &message, &status) != MPI_SUCCESS || !came) break;
      int round = 0;
      if (MPI_Mrecv(&round, 1, MPI_INT, &message, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
      if (status.MPI_TAG == QUESTION) send(status.MPI_SOURCE, ANSWER, round);
      else if (status.MPI_SOURCE >= 0 && status.MPI_SOURCE < static_cast<int>(answered_.size()))
        answered_[static_cast<size_t>(status.MPI_SOURCE)] = std::max(answered_[static_cast<size_t>(status.MPI_SOURCE)], round);
    }
    while (!sent_.empty()) {  // a send to a frozen process may never complete: only the front is tested
      int done = 0;
      MPI_Test(&sent_.front().request, &done, MPI_STATUS_IGNORE);
      if (!done) break;
      sent_.pop_front();
    }
  }

  // Those of `processes` that gave no answer to `round` (or to a later question).
  std::vector<int> silent(const std::vector<int>& processes, int round) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<int> out;
    for (int p : processes)
      if (answered_[static_cast<size_t>(p)] < round) out.push_back(p);
    return out;
  }

 private:
  static constexpr int QUESTION = 1, ANSWER = 2;
  struct Sent {
    int round;
    MPI_Request request;
  };
  void send(int process, int tag, int round) {  // with mutex_; the payload lives in sent_ until sent
    sent_.push_back({round, MPI_REQUEST_NULL});
    MPI_Isend(&sent_.back().round, 1, MPI_INT, process, tag, comm_, &sent_.back().request);
  }

  std::mutex mutex_;  // MPI calls on comm_ and the members below
  MPI_Comm comm_ = MPI_COMM_NULL;
  int round_ = 0;
  std::vector<int> answered_;  // [P] the latest round each process answered
  std::deque<Sent> sent_;      // sends not yet known complete (a deque: their payloads stay put)
};

// What the communicators of one run share: how long a collective may wait, the roll call, and the
// run's failure (the first wins), which ends every wait of this process.
class MpiRun {
 public:
  MpiRun(MPI_Comm world, double timeout_s, int devices_per_process)
      : timeout_(timeout_s), K_(devices_per_process), roll_(world) {}

  std::chrono::duration<double> timeout() const { return timeout_; }
  RollCall& roll() { return roll_; }
  // "rank 1", or with several devices a process "process 1 (devices 2-3)", as the zmq backend says.
  std::string process_name(int process) const {
    if (K_ == 1) return "rank " + std::to_string(process);
    return "process " + std::to_string(process) + " (devices " + std::to_string(process * K_) + "-" +
           std::to_string(process * K_ + K_ - 1) + ")";
  }
  // False when the run had failed already.
  bool fail(const std::string& why) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_.load(std::memory_order_relaxed)) return false;
    why_ = why;
    failed_.store(true, std::memory_order_release);
    return true;
  }
  // Throws CollectiveAborted once the run failed.
  void check_not_failed() {
    if (!failed_.load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> lock(mutex_);
    throw CollectiveAborted(why_);
  }

 private:
  std::chrono::duration<double> timeout_;
  int K_;
  RollCall roll_;
  std::mutex mutex_;  // guards why_
  std::atomic<bool> failed_{false};
  std::string why_;
};

// A collective waits by polling its requests: spinning on MPI_Testall for its first SPIN, then
// sleeping, the pause doubling up to MAX_PAUSE; from ANSWER_AFTER on it also answers roll calls, and
// ROLL_CALL before the timeout it asks its peers who is still there. MPI's non-blocking collectives
// advance only inside MPI calls, so the spin covers a working step's waits, as MPI's blocking calls
// spun for all of them (yielding in the spin made a 1 MB all_gather 15x slower; measured with
// `bench collectives --backend mpi --devices 2`: within 1.5x of the blocking calls now, equal at
// 1 MB); the sleeps are for peers that are late.
constexpr std::chrono::microseconds SPIN{2000}, FIRST_PAUSE{20}, MAX_PAUSE{1000};
constexpr std::chrono::milliseconds ANSWER_AFTER{1}, ROLL_CALL{500};
// A failed process's time to end the job by itself (MpiBackend::abort).
constexpr std::chrono::seconds ABORT_GRACE{2};
constexpr double DEFAULT_TIMEOUT_S = 30;  // as the zmq backend's

class MpiCommunicator : public Communicator {
 public:
  // Takes ownership of `comm` (this member's index in it is its MPI rank); `processes` are the MPI
  // processes of its ranks, in order.
  MpiCommunicator(MPI_Comm comm, int device, std::shared_ptr<MpiRun> run, std::vector<int> processes)
      : comm_(comm), device_(device), run_(std::move(run)), processes_(std::move(processes)) {
    MPI_Comm_rank(comm_, &r_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override { MPI_Comm_free(&comm_); }

  int rank() const override { return r_; }
  int size() const override { return size_; }

  // The members' sum in distributed/tree_reduce.h's order (MPI_Allreduce adds in the order its
  // algorithm picks): member m receives everyone's slice m (all-to-all), adds them as the tree, and
  // the summed slices are all-gathered; the bytes of a direct algorithm.
  void all_sum(std::span<float> x) override {
    const std::vector<int> n = int_counts(even_split_counts(std::ssize(x), size_), "all_sum");
    const std::vector<int> off = displacements(n, "all_sum");
    const int mine = n[static_cast<size_t>(r_)];
    const std::vector<int> from_counts(static_cast<size_t>(size_), mine);
    std::vector<int> from_off(static_cast<size_t>(size_));
    for (int m = 0; m < size_; ++m) from_off[static_cast<size_t>(m)] = mpi_count(int64_t{m} * mine, "all_sum");
    staging_.resize(static_cast<size_t>(size_) * static_cast<size_t>(mine));  // [S, mine] every member's slice r
    exchange("all_sum", x.data(), n, off, staging_.data(), from_counts, from_off);
    std::vector<const float*> parts(static_cast<size_t>(size_));
    for (int m = 0; m < size_; ++m) parts[static_cast<size_t>(m)] = staging_.data() + from_off[static_cast<size_t>(m)];
    tree_reduce(x.data() + off[static_cast<size_t>(r_)], parts.data(), size_, 0, mine, [](float a, float b) { return a + b; });
    gather("all_sum", x.data() + off[static_cast<size_t>(r_)], x.data(), n, off);
  }
  void all_max(std::span<float> x) override {
    MPI_Request request;
    check("all_max", MPI_Iallreduce(MPI_IN_PLACE, x.data(), mpi_count(std::ssize(x), "all_max"), MPI_FLOAT, MPI_MAX, comm_, &request));
    finish("all_max", request);
  }

  void all_gather_v(std::span<const float> in, std::span<float> out, std::span<const int64_t> counts) override {
    const std::vector<int> n = int_counts(counts, "all_gather");
    const std::vector<int> off = displacements(n, "all_gather");
    gather("all_gather", in.data(), out.data(), n, off);  // Group allows `in` to be this member's chunk of out
  }

  void reduce_scatter_v(std::span<const float> in, std::span<float> out, std::span<const int64_t> counts) override {
    const std::vector<int> n = int_counts(counts, "reduce_scatter");
    displacements(n, "reduce_scatter");
    // MPI forbids aliased buffers; Group allows out to be this member's chunk of in.
    const bool aliased = overlaps(in.data(), in.size(), out.data(), out.size());
    if (aliased) staging_.resize(out.size());
    MPI_Request request;
    check("reduce_scatter", MPI_Ireduce_scatter(in.data(), aliased ? staging_.data() : out.data(), n.data(), MPI_FLOAT,
                                                MPI_SUM, comm_, &request));
    finish("reduce_scatter", request);
    if (aliased) std::copy(staging_.begin(), staging_.end(), out.begin());
  }

  std::vector<float> all_to_all_v(std::span<const float> in, std::span<const int64_t> send_counts,
                                  std::vector<int64_t>& recv_counts) override {
    recv_counts.assign(static_cast<size_t>(size_), 0);
    MPI_Request request;
    check("all_to_all_v", MPI_Ialltoall(send_counts.data(), 1, MPI_INT64_T, recv_counts.data(), 1, MPI_INT64_T, comm_, &request));
    finish("all_to_all_v", request);
    const std::vector<int> sn = int_counts(send_counts, "all_to_all_v");
    const std::vector<int> rn = int_counts(recv_counts, "all_to_all_v");
    const std::vector<int> soff = displacements(sn, "all_to_all_v");
    const std::vector<int> roff = displacements(rn, "all_to_all_v");
    std::vector<float> out(static_cast<size_t>(roff.back() + rn.back()));  // [sum of recv_counts] in source order
    exchange("all_to_all_v", in.data(), sn, soff, out.data(), rn, roff);
    return out;
  }

  void all_to_all(std::span<const float> in, std::span<float> out) override {
    const int chunk = mpi_count(std::ssize(in) / size_, "all_to_all");
    const std::vector<int> n(static_cast<size_t>(size_), chunk);
    const std::vector<int> off = displacements(n, "all_to_all");
    exchange("all_to_all", in.data(), n, off, out.data(), n, off);
  }

  void ppermute(std::span<const float> in, std::span<float> out, const Perm& perm) override {
    // Sources and destinations are unique: this member sends to at most one and hears from at most one.
    int to = MPI_PROC_NULL, from = MPI_PROC_NULL;
    for (const auto& [src, dst] : perm) {
      if (src == r_) to = dst;
      if (dst == r_) from = src;
    }
    if (from == MPI_PROC_NULL) std::fill(out.begin(), out.end(), 0.0f);
    if (to == r_) {  // this member keeps its own data
      if (in.data() != out.data()) std::copy(in.begin(), in.end(), out.begin());
      return;
    }
    const int n = mpi_count(std::ssize(in), "ppermute");
    const float* send = in.data();
    if (to != MPI_PROC_NULL && from != MPI_PROC_NULL && overlaps(in.data(), in.size(), out.data(), out.size())) {
      staging_.assign(in.begin(), in.end());  // the send and the receive buffers must not alias
      send = staging_.data();
    }
    MPI_Request requests[2];  // receive, send (MPI_PROC_NULL: complete at once)
    check("ppermute", MPI_Irecv(out.data(), n, MPI_FLOAT, from, 0, comm_, &requests[0]));
    check("ppermute", MPI_Isend(send, n, MPI_FLOAT, to, 0, comm_, &requests[1]));
    finish("ppermute", requests);
  }

  void broadcast(std::span<float> x, int root) override {
    MPI_Request request;
    check("broadcast", MPI_Ibcast(x.data(), mpi_count(std::ssize(x), "broadcast"), MPI_FLOAT, root, comm_, &request));
    finish("broadcast", request);
  }

  void all_gather_bytes(std::span<const std::byte> in, std::span<std::byte> out, std::span<const int64_t> counts) override {
    const std::vector<int> n = int_counts(counts, "all_gather");
    const std::vector<int> off = displacements(n, "all_gather");
    gather("all_gather", in.data(), out.data(), n, off);
  }

  void broadcast_bytes(std::span<std::byte> x, int root) override {
    MPI_Request request;
    check("broadcast", MPI_Ibcast(x.data(), mpi_count(std::ssize(x), "broadcast"), MPI_BYTE, root, comm_, &request));
    finish("broadcast", request);
  }

  void barrier() override {
    MPI_Request request;
    check("barrier", MPI_Ibarrier(comm_, &request));
    finish("barrier", request);
  }

 private:
  void finish(const char* op, MPI_Request& request) { finish(op, std::span<MPI_Request>(&request, 1)); }

  // MPI_Alltoallv as point-to-point messages, all posted at once and polled by finish(): member
  // m gets send[soff[m], +sn[m]) and this member's piece from m lands at recv + roff[m]. Not
  // MPI_Ialltoallv: OpenMPI's non-blocking collectives (libnbc) took 1.3-1.6x its blocking ones
  // on the small messages of a decode step; these messages are what its blocking ones send for
  // a few processes. A pair's messages match in the order both post them (MPI's non-overtaking).
  template <class T>
  void exchange(const char* op, const T* send, const std::vector<int>& sn, const std::vector<int>& soff, T* recv,
                const std::vector<int>& rn, const std::vector<int>& roff) {
    const MPI_Datatype type = std::is_same_v<T, float> ? MPI_FLOAT : MPI_BYTE;
    const auto at = [](const std::vector<int>& v, int m) { return v[static_cast<size_t>(m)]; };
    requests_.clear();
    for (int m = 0; m < size_; ++m) {
      if (m == r_) continue;
      requests_.emplace_back();
      check(op, MPI_Irecv(recv + at(roff, m), at(rn, m), type, m, EXCHANGE_TAG, comm_, &requests_.back()));
    }
    for (int m = 0; m < size_; ++m) {
      if (m == r_) continue;
      requests_.emplace_back();
      check(op, MPI_Isend(send + at(soff, m), at(sn, m), type, m, EXCHANGE_TAG, comm_, &requests_.back()));
    }
    if (send + at(soff, r_) != recv + at(roff, r_)) std::copy_n(send + at(soff, r_), at(sn, r_), recv + at(roff, r_));
    finish(op, requests_);
  }

  // MPI_Allgatherv: this member's n[r] elements (floats or bytes) at `mine` to every other, member m's to out + off[m];
  // `mine` may be out + off[r] already (in place), else it is copied there while the messages go.
  template <class T>
  void gather(const char* op, const T* mine, T* out, const std::vector<int>& n, const std::vector<int>& off) {
    exchange(op, mine, std::vector<int>(n.size(), n[static_cast<size_t>(r_)]), std::vector<int>(n.size(), 0), out, n, off);
  }

  // Waits until `requests` complete. Throws CollectiveAborted when the run failed meanwhile, and
  // after the timeout an error naming the processes of this group that no longer answer.
  void finish(const char* op, std::span<MPI_Request> requests) {
    const Clock::time_point start = Clock::now();
    std::chrono::microseconds pause = FIRST_PAUSE;
    std::optional<int> round;  // of the roll call, once asked
    for (;;) {
      int done = 0;
      check(op, MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE));
      if (done) return;
      run_->check_not_failed();
      const Clock::duration waited = Clock::now() - start;
      if (waited < SPIN) continue;
      if (waited >= ANSWER_AFTER) run_->roll().serve();
      if (!round && waited >= run_->timeout() - ROLL_CALL) round = run_->roll().ask(peers());
      if (waited >= run_->timeout()) throw std::runtime_error(timed_out(op, run_->roll().silent(peers(), *round)));
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, MAX_PAUSE);
    }
  }

  // The other processes of this group.
  std::vector<int> peers() const {
    std::vector<int> out;
    for (int m = 0; m < size_; ++m)
      if (m != r_) out.push_back(processes_[static_cast<size_t>(m)]);
    return out;
  }

  std::string timed_out(const char* op, const std::vector<int>& silent) const {
    const std::string seconds = std::to_string(static_cast<int>(std::lround(run_->timeout().count())));
    const std::string here = "device " + std::to_string(device_) + " in " + op;
    if (silent.empty())
      return "mpi: timed out after " + seconds + " s: " + here + ", though every process of its group answers (" +
             "they wait in other collectives: the ranks ran different ones)";
    std::string names;
    for (int p : silent) names += (names.empty() ? "" : ", ") + run_->process_name(p);
    return "mpi: timed out after " + seconds + " s: " + here + " got nothing from " + names +
           " (stuck or unreachable; raise TPCLI_TIMEOUT if it is only slow)";
  }

  void check(const char* op, int code) const {
    if (code == MPI_SUCCESS) return;
    throw std::runtime_error("mpi: " + std::string(op) + " failed on device " + std::to_string(device_) +
                             " (member " + std::to_string(r_) + " of " + std::to_string(size_) +
                             "): " + mpi_error_text(code));
  }

  MPI_Comm comm_;
  int device_;  // mesh rank of this member (for messages)
  std::shared_ptr<MpiRun> run_;
  std::vector<int> processes_;  // [size] the MPI process of each rank of comm_
  int r_ = 0;
  int size_ = 1;
  std::vector<float> staging_;  // a copy where MPI needs unaliased buffers
  std::vector<MPI_Request> requests_;  // exchange()'s, reused
  static constexpr int EXCHANGE_TAG = 1;
};

// A group with several devices in this process and members in other processes (the world of
// `mpirun -n 2` over a 2x2 mesh): the reductions, broadcast and barrier go in three steps, over the
// thread backend inside the process, MPI between the processes' leaders (each process's lowest
// member), and the thread backend again. The sum is then (local sums) summed across processes: the
// tree of distributed/tree_reduce.h when both counts are powers of two, else equal to it within
// rounding. The other collectives are built on that all_sum
// (exact, see below).
class MixedCommunicator : public Communicator {
 public:
  MixedCommunicator(int index, int size, std::shared_ptr<Communicator> local, int leader_in_local,
                    std::unique_ptr<MpiCommunicator> leaders, std::vector<int> process_of_member, int device)
      : r_(index), size_(size), local_(std::move(local)), leader_(leader_in_local), leaders_(std::move(leaders)),
        process_of_member_(std::move(process_of_member)), device_(device) {}

  int rank() const override { return r_; }
  int size() const override { return size_; }

  void all_sum(std::span<float> x) override {
    if (local_) local_->all_sum(x);
    if (leaders_) leaders_->all_sum(x);
    if (local_) local_->broadcast(x, leader_);
  }
  void all_max(std::span<float> x) override {
    if (local_) local_->all_max(x);
    if (leaders_) leaders_->all_max(x);
    if (local_) local_->broadcast(x, leader_);
  }
  void broadcast(std::span<float> x, int root) override {
    const int root_process = process_of_member_[static_cast<size_t>(root)];
    if (local_ && root_process == here_process()) local_->broadcast(x, local_index_of(root));  // the leader has it now
    if (leaders_) leaders_->broadcast(x, root_process);
    if (local_) local_->broadcast(x, leader_);
  }
  void broadcast_bytes(std::span<std::byte> x, int root) override {
    const int root_process = process_of_member_[static_cast<size_t>(root)];
    if (local_ && root_process == here_process()) local_->broadcast_bytes(x, local_index_of(root));
    if (leaders_) leaders_->broadcast_bytes(x, root_process);
    if (local_) local_->broadcast_bytes(x, leader_);
  }
  // Bytes in three steps, as the reductions: each process's members (consecutive in member order)
  // gather theirs, the leaders gather the processes' blocks, the leader gives every local member
  // the whole.
  void all_gather_bytes(std::span<const std::byte> in, std::span<std::byte> out, std::span<const int64_t> counts) override {
    std::vector<int64_t> local_counts, process_bytes;  // this process's members; every process's block
    int64_t local_at = 0;
    for (int m = 0; m < size_; ++m) {
      const int p = process_of_member_[static_cast<size_t>(m)];
      if (m == 0 || p != process_of_member_[static_cast<size_t>(m - 1)]) process_bytes.push_back(0);
      process_bytes.back() += counts[static_cast<size_t>(m)];
      if (p == here_process()) local_counts.push_back(counts[static_cast<size_t>(m)]);
      else if (local_counts.empty()) local_at += counts[static_cast<size_t>(m)];
    }
    const std::span<std::byte> block = out.subspan(static_cast<size_t>(local_at), static_cast<size_t>(process_bytes[static_cast<size_t>(here_process())]));
    if (local_) {
      local_->all_gather_bytes(in, block, local_counts);
    } else if (!in.empty()) {
      std::memcpy(block.data(), in.data(), in.size());
    }
    if (leaders_) {
      const std::vector<std::byte> mine(block.begin(), block.end());  // the byte gather takes disjoint buffers
      leaders_->all_gather_bytes(mine, out, process_bytes);
    }
    if (local_) local_->broadcast_bytes(out, leader_);
  }
  void barrier() override {
    if (local_) local_->barrier();
    if (leaders_) leaders_->barrier();
    if (local_) local_->barrier();
  }

  // The data-moving collectives, as one all_sum of a zero-filled buffer in which each member writes
  // its part where the result wants it: every element then has exactly one non-zero term, so the
  // result is exact (bit for bit the data sent). It moves S times the bytes of a direct algorithm:
  // correct on any mixed group, fast only with one device per process.
  void all_gather_v(std::span<const float> in, std::span<float> out, std::span<const int64_t> counts) override {
    std::fill(out.begin(), out.end(), 0.0f);
    std::copy(in.begin(), in.end(), out.begin() + offset_of(counts, r_));
    all_sum(out);
  }
  void reduce_scatter_v(std::span<const float> in, std::span<float> out, std::span<const int64_t> counts) override {
    std::vector<float> sum(in.begin(), in.end());
    all_sum(sum);
    const auto from = sum.begin() + offset_of(counts, r_);
    std::copy(from, from + counts[static_cast<size_t>(r_)], out.begin());
  }
  std::vector<float> all_to_all_v(std::span<const float> in, std::span<const int64_t> send_counts,
                                  std::vector<int64_t>& recv_counts) override {
    const size_t S = static_cast<size_t>(size_);
    // counts[i * S + j]: floats member i sends member j (every member's row, gathered as int64).
    std::vector<int64_t> counts(S * S, 0);
    all_gather_bytes(std::as_bytes(send_counts), std::as_writable_bytes(std::span<int64_t>(counts)),
                     std::vector<int64_t>(S, static_cast<int64_t>(send_counts.size_bytes())));
    // The buffer holds, for each destination j in turn, what every source i sends it, i ascending.
    std::vector<int64_t> start(S * S + 1, 0);
    for (size_t j = 0, k = 0; j < S; ++j)
      for (size_t i = 0; i < S; ++i, ++k) start[k + 1] = start[k] + counts[i * S + j];
    std::vector<float> buffer(static_cast<size_t>(start.back()), 0.0f);
    int64_t read = 0;
    for (size_t j = 0; j < S; ++j) {
      std::copy(in.begin() + read, in.begin() + read + send_counts[j], buffer.begin() + start[j * S + static_cast<size_t>(r_)]);
      read += send_counts[j];
    }
    all_sum(buffer);
    const size_t me = static_cast<size_t>(r_);
    recv_counts.assign(S, 0);
    for (size_t i = 0; i < S; ++i) recv_counts[i] = counts[i * S + me];
    return {buffer.begin() + start[me * S], buffer.begin() + start[(me + 1) * S]};
  }
  void ppermute(std::span<const float> in, std::span<float> out, const Perm& perm) override {
    // Slot d of the buffer: what member d receives; a member nobody sends to receives zeros.
    const size_t n = in.size();
    std::vector<float> slots(n * static_cast<size_t>(size_), 0.0f);
    for (const auto& [source, destination] : perm)
      if (source == r_) std::copy(in.begin(), in.end(), slots.begin() + static_cast<int64_t>(n) * destination);
    all_sum(slots);
    const auto mine = slots.begin() + static_cast<int64_t>(n) * r_;
    std::copy(mine, mine + static_cast<int64_t>(n), out.begin());
  }

 private:
  int here_process() const { return process_of_member_[static_cast<size_t>(r_)]; }
  // Position of group member m among the members of this process.
  int local_index_of(int m) const {
    int index = 0;
    for (int k = 0; k < m; ++k) index += process_of_member_[static_cast<size_t>(k)] == here_process();
    return index;
  }
  static int64_t offset_of(std::span<const int64_t> counts, int member) {
    int64_t offset = 0;
    for (int k = 0; k < member; ++k) offset += counts[static_cast<size_t>(k)];
    return offset;
  }

  int r_, size_;
  std::shared_ptr<Communicator> local_;  // this process's members (thread backend); null when only this one
  int leader_;                           // index of the leader in local_
  std::unique_ptr<MpiCommunicator> leaders_;  // the leaders of every process; null on non-leaders
  std::vector<int> process_of_member_;   // [size] process rank (in leaders_' order) of each member
  int device_;
};

class MpiBackend : public Backend {
 public:
  MpiBackend(int mesh_devices, int devices_per_process, double timeout_s)
      : K_(devices_per_process), local_(mesh_devices) {
    // A private copy of the world, so tpcli's traffic never meets anyone else's; errors are returned
    // (and become exceptions naming the op) instead of MPI's default of aborting without a word.
    check_setup("MPI_Comm_dup", MPI_Comm_dup(MPI_COMM_WORLD, &world_));
    check_setup("MPI_Comm_set_errhandler", MPI_Comm_set_errhandler(world_, MPI_ERRORS_RETURN));
    run_ = std::make_shared<MpiRun>(world_, timeout_s, K_);
  }
  ~MpiBackend() override {
    run_.reset();
    MPI_Comm_free(&world_);
  }

  std::shared_ptr<Communicator> communicator(int rank, const std::vector<int>& members) override {
    const int here = mpi_process().rank;
    std::set<int> processes;
    for (int m : members) processes.insert(m / K_);
    if (processes.size() == 1 && *processes.begin() == here) return local_.communicator(rank, members);
    std::vector<int> process_ranks(processes.begin(), processes.end());  // ascending, as the members
    if (processes.size() != members.size()) return mixed(rank, members, process_ranks);
    return std::make_shared<MpiCommunicator>(communicator_over(process_ranks, members), rank, run_, process_ranks);
  }

  // A device that returned can no longer release a local peer waiting for it in a thread group: the
  // thread backends fail such waits instead of hanging. (Across processes, a rank that has returned
  // while others wait is mpirun's to notice.)
  void device_finished(int rank) override {
    local_.device_finished(rank);
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [members, fabric] : mixed_local_) fabric->device_finished(rank);
  }

  // The other processes may be waiting in a collective for this one: the job ends, loudly. Not at
  // once: this process's waits end (CollectiveAborted) and the command gets ABORT_GRACE to answer
  // (a server's clients get their 500 naming the stuck rank) and to end the job itself (main's
  // mpi_abort_job, or MPI_Abort at exit); a process still running then is ended here.
  void abort(int failed_rank, const std::string& message) override {
    if (!run_->fail(message)) return;  // the first failure speaks
    job_failed = true;
    std::fprintf(stderr, "mpi: process %d (device %d) failed: %s\n", mpi_process().rank, failed_rank, message.c_str());
    std::fflush(stderr);
    local_.abort(failed_rank, message);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& [members, fabric] : mixed_local_) fabric->abort(failed_rank, message);
    }
    std::thread([] {
      std::this_thread::sleep_for(ABORT_GRACE);
      MPI_Abort(MPI_COMM_WORLD, 1);
      std::_Exit(1);
    }).detach();
  }

 private:
  // A group with several devices here and members elsewhere (see MixedCommunicator).
  std::shared_ptr<Communicator> mixed(int rank, const std::vector<int>& members, const std::vector<int>& process_ranks) {
    const int here = mpi_process().rank;
    std::vector<int> local, process_of_member;  // local: this process's members, ascending
    for (int m : members) {
      if (m / K_ == here) local.push_back(m);
      process_of_member.push_back(static_cast<int>(
          std::lower_bound(process_ranks.begin(), process_ranks.end(), m / K_) - process_ranks.begin()));
    }
    ThreadBackend* fabric = nullptr;  // one per mixed group, so its local part never shares state with
    {                                 // a thread group of the same members (counters are per communicator)
      std::lock_guard<std::mutex> lock(mutex_);
      auto& entry = mixed_local_[members];
      if (!entry) entry = std::make_unique<ThreadBackend>(K_ * mpi_process().size);
      fabric = entry.get();
    }
    std::shared_ptr<Communicator> local_comm = local.size() > 1 ? fabric->communicator(rank, local) : nullptr;
    std::unique_ptr<MpiCommunicator> leaders;
    if (rank == local.front())
      leaders = std::make_unique<MpiCommunicator>(communicator_over(process_ranks, members), rank, run_, process_ranks);
    return std::make_shared<MixedCommunicator>(
        static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin()),
        static_cast<int>(members.size()), std::move(local_comm), 0, std::move(leaders), std::move(process_of_member), rank);
  }

  // An MPI communicator over `process_ranks` (ascending), made by one caller in each of them.
  MPI_Comm communicator_over(const std::vector<int>& process_ranks, const std::vector<int>& members) {
    MPI_Group world_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
    MPI_Comm_group(world_, &world_group);
    MPI_Group_incl(world_group, static_cast<int>(process_ranks.size()), process_ranks.data(), &group);
    MPI_Comm comm = MPI_COMM_NULL;
    // Threads of one process may create communicators over the same processes at once (K > 1):
    // the tag, the same on every member, keeps the creations apart.
    const int code = MPI_Comm_create_group(world_, group, tag_of(members), &comm);
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    check_setup("MPI_Comm_create_group", code);
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    return comm;
  }

  static int tag_of(const std::vector<int>& members) {
    uint32_t h = 2166136261u;
    for (int m : members) h = (h ^ static_cast<uint32_t>(m)) * 16777619u;
    return static_cast<int>(h & 0x7fff);  // MPI guarantees tags up to 32767
  }
  static void check_setup(const char* call, int code) {
    if (code != MPI_SUCCESS)
      throw std::runtime_error("mpi: " + std::string(call) + " failed on process " +
                               std::to_string(mpi_process().rank) + ": " + mpi_error_text(code));
  }

  int K_;               // devices per process
  ThreadBackend local_;  // groups inside this process
  MPI_Comm world_ = MPI_COMM_NULL;
  std::shared_ptr<MpiRun> run_;  // shared with every communicator made
  std::mutex mutex_;     // guards mixed_local_
  std::map<std::vector<int>, std::unique_ptr<ThreadBackend>> mixed_local_;  // by the mixed group's members
};

// TPCLI_TIMEOUT, seconds a collective waits for its peers: the variable `tpcli launch --timeout`
// sets for zmq ranks, read alike under mpirun.
double collective_timeout_s() {
  const char* text = std::getenv("TPCLI_TIMEOUT");
  if (!text || !*text) return DEFAULT_TIMEOUT_S;
  char* end = nullptr;
  const long seconds = std::strtol(text, &end, 10);
  if (*end != '\0' || seconds < 1 || seconds > 86400)
    throw std::invalid_argument(std::string("mpi backend: TPCLI_TIMEOUT=") + text + " must be a whole number of seconds, 1 to 86400");
  return static_cast<double>(seconds);
}

}  // namespace

bool mpi_available() { return true; }
int mpi_process_rank() { return mpi_process().rank; }
int mpi_process_count() { return mpi_process().size; }

void mpi_abort_job(int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
}

void use_mpi_backend(RunOptions& options, int mesh_devices) {
  const int P = mpi_process_count(), here = mpi_process_rank();
  if (mesh_devices % P != 0)
    throw std::invalid_argument("mpi backend: the mesh has " + std::to_string(mesh_devices) + " devices but mpirun started " +
                                std::to_string(P) + " processes (the devices must split evenly over the processes)");
  const int K = mesh_devices / P;
  const double timeout_s = collective_timeout_s();
  options.local_ranks.clear();
  for (int d = 0; d < K; ++d) options.local_ranks.push_back(here * K + d);
  options.make_backend = [K, timeout_s](const Mesh& mesh) -> std::unique_ptr<Backend> {
    return std::make_unique<MpiBackend>(mesh.size(), K, timeout_s);
  };
}

}  // namespace tpcli::dist

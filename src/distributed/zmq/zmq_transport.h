// tpcli::dist — the ZeroMQ transport under the zmq backend: one per process and run.
//
// Every process binds one PULL socket (its inbox) and connects one PUSH socket to every other
// process's inbox. Start-up goes through a coordinator that rank 0 binds at TPCLI_COORDINATOR:
// each rank sends HELLO (rank, world size, devices per process, version, binary hash, config hash,
// inbox address, job token: distributed/zmq_wire.h); rank 0 refuses hellos of other jobs, checks the
// rest and answers with the table of inbox addresses, or with an error naming the offending rank.
//
// Messages are point-to-point between mesh ranks, tagged (communicator, call, phase, source,
// destination). Large ones travel in chunks of CHUNK_BYTES, so the receiver reduces chunk i while
// chunk i+1 is on the wire. A message between two devices of the same process never touches a
// socket: it is copied into the destination's mailbox.
//
// Processes on one host (same host identity, see distributed/shm_rings.h) move data through
// shared-memory rings instead of sockets: the sender copies into the ring, the receiver reduces or
// copies straight out of it. After the table, every pair agrees on this with an ATTACH message
// (both must have mapped the other's segment). A send the ring cannot take yet stays queued,
// pointing at the caller's data, until flush(): collectives flush before returning.
//
// Receiving: messages from a ring are taken by the waiting thread itself. Socket traffic is read by
// one waiting thread at a time, which files it into mailboxes; the others wait (on a condition
// variable, or on the shared doorbell when every peer uses rings). A wait fails
// (CollectiveAborted) when the run is aborted (locally or by an ABORT from a peer), when a peer
// process's connection drops without its BYE, or after `timeout` without the expected message; the
// error names the rank.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "distributed/zmq/shm_rings.h"
#include "distributed/zmq/zmq_config.h"
#include "distributed/zmq/zmq_wire.h"

namespace tpcli::dist {

struct MessageKey {
  uint64_t comm = 0;  // communicator id
  uint64_t seq = 0;   // call number within the communicator * PHASES + phase
  int32_t src = 0;    // mesh ranks
  int32_t dst = 0;
  auto operator<=>(const MessageKey&) const = default;
};

class ZmqTransport {
 public:
  static constexpr size_t CHUNK_BYTES = size_t{1} << 20;

  // Binds, meets the other ranks through the coordinator, connects. Throws on any start-up error.
  ZmqTransport(const ZmqConfig& config, int mesh_size);
  ~ZmqTransport();
  ZmqTransport(const ZmqTransport&) = delete;
  ZmqTransport& operator=(const ZmqTransport&) = delete;

  int process_of(int mesh_rank) const { return mesh_rank / config_.devices_per_process; }
  bool is_local(int mesh_rank) const { return process_of(mesh_rank) == config_.rank; }
  const ZmqConfig& config() const { return config_; }

  // Sends data (floats) from key.src to key.dst. Never blocks on the receiver. Until flush(), data
  // must stay unchanged (a ring send may still read it).
  void send(const MessageKey& key, std::span<const float> data);
  // Returns once every send by mesh rank `device` has left the caller's memory. `what` names the
  // collective.
  void flush(const char* what, int device);
  // True when messages to (and from) `process` go through shared memory.
  bool uses_shared_memory(int process) const { return static_cast<bool>(peer_segments_[static_cast<size_t>(process)]); }
  // Receives the message `key`, chunk by chunk: visit(total, offset, chunk) in order, where total is
  // the message's length in floats. Returns total. `what` names the collective for errors.
  using Visitor = std::function<void(int64_t total, int64_t offset, std::span<const float> chunk)>;
  int64_t receive(const MessageKey& key, const char* what, const Visitor& visit);

  // A local device returned from its body: waits for its messages can no longer succeed.
  void device_finished(int mesh_rank);
  // Fails every present and future wait with `message` (the first one wins); tells the peers.
  void abort(const std::string& message, bool tell_peers = true);

 private:
  struct Chunk {
    int64_t total = 0;   // floats in the whole message
    int64_t offset = 0;  // of this chunk
    zmq::message_t payload;
  };
  using Clock = std::chrono::steady_clock;

  struct PendingSend {  // a ring send waiting for space; points at the caller's data
    MessageKey key;
    const float* data = nullptr;
    int64_t total = 0;
    int64_t sent = 0;  // floats written so far
  };
  enum class Took { Nothing, Other, Mine };  // what one look at a mailbox or ring found

  void bind_inbox();
  std::vector<std::string> coordinate(const std::string& my_hello);
  std::vector<std::string> ask_coordinator(const std::string& my_hello);
  void connect_peers(const std::vector<std::string>& table);
  void attach_shared_memory(const std::vector<std::string>& table);
  void poll_once(std::chrono::milliseconds wait);                    // called without mutex_
  void file_message(std::vector<zmq::message_t>& frames);           // called with mutex_
  void check_wait(const MessageKey& key, const char* what, Clock::time_point since);  // with mutex_
  void check_flush(int process, const char* what, Clock::time_point since);          // with mutex_
  [[noreturn]] void fail_run(const std::string& error);                              // with mutex_
  std::string lost_peer(const std::string& when) const;                              // with mutex_
  std::optional<Chunk> pop(const MessageKey& key);                  // with mutex_
  Took take_from_mailbox(const MessageKey& key, const Visitor& visit, int64_t& total, int64_t& got);
  Took take_from_ring(int process, const MessageKey& key, const Visitor& visit, int64_t& total, int64_t& got);
  void file_ring_record(int process, const RingRecord& h, std::span<const float> payload);  // with ring lock
  void drain_rings();
  bool write_pending(int process);                                  // with send_mutex_
  int progress_sends();                                             // processes still waiting
  bool wait_for_traffic(uint32_t bell);
  void read_sockets(std::chrono::milliseconds wait);
  void wake_local_waiters();
  void send_control(uint32_t kind, const std::string& text);
  std::string process_name(int process) const;

  ZmqConfig config_;
  int mesh_size_;
  zmq::context_t context_;
  zmq::socket_t inbox_;                          // PULL, bound
  std::string inbox_address_;
  std::vector<zmq::socket_t> peers_;             // PUSH to process p's inbox (empty for self)
  std::vector<zmq::socket_t> monitors_;          // PAIR receiving disconnect events of peers_[p]
  std::mutex send_mutex_;                        // guards peers_ (sockets are not thread-safe) and pending_

  ShmSegment own_segment_;                       // rings into this process (empty: no shared memory)
  std::vector<ShmSegment> peer_segments_;        // by process: its segment, where we write our ring;
                                                 // empty unless both sides mapped each other's
  bool all_shared_ = false;                      // every other process is on a ring (no socket data)
  int spin_ = 0;                                 // doorbell polls before sleeping
  std::unique_ptr<std::mutex[]> ring_mutex_;     // by process: one consumer per inbound ring
  std::vector<std::deque<PendingSend>> pending_; // by process: ring sends waiting for space
  std::atomic<bool> aborted_{false};             // mirrors abort_message_, read without mutex_
  std::atomic<Clock::rep> last_socket_read_{0};  // when a doorbell waiter last read the sockets (ticks)

  std::mutex mutex_;                             // guards everything below
  std::condition_variable arrived_;
  bool polling_ = false;                         // one thread polls the sockets at a time
  std::map<MessageKey, std::deque<Chunk>> mailbox_;
  std::optional<std::string> abort_message_;
  std::vector<char> said_bye_;                   // by process
  std::vector<char> finished_;                   // by mesh rank: local devices that returned
  std::vector<std::optional<Clock::time_point>> dropped_;  // by process: connection closed at
  std::vector<int> attach_answer_;               // by process: its ATTACH (-1 not yet, 0 no, 1 yes)
};

}  // namespace tpcli::dist

// tpcli::dist — ZeroMQ transport: start-up through the coordinator, mailboxes, failure detection.
//
// Wire format of one chunk: two frames, a WireHeader and the payload (floats, or text for ABORT).
#include "distributed/zmq/zmq_transport.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <unistd.h>

#include <thread>

#include <climits>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "distributed/group.h"

namespace tpcli::dist {

namespace {

using Kind = WireKind;
constexpr uint32_t MAGIC = WIRE_MAGIC;

constexpr auto POLL_SLICE = std::chrono::milliseconds(20);
constexpr auto DROP_GRACE = std::chrono::milliseconds(500);  // a BYE may still be on its way

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error("zmq: " + what); }

// Identifies the executable by content, so copies of one build on several hosts agree.
uint64_t binary_hash() {
  static const uint64_t hash = [] {
    std::ifstream f("/proc/self/exe", std::ios::binary);
    std::vector<char> buf(size_t{1} << 20);
    uint64_t h = fnv1a("");
    while (f.read(buf.data(), static_cast<std::streamsize>(buf.size())) || f.gcount() > 0)
      h = fnv1a(std::string_view(buf.data(), static_cast<size_t>(f.gcount())), h);
    return h;
  }();
  return hash;
}

std::string hex(uint64_t x) {
  std::ostringstream s;
  s << std::hex << x;
  return s.str();
}

// A hello from the network, or a one-line error: decode() refuses anything malformed.
Hello decode_hello(const std::string& text) {
  std::optional<Hello> h = Hello::decode(text);
  if (!h) fail("malformed hello from a peer: '" + text.substr(0, 200) + "' (is this a tpcli rank?)");
  return *h;
}

// Field i of a table entry (0 inbox, 1 host, 2 rings).
std::string entry_field(const std::string& entry, int i) {
  size_t start = 0;
  for (; i > 0; --i) start = entry.find('|', start) + 1;
  return entry.substr(start, entry.find('|', start) - start);
}

// The first difference between a joining rank and rank 0, as a one-line error; empty if none.
std::string mismatch(const Hello& h, const Hello& root) {
  const std::string r = "rank " + std::to_string(h.rank);
  if (h.world != root.world)
    return r + " was started with TPCLI_WORLD_SIZE=" + std::to_string(h.world) + " but rank 0 with " +
           std::to_string(root.world) + " (wrong rank count)";
  if (h.rank < 1 || h.rank >= root.world) return r + " is outside the world of " + std::to_string(root.world);
  if (h.version != root.version || h.binary != root.binary)
    return r + " runs tpcli " + h.version + " (build " + h.binary + ") but rank 0 runs " + root.version + " (build " +
           root.binary + "): every host needs the same binary";
  if (h.devices_per_process != root.devices_per_process)
    return r + " has " + std::to_string(h.devices_per_process) + " devices per process but rank 0 has " +
           std::to_string(root.devices_per_process);
  if (h.mesh_size != root.mesh_size)
    return r + " runs a mesh of " + std::to_string(h.mesh_size) + " devices but rank 0 of " +
           std::to_string(root.mesh_size);
  if (h.config != root.config)
    return r + " has config hash " + h.config + " but rank 0 has " + root.config + ": every rank must run the same command";
  return {};
}

// zmq::poll, where a signal arriving during the wait counts as "nothing yet": callers loop against
// their own deadline, and a signal (Ctrl-C, SIGTERM from the launcher) is the command's to handle.
void poll_through_signals(zmq::pollitem_t* items, size_t count, std::chrono::milliseconds wait) {
  try {
    zmq::poll(items, count, wait);
  } catch (const zmq::error_t& e) {
    if (e.num() != EINTR) throw;
    for (size_t i = 0; i < count; ++i) items[i].revents = 0;
  }
}

std::string frame_text(const zmq::message_t& m) { return std::string(static_cast<const char*>(m.data()), m.size()); }

}  // namespace

#if defined(__SANITIZE_THREAD__)
// libzmq is not instrumented: its threads hand buffers over through atomics ThreadSanitizer cannot
// see, so memcpy/malloc calls made inside it look like races. Our own code stays checked.
extern "C" const char* __tsan_default_suppressions() { return "called_from_lib:libzmq.so\nrace:libzmq.so\n"; }
#endif

// ---- start-up ----

ZmqTransport::ZmqTransport(const ZmqConfig& config, int mesh_size)
    : config_(config), mesh_size_(mesh_size), context_(1), inbox_(context_, zmq::socket_type::pull) {
  const int P = config_.world_size, K = config_.devices_per_process;
  if (mesh_size != P * K)
    fail("the mesh has " + std::to_string(mesh_size) + " devices but the run has " + std::to_string(P) +
         " processes x " + std::to_string(K) + " devices per process = " + std::to_string(P * K) +
         " (wrong rank count: launch with -n " + std::to_string(mesh_size / K) + ")");
  said_bye_.assign(static_cast<size_t>(P), 0);
  finished_.assign(static_cast<size_t>(mesh_size), 0);
  dropped_.assign(static_cast<size_t>(P), std::nullopt);
  bind_inbox();
  Hello me{config_.rank, P, K, mesh_size, TPCLI_VERSION, hex(binary_hash()), hex(config_.config_hash), inbox_address_};
  me.job = config_.job;
  if (config_.shared_memory && P > 1) {
    try {
      own_segment_ = ShmSegment::create(P);
      me.host = hex(fnv1a(host_identity()));
      me.rings = own_segment_.descriptor();
    } catch (const std::exception&) {
      // No shared memory here: every byte goes over the sockets.
    }
  }
  const std::vector<std::string> table = config_.rank == 0 ? coordinate(me.encode()) : ask_coordinator(me.encode());
  connect_peers(table);
  attach_shared_memory(table);
}

void ZmqTransport::bind_inbox() {
  inbox_.set(zmq::sockopt::rcvhwm, 0);
  inbox_.set(zmq::sockopt::linger, 0);
  std::string address = config_.transport == "ipc"
                            ? "ipc://@tpcli-" + std::to_string(getpid()) + "-" + hex(reinterpret_cast<uintptr_t>(this))
                            : "tcp://" + config_.host + ":*";
  try {
    inbox_.bind(address);
  } catch (const zmq::error_t& e) {
    fail("rank " + std::to_string(config_.rank) + " cannot bind its inbox at " + address + ": " + e.what());
  }
  inbox_address_ = inbox_.get(zmq::sockopt::last_endpoint);
}

// Rank 0: bind the coordinator, collect every rank's hello, check, answer with the inbox table.
std::vector<std::string> ZmqTransport::coordinate(const std::string& my_hello) {
  const Hello root = decode_hello(my_hello);
  zmq::socket_t router(context_, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 1000);
  try {
    router.bind(config_.coordinator);
  } catch (const zmq::error_t& e) {
    fail("rank 0 cannot bind the coordinator at " + config_.coordinator + ": " + e.what() +
         (e.num() == EADDRINUSE ? " (port in use: choose another with --port)" : ""));
  }
  std::vector<std::string> table(static_cast<size_t>(config_.world_size));
  std::vector<std::string> identities(static_cast<size_t>(config_.world_size));
  table[0] = root.table_entry();
  int joined = 1;
  const auto deadline = Clock::now() + std::chrono::duration<double>(config_.timeout_s);
  std::string error;
  while (joined < config_.world_size && error.empty()) {
    zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
    poll_through_signals(&item, 1, POLL_SLICE);
    if (Clock::now() > deadline) {
      std::string missing;
      for (int r = 1; r < config_.world_size; ++r)
        if (table[static_cast<size_t>(r)].empty()) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      fail("rank(s) " + missing + " did not reach the coordinator at " + config_.coordinator + " within " +
           std::to_string(static_cast<int>(config_.timeout_s)) + " s (not started, or a wrong rank count)");
    }
    if (!(item.revents & ZMQ_POLLIN)) continue;
    std::vector<zmq::message_t> frames;
    (void)zmq::recv_multipart(router, std::back_inserter(frames));
    if (frames.size() != 2) continue;
    const std::string id = frame_text(frames[0]);
    const std::optional<Hello> joined_hello = Hello::decode(frame_text(frames[1]));
    // Not a rank of this job (a stray connection, or a rank of another launch on this port):
    // refuse it alone, and keep waiting for our own ranks.
    std::string foreign;
    if (!joined_hello) foreign = "malformed hello: not a tpcli rank of this version";
    else if (joined_hello->job != root.job)
      foreign = "rank " + std::to_string(joined_hello->rank) + " belongs to another launch (job " + joined_hello->job +
                ", this coordinator serves job " + root.job + ")";
    if (!foreign.empty()) {
      router.send(zmq::buffer(id), zmq::send_flags::sndmore);
      router.send(zmq::buffer("ERROR " + foreign));
      continue;
    }
    const Hello& h = *joined_hello;
    error = mismatch(h, root);
    if (error.empty() && !table[static_cast<size_t>(h.rank)].empty()) error = "rank " + std::to_string(h.rank) + " joined twice";
    if (!error.empty()) {  // tell the offender too, even if its rank is out of range
      router.send(zmq::buffer(id), zmq::send_flags::sndmore);
      router.send(zmq::buffer("ERROR " + error));
      break;
    }
    table[static_cast<size_t>(h.rank)] = h.table_entry();
    identities[static_cast<size_t>(h.rank)] = id;
    ++joined;
  }
  std::string answer = error.empty() ? "TABLE" : "ERROR " + error;
  if (error.empty())
    for (const std::string& a : table) answer += " " + a;
  for (int r = 1; r < config_.world_size; ++r) {
    const std::string& id = identities[static_cast<size_t>(r)];
    if (id.empty()) continue;
    router.send(zmq::buffer(id), zmq::send_flags::sndmore);
    router.send(zmq::buffer(answer));
  }
  if (!error.empty()) fail(error);
  return table;
}

// Ranks > 0: send the hello, wait for the table (or rank 0's error).
std::vector<std::string> ZmqTransport::ask_coordinator(const std::string& my_hello) {
  zmq::socket_t dealer(context_, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  try {
    dealer.connect(config_.coordinator);
  } catch (const zmq::error_t& e) {
    fail("rank " + std::to_string(config_.rank) + " cannot use the coordinator address " + config_.coordinator + ": " +
         e.what());
  }
  dealer.send(zmq::buffer(my_hello));
  zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
  const auto deadline = Clock::now() + std::chrono::duration<double>(config_.timeout_s);
  do {
    poll_through_signals(&item, 1, POLL_SLICE);
  } while (!(item.revents & ZMQ_POLLIN) && Clock::now() < deadline);
  if (!(item.revents & ZMQ_POLLIN))
    fail("rank " + std::to_string(config_.rank) + " got no answer from the coordinator at " + config_.coordinator +
         " within " + std::to_string(static_cast<int>(config_.timeout_s)) +
         " s (is rank 0 running and reachable? are all ranks started?)");
  zmq::message_t reply;
  (void)dealer.recv(reply);
  std::istringstream s(frame_text(reply));
  std::string tag;
  s >> tag;
  if (tag == "ERROR") {
    std::string rest;
    std::getline(s, rest);
    fail(rest.substr(rest.find_first_not_of(' ')) + " (reported by rank 0)");
  }
  std::vector<std::string> table;
  for (std::string a; s >> a;) table.push_back(a);
  if (tag != "TABLE" || static_cast<int>(table.size()) != config_.world_size)
    fail("malformed answer from the coordinator at " + config_.coordinator);
  return table;
}

void ZmqTransport::connect_peers(const std::vector<std::string>& table) {
  const int P = config_.world_size;
  peers_.resize(static_cast<size_t>(P));
  monitors_.resize(static_cast<size_t>(P));
  for (int p = 0; p < P; ++p) {
    if (p == config_.rank) continue;
    zmq::socket_t push(context_, zmq::socket_type::push);
    push.set(zmq::sockopt::sndhwm, 0);
    push.set(zmq::sockopt::linger, 1000);
    // Connection-closed events of this socket tell us that process p went away.
    const std::string monitor_address = "inproc://tpcli-monitor-" + std::to_string(p);
    if (zmq_socket_monitor(push.handle(), monitor_address.c_str(), ZMQ_EVENT_DISCONNECTED) != 0)
      fail("cannot monitor the connection to rank " + std::to_string(p) + ": " + zmq_strerror(zmq_errno()));
    zmq::socket_t monitor(context_, zmq::socket_type::pair);
    monitor.set(zmq::sockopt::linger, 0);
    monitor.connect(monitor_address);
    push.connect(entry_field(table[static_cast<size_t>(p)], 0));
    peers_[static_cast<size_t>(p)] = std::move(push);
    monitors_[static_cast<size_t>(p)] = std::move(monitor);
  }
}

// Maps the segments of peers on this host, tells every peer whether it did (ATTACH), and waits for
// theirs: a pair uses rings only when both sides mapped, so both agree without further talk.
void ZmqTransport::attach_shared_memory(const std::vector<std::string>& table) {
  const int P = config_.world_size, me = config_.rank;
  peer_segments_.resize(static_cast<size_t>(P));
  pending_.resize(static_cast<size_t>(P));
  ring_mutex_ = std::make_unique<std::mutex[]>(static_cast<size_t>(P));
  attach_answer_.assign(static_cast<size_t>(P), -1);
  if (P == 1) return;
  const std::string my_host = entry_field(table[static_cast<size_t>(me)], 1);
  int processes_here = 0;
  for (int p = 0; p < P; ++p) {
    const std::string& entry = table[static_cast<size_t>(p)];
    const bool same_host = own_segment_ && entry_field(entry, 1) == my_host && entry_field(entry, 2) != "-";
    processes_here += same_host;
    if (p == me) continue;
    if (same_host) {
      try {
        peer_segments_[static_cast<size_t>(p)] = ShmSegment::open(entry_field(entry, 2), P);
      } catch (const std::exception&) {
        // Not reachable after all (another user, a container boundary): sockets it is.
      }
    }
    std::lock_guard<std::mutex> lock(send_mutex_);
    const WireHeader h{MAGIC, static_cast<uint32_t>(Kind::ATTACH), 0, 0, me, 0, 0, 0};
    zmq::socket_t& socket = peers_[static_cast<size_t>(p)];
    socket.send(zmq::buffer(&h, sizeof h), zmq::send_flags::sndmore);
    socket.send(zmq::buffer(std::string(peer_segments_[static_cast<size_t>(p)] ? "1" : "0")));
  }
  const auto since = Clock::now();
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      bool all = true;
      for (int p = 0; p < P; ++p) all &= p == me || attach_answer_[static_cast<size_t>(p)] >= 0;
      if (all) break;
      for (int p = 0; p < P; ++p)
        if (p != me && attach_answer_[static_cast<size_t>(p)] < 0) check_flush(p, "start-up", since);
    }
    poll_once(POLL_SLICE);
  }
  all_shared_ = true;
  for (int p = 0; p < P; ++p) {
    if (p == me) continue;
    const size_t i = static_cast<size_t>(p);
    if (attach_answer_[i] != 1) peer_segments_[i] = ShmSegment();  // the peer could not map ours
    all_shared_ &= static_cast<bool>(peer_segments_[i]);
  }
  // Spinning pays only while every waiting device has a core of its own.
  const int devices_here = processes_here * config_.devices_per_process;
  spin_ = devices_here <= static_cast<int>(std::thread::hardware_concurrency()) ? 2000 : 0;
}

// ---- shut-down: BYE to every peer, wait for theirs (a final barrier), then close ----

ZmqTransport::~ZmqTransport() {
  bool clean;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    clean = !abort_message_;
  }
  if (clean) {
    try {
      send_control(static_cast<uint32_t>(Kind::BYE), "");
      const auto deadline = Clock::now() + std::chrono::duration<double>(config_.timeout_s);
      for (;;) {
        poll_once(POLL_SLICE);
        std::lock_guard<std::mutex> lock(mutex_);
        bool all = true;
        for (int p = 0; p < config_.world_size; ++p)
          all &= p == config_.rank || said_bye_[static_cast<size_t>(p)] || dropped_[static_cast<size_t>(p)].has_value();
        if (all || abort_message_ || Clock::now() > deadline) break;
      }
    } catch (const std::exception&) {
      clean = false;  // closing anyway
    }
  }
  for (size_t p = 0; p < peers_.size(); ++p) {
    if (!peers_[p]) continue;
    zmq_socket_monitor(peers_[p].handle(), nullptr, 0);
    if (!clean) peers_[p].set(zmq::sockopt::linger, 0);
    monitors_[p].close();
    peers_[p].close();
  }
  inbox_.close();
  context_.close();
}

// ---- messages ----

void ZmqTransport::send(const MessageKey& key, std::span<const float> data) {
  const int64_t total = static_cast<int64_t>(data.size());
  if (is_local(key.dst)) {  // same process: straight into the mailbox
    {
      std::lock_guard<std::mutex> lock(mutex_);
      mailbox_[key].push_back(Chunk{total, 0, zmq::message_t(data.data(), data.size_bytes())});
    }
    wake_local_waiters();
    return;
  }
  const int q = process_of(key.dst);
  std::lock_guard<std::mutex> lock(send_mutex_);
  if (uses_shared_memory(q)) {  // into q's ring now, or as soon as it has room
    pending_[static_cast<size_t>(q)].push_back(PendingSend{key, data.data(), total, 0});
    write_pending(q);
    return;
  }
  const int64_t per_chunk = static_cast<int64_t>(CHUNK_BYTES / sizeof(float));
  zmq::socket_t& socket = peers_[static_cast<size_t>(q)];
  int64_t offset = 0;
  do {
    const int64_t n = std::min(per_chunk, total - offset);
    WireHeader h{MAGIC, static_cast<uint32_t>(Kind::DATA), key.comm, key.seq, key.src, key.dst, total, offset};
    socket.send(zmq::buffer(&h, sizeof h), zmq::send_flags::sndmore);
    socket.send(zmq::const_buffer(data.data() + offset, static_cast<size_t>(n) * sizeof(float)), zmq::send_flags::none);
    offset += n;
  } while (offset < total);
}

// Writes queued sends to `process` while its ring has room (records of at most MAX_RECORD_FLOATS,
// a zero-length message as one empty record). True when none is left.
bool ZmqTransport::write_pending(int process) {
  std::deque<PendingSend>& queue = pending_[static_cast<size_t>(process)];
  if (aborted_.load(std::memory_order_acquire)) queue.clear();  // the callers' data may be gone
  ShmSegment& ring = peer_segments_[static_cast<size_t>(process)];
  while (!queue.empty()) {
    PendingSend& s = queue.front();
    const int64_t n = std::min(ShmSegment::MAX_RECORD_FLOATS, s.total - s.sent);
    const RingRecord h{s.key.comm, s.key.seq, s.key.src, s.key.dst, s.total, s.sent, n, 0};
    if (!ring.try_write(config_.rank, h, s.data + s.sent)) return false;
    ring.ring_bell();
    s.sent += n;
    if (s.sent >= s.total) queue.pop_front();
  }
  return true;
}

int ZmqTransport::progress_sends() {
  std::lock_guard<std::mutex> lock(send_mutex_);
  int waiting = 0;
  for (size_t q = 0; q < pending_.size(); ++q)
    if (!pending_[q].empty() && !write_pending(static_cast<int>(q))) ++waiting;
  return waiting;
}

void ZmqTransport::flush(const char* what, int device) {
  if (!own_segment_) return;  // socket sends copy the data at once
  auto since = Clock::now();
  int64_t left = INT64_MAX;  // floats of `device` still queued
  for (;;) {
    const uint32_t bell = own_segment_.bell();
    int blocked_on = -1;
    int64_t now_left = 0;
    {
      std::lock_guard<std::mutex> lock(send_mutex_);
      for (size_t q = 0; q < pending_.size(); ++q) {
        if (pending_[q].empty() || write_pending(static_cast<int>(q))) continue;
        for (const PendingSend& s : pending_[q]) {
          if (s.key.src != device) continue;
          now_left += s.total - s.sent;
          blocked_on = static_cast<int>(q);
        }
      }
    }
    if (blocked_on < 0) return;
    if (now_left < left) since = Clock::now();
    left = now_left;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      check_flush(blocked_on, what, since);
    }
    // Collectives flush only once their receivers are sure to take what they sent, so this wait
    // ends by itself. Should it not (nothing moved for a whole wait), empty our rings into the
    // mailboxes in case a peer waits for room in them: slower, but it cannot hang.
    if (!wait_for_traffic(bell)) drain_rings();
  }
}

void ZmqTransport::send_control(uint32_t kind, const std::string& text) {
  std::lock_guard<std::mutex> lock(send_mutex_);
  WireHeader h{MAGIC, kind, 0, 0, config_.rank, 0, 0, 0};
  for (auto& socket : peers_) {
    if (!socket) continue;
    socket.send(zmq::buffer(&h, sizeof h), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    socket.send(zmq::buffer(text), zmq::send_flags::dontwait);
  }
}

int64_t ZmqTransport::receive(const MessageKey& key, const char* what, const Visitor& visit) {
  const int src = process_of(key.src);
  const bool from_ring = src != config_.rank && uses_shared_memory(src);
  int64_t got = 0, total = -1;
  auto since = Clock::now();
  while (total < 0 || got < total) {
    const uint32_t bell = own_segment_ ? own_segment_.bell() : 0;  // before looking: no lost wake-up
    const Took took = from_ring ? take_from_ring(src, key, visit, total, got) : take_from_mailbox(key, visit, total, got);
    if (took == Took::Mine) since = Clock::now();
    if (took != Took::Nothing) continue;
    progress_sends();  // the peer we wait for may itself wait for room in its ring
    {
      std::lock_guard<std::mutex> lock(mutex_);
      check_wait(key, what, since);
    }
    wait_for_traffic(bell);
  }
  return total;
}

ZmqTransport::Took ZmqTransport::take_from_mailbox(const MessageKey& key, const Visitor& visit, int64_t& total,
                                                   int64_t& got) {
  std::optional<Chunk> chunk;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    chunk = pop(key);
  }
  if (!chunk) return Took::Nothing;
  const int64_t n = static_cast<int64_t>(chunk->payload.size() / sizeof(float));
  visit(chunk->total, chunk->offset, std::span<const float>(chunk->payload.data<float>(), static_cast<size_t>(n)));
  total = chunk->total;
  got += n;
  return Took::Mine;
}

// The record at the head of `process`'s ring: ours is visited in place; another device's is moved
// to the mailbox so the ring keeps flowing.
ZmqTransport::Took ZmqTransport::take_from_ring(int process, const MessageKey& key, const Visitor& visit,
                                                int64_t& total, int64_t& got) {
  std::lock_guard<std::mutex> ring_lock(ring_mutex_[static_cast<size_t>(process)]);
  // The mailbox first: what another thread moved there from this ring is older than the ring's head.
  if (take_from_mailbox(key, visit, total, got) == Took::Mine) return Took::Mine;
  RingRecord h;
  std::span<const float> payload;
  if (!own_segment_.peek(process, h, payload)) return Took::Nothing;
  if (MessageKey{h.comm, h.seq, h.src, h.dst} != key) {
    file_ring_record(process, h, payload);
    return Took::Other;
  }
  visit(h.total, h.offset, payload);
  own_segment_.consume(process, h);
  peer_segments_[static_cast<size_t>(process)].ring_bell();  // its sends may wait for this room
  total = h.total;
  got += h.floats;
  return Took::Mine;
}

void ZmqTransport::file_ring_record(int process, const RingRecord& h, std::span<const float> payload) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    mailbox_[MessageKey{h.comm, h.seq, h.src, h.dst}].push_back(
        Chunk{h.total, h.offset, zmq::message_t(payload.data(), payload.size_bytes())});
  }
  own_segment_.consume(process, h);
  peer_segments_[static_cast<size_t>(process)].ring_bell();
  wake_local_waiters();
}

void ZmqTransport::drain_rings() {
  for (size_t p = 0; p < peer_segments_.size(); ++p) {
    if (!peer_segments_[p]) continue;
    std::lock_guard<std::mutex> ring_lock(ring_mutex_[p]);
    RingRecord h;
    std::span<const float> payload;
    while (own_segment_.peek(static_cast<int>(p), h, payload)) file_ring_record(static_cast<int>(p), h, payload);
  }
}

// Sleeps until something may have changed. With rings to every peer: on our doorbell, reading the
// sockets (control messages, dropped connections) every POLL_SLICE. Otherwise one thread polls the
// sockets and the rest wait for it; briefly when rings must be watched too. False when our doorbell
// stayed silent throughout.
bool ZmqTransport::wait_for_traffic(uint32_t bell) {
  if (all_shared_) {
    const bool rang = own_segment_.wait_bell(bell, POLL_SLICE, spin_);
    const Clock::rep now = Clock::now().time_since_epoch().count();
    if (now - last_socket_read_.load(std::memory_order_relaxed) > Clock::duration(POLL_SLICE).count()) {
      last_socket_read_.store(now, std::memory_order_relaxed);
      read_sockets(std::chrono::milliseconds(0));
    }
    return rang;
  }
  read_sockets(own_segment_ ? std::chrono::milliseconds(1) : POLL_SLICE);
  return !own_segment_ || own_segment_.bell() != bell;
}

// One thread at a time reads the sockets, for up to `wait`; a thread that finds another at it waits
// on arrived_ instead (up to `wait`), for what that one files.
void ZmqTransport::read_sockets(std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (polling_) {
    if (wait.count() > 0) arrived_.wait_for(lock, wait);
    return;
  }
  polling_ = true;
  lock.unlock();
  struct Release {  // also when poll_once throws
    ZmqTransport& t;
    ~Release() {
      {
        std::lock_guard<std::mutex> lock(t.mutex_);
        t.polling_ = false;
      }
      t.arrived_.notify_all();
    }
  } release{*this};
  poll_once(wait);
}

void ZmqTransport::wake_local_waiters() {
  arrived_.notify_all();
  if (own_segment_) own_segment_.ring_bell();
}

std::optional<ZmqTransport::Chunk> ZmqTransport::pop(const MessageKey& key) {
  auto it = mailbox_.find(key);
  if (it == mailbox_.end()) return std::nullopt;
  Chunk c = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) mailbox_.erase(it);
  return c;
}

// Reads whatever arrived (waiting up to `wait` for something) and files it under mutex_.
void ZmqTransport::poll_once(std::chrono::milliseconds wait) {
  std::vector<zmq::pollitem_t> items{{inbox_.handle(), 0, ZMQ_POLLIN, 0}};
  for (auto& m : monitors_)
    if (m) items.push_back({m.handle(), 0, ZMQ_POLLIN, 0});
  poll_through_signals(items.data(), items.size(), wait);
  std::vector<std::vector<zmq::message_t>> messages;
  for (;;) {
    std::vector<zmq::message_t> frames;
    if (!zmq::recv_multipart(inbox_, std::back_inserter(frames), zmq::recv_flags::dontwait)) break;
    messages.push_back(std::move(frames));
  }
  std::vector<int> dropped;
  for (size_t p = 0; p < monitors_.size(); ++p) {
    if (!monitors_[p]) continue;
    std::vector<zmq::message_t> event;
    while (zmq::recv_multipart(monitors_[p], std::back_inserter(event), zmq::recv_flags::dontwait)) {
      uint16_t id = 0;
      if (!event.empty() && event[0].size() >= sizeof id) std::memcpy(&id, event[0].data(), sizeof id);
      if (id == ZMQ_EVENT_DISCONNECTED) dropped.push_back(static_cast<int>(p));
      event.clear();
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& frames : messages) file_message(frames);
  for (int p : dropped)
    if (!dropped_[static_cast<size_t>(p)]) dropped_[static_cast<size_t>(p)] = Clock::now();
}

void ZmqTransport::file_message(std::vector<zmq::message_t>& frames) {
  if (frames.size() != 2) return;  // not ours: ignore
  const std::optional<WireHeader> header = parse_wire_header(
      std::span<const std::byte>(static_cast<const std::byte*>(frames[0].data()), frames[0].size()), frames[1].size(),
      config_.world_size, mesh_size_);
  if (!header) return;
  const WireHeader& h = *header;
  switch (static_cast<Kind>(h.kind)) {
    case Kind::DATA:
      mailbox_[MessageKey{h.comm, h.seq, h.src, h.dst}].push_back(Chunk{h.total, h.offset, std::move(frames[1])});
      break;
    case Kind::ABORT:
      if (!abort_message_) abort_message_ = frame_text(frames[1]);
      aborted_.store(true, std::memory_order_release);
      break;
    case Kind::BYE:
      if (h.src >= 0 && h.src < config_.world_size) said_bye_[static_cast<size_t>(h.src)] = 1;
      break;
    case Kind::ATTACH:
      if (h.src >= 0 && h.src < config_.world_size) attach_answer_[static_cast<size_t>(h.src)] = frame_text(frames[1]) == "1";
      break;
  }
}

std::string ZmqTransport::process_name(int process) const {
  const int K = config_.devices_per_process;
  if (K == 1) return "rank " + std::to_string(process);
  return "process " + std::to_string(process) + " (devices " + std::to_string(process * K) + "-" +
         std::to_string(process * K + K - 1) + ")";
}

// Throws if the wait for `key` can no longer succeed (or took too long). Called with mutex_ held.
void ZmqTransport::check_wait(const MessageKey& key, const char* what, Clock::time_point since) {
  if (abort_message_) throw CollectiveAborted(*abort_message_);
  const auto now = Clock::now();
  const std::string here = "device " + std::to_string(key.dst) + " in " + what;
  std::string error = lost_peer("while " + here);
  const int src = process_of(key.src);
  if (error.empty() && src != config_.rank && said_bye_[static_cast<size_t>(src)])
    error = process_name(src) + " finished its run while " + here + " waits for it (ranks ran different collectives)";
  // A local device's sends reach the mailbox before it finishes: one may have arrived between the
  // caller's look into the mailbox and this check, and then the next look finds it.
  if (error.empty() && src == config_.rank && finished_[static_cast<size_t>(key.src)] && !mailbox_.count(key))
    error = "device " + std::to_string(key.src) + " finished its run while " + here +
            " waits for it (devices ran different collectives)";
  if (error.empty() && now - since > std::chrono::duration<double>(config_.timeout_s))
    error = "timed out after " + std::to_string(static_cast<int>(config_.timeout_s)) + " s: " + here +
            " got nothing from " + process_name(src) + " (stuck or unreachable; raise --timeout if it is only slow)";
  if (!error.empty()) fail_run(error);
}

// "lost <process>: its connection closed <when> ..." for the first peer whose connection closed
// without its BYE (after a grace period: the BYE may still be on its way); "" if none. With mutex_.
std::string ZmqTransport::lost_peer(const std::string& when) const {
  const auto now = Clock::now();
  for (int p = 0; p < config_.world_size; ++p) {
    const auto& at = dropped_[static_cast<size_t>(p)];
    if (at && !said_bye_[static_cast<size_t>(p)] && now - *at > DROP_GRACE)
      return "lost " + process_name(p) + ": its connection closed " + when + " (the process died or was killed)";
  }
  return {};
}

// Throws if queued sends to `process` can never leave (or waited too long). Called with mutex_ held.
void ZmqTransport::check_flush(int process, const char* what, Clock::time_point since) {
  if (abort_message_) throw CollectiveAborted(*abort_message_);
  if (const std::string lost = lost_peer(std::string("during ") + what); !lost.empty()) fail_run(lost);
  if (Clock::now() - since > std::chrono::duration<double>(config_.timeout_s))
    fail_run("timed out after " + std::to_string(static_cast<int>(config_.timeout_s)) + " s: " + process_name(process) +
             " took nothing from rank " + std::to_string(config_.rank) + " during " + what +
             " (stuck or unreachable; raise --timeout if it is only slow)");
}

// Ends the run with `error`: every waiting device here throws it, and the peers are told now, so
// that they fail with the same message rather than waiting to time out. Called with mutex_ held.
void ZmqTransport::fail_run(const std::string& error) {
  abort_message_ = "zmq: " + error;
  aborted_.store(true, std::memory_order_release);
  wake_local_waiters();
  WireHeader h{MAGIC, static_cast<uint32_t>(Kind::ABORT), 0, 0, config_.rank, 0, 0, 0};
  {
    std::lock_guard<std::mutex> lock(send_mutex_);
    for (auto& socket : peers_) {
      if (!socket) continue;
      socket.send(zmq::buffer(&h, sizeof h), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      socket.send(zmq::buffer(*abort_message_), zmq::send_flags::dontwait);
    }
  }
  throw CollectiveAborted(*abort_message_);
}

void ZmqTransport::device_finished(int mesh_rank) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (mesh_rank >= 0 && mesh_rank < mesh_size_) finished_[static_cast<size_t>(mesh_rank)] = 1;
  }
  wake_local_waiters();
}

void ZmqTransport::abort(const std::string& message, bool tell_peers) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (abort_message_) return;  // the first message wins
    abort_message_ = message;
    aborted_.store(true, std::memory_order_release);
  }
  wake_local_waiters();
  if (tell_peers) send_control(static_cast<uint32_t>(Kind::ABORT), message);
}

}  // namespace tpcli::dist

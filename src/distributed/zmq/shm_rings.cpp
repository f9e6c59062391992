// tpcli::dist — shared-memory rings (layout and protocol: shm_rings.h).
//
// Segment layout: [Header, one page][Ring control lines, P x 128 bytes, page-rounded][P rings of
// RING_BYTES]. Positions (head, tail) count bytes since the start and only grow; the byte at
// position x lives at x % RING_BYTES. Producer: write the record, then publish head (release).
// Consumer: read head (acquire), read the record, then publish tail (release).
#include "distributed/zmq/shm_rings.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "distributed/futex.h"

namespace tpcli::dist {

namespace {

constexpr uint32_t MAGIC = 0x7470736d;  // "tpsm"
constexpr size_t PAGE = 4096;
constexpr size_t LINE = 64;

size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

size_t record_bytes(int64_t floats) { return LINE + round_up(static_cast<size_t>(floats) * sizeof(float), LINE); }

size_t controls_bytes(int processes) { return round_up(static_cast<size_t>(processes) * 2 * LINE, PAGE); }

size_t segment_bytes(int processes) {
  return PAGE + controls_bytes(processes) + static_cast<size_t>(processes) * ShmSegment::RING_BYTES;
}

std::string read_first_line(const char* path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

std::string link_target(const char* path) {
  char buf[256];
  const ssize_t n = ::readlink(path, buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

}  // namespace

struct ShmSegment::Header {
  alignas(LINE) std::atomic<uint32_t> bell{0};      // futex word: bumped by every ring_bell()
  alignas(LINE) std::atomic<uint32_t> sleepers{0};  // threads in futex wait: ring_bell skips the
                                                    // syscall when nobody sleeps
  uint32_t magic = MAGIC;
  int32_t processes = 0;
};

struct ShmSegment::Ring {
  alignas(LINE) std::atomic<uint64_t> head{0};  // written by the producer
  alignas(LINE) std::atomic<uint64_t> tail{0};  // written by the consumer
};
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "atomics shared between processes must be lock-free");

ShmSegment::ShmSegment(void* base, size_t bytes, int fd, int processes)
    : base_(base), bytes_(bytes), fd_(fd), processes_(processes) {}

ShmSegment ShmSegment::create(int processes) {
  static_assert(sizeof(Header) <= PAGE && sizeof(Ring) == 2 * LINE);
  const int fd = ::memfd_create("tpcli-rings", MFD_CLOEXEC);
  if (fd < 0) throw std::runtime_error(std::string("memfd_create: ") + std::strerror(errno));
  const size_t bytes = segment_bytes(processes);
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int e = errno;
    ::close(fd);
    throw std::runtime_error(std::string("sizing the shared segment: ") + std::strerror(e));
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (base == MAP_FAILED) {
    const int e = errno;
    ::close(fd);
    throw std::runtime_error(std::string("mapping the shared segment: ") + std::strerror(e));
  }
  ShmSegment s(base, bytes, fd, processes);
  Header* h = new (base) Header();  // the memfd starts zeroed; placement new makes the atomics live
  h->processes = processes;
  for (int p = 0; p < processes; ++p) new (&s.ring(p)) Ring();
  return s;
}

ShmSegment ShmSegment::open(const std::string& descriptor, int processes) {
  int pid = 0, owner_fd = -1;
  char colon = 0;
  std::istringstream in(descriptor);
  if (!(in >> pid >> colon >> owner_fd) || colon != ':')
    throw std::runtime_error("malformed shared-memory descriptor '" + descriptor + "'");
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(owner_fd);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  const size_t bytes = segment_bytes(processes);
  struct stat st{};
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
    ::close(fd);
    throw std::runtime_error(path + " is not a tpcli segment for " + std::to_string(processes) + " processes");
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (base == MAP_FAILED) {
    const int e = errno;
    ::close(fd);
    throw std::runtime_error("cannot map " + path + ": " + std::strerror(e));
  }
  ShmSegment s(base, bytes, fd, processes);
  if (s.header().magic != MAGIC || s.header().processes != processes)
    throw std::runtime_error(path + " is not a tpcli segment");
  return s;
}

ShmSegment::ShmSegment(ShmSegment&& o) noexcept
    : base_(std::exchange(o.base_, nullptr)), bytes_(o.bytes_), fd_(std::exchange(o.fd_, -1)), processes_(o.processes_) {}

ShmSegment& ShmSegment::operator=(ShmSegment&& o) noexcept {
  std::swap(base_, o.base_);  // o's destructor releases what this held
  std::swap(bytes_, o.bytes_);
  std::swap(fd_, o.fd_);
  std::swap(processes_, o.processes_);
  return *this;
}

ShmSegment::~ShmSegment() {
  if (base_) ::munmap(base_, bytes_);
  if (fd_ >= 0) ::close(fd_);
}

std::string ShmSegment::descriptor() const { return std::to_string(::getpid()) + ":" + std::to_string(fd_); }

ShmSegment::Header& ShmSegment::header() const { return *static_cast<Header*>(base_); }

ShmSegment::Ring& ShmSegment::ring(int from) const {
  return *reinterpret_cast<Ring*>(static_cast<char*>(base_) + PAGE + static_cast<size_t>(from) * sizeof(Ring));
}

char* ShmSegment::ring_data(int from) const {
  return static_cast<char*>(base_) + PAGE + controls_bytes(processes_) + static_cast<size_t>(from) * RING_BYTES;
}

bool ShmSegment::try_write(int from, const RingRecord& h, const float* data) {
  Ring& r = ring(from);
  const size_t need = record_bytes(h.floats);
  uint64_t head = r.head.load(std::memory_order_relaxed);  // ours
  const uint64_t tail = r.tail.load(std::memory_order_acquire);
  size_t at = head % RING_BYTES;
  const size_t gap = RING_BYTES - at;  // bytes before the end
  if (gap < need) {                    // does not fit before the end: skip to the start
    if (RING_BYTES - (head - tail) < gap + need) return false;
    if (gap >= sizeof(RingRecord)) {
      RingRecord pad;
      pad.floats = -1;
      std::memcpy(ring_data(from) + at, &pad, sizeof pad);
    }
    head += gap;
    at = 0;
  } else if (RING_BYTES - (head - tail) < need) {
    return false;
  }
  char* p = ring_data(from) + at;
  std::memcpy(p, &h, sizeof h);
  if (h.floats > 0) std::memcpy(p + LINE, data, static_cast<size_t>(h.floats) * sizeof(float));
  r.head.store(head + need, std::memory_order_release);
  return true;
}

bool ShmSegment::peek(int from, RingRecord& h, std::span<const float>& payload) {
  Ring& r = ring(from);
  for (;;) {
    const uint64_t tail = r.tail.load(std::memory_order_relaxed);  // ours
    if (tail == r.head.load(std::memory_order_acquire)) return false;
    const size_t at = tail % RING_BYTES, gap = RING_BYTES - at;
    const char* p = ring_data(from) + at;
    if (gap >= sizeof h) std::memcpy(&h, p, sizeof h);
    if (gap < sizeof h || h.floats < 0) {  // the producer wrapped here
      r.tail.store(tail + gap, std::memory_order_release);
      continue;
    }
    payload = std::span<const float>(reinterpret_cast<const float*>(p + LINE), static_cast<size_t>(h.floats));
    return true;
  }
}

void ShmSegment::consume(int from, const RingRecord& h) {
  Ring& r = ring(from);
  r.tail.store(r.tail.load(std::memory_order_relaxed) + record_bytes(h.floats), std::memory_order_release);
}

uint32_t ShmSegment::bell() const { return header().bell.load(std::memory_order_seq_cst); }

void ShmSegment::ring_bell() {
  Header& h = header();
  h.bell.fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(h.bell, h.sleepers, FutexScope::Shared);  // not private: other processes sleep on it
}

// Spins, then sleeps at once. No sched_yield between the two: beside other busy programs each yield
// may hand the core to one of them for a whole scheduler slice (distributed/futex.h).
bool ShmSegment::wait_bell(uint32_t seen, std::chrono::microseconds wait, int spin) const {
  Header& h = header();
  for (int i = 0; i < spin; ++i) {
    if (h.bell.load(std::memory_order_acquire) != seen) return true;
    cpu_relax();
  }
  return futex_wait(h.bell, seen, h.sleepers, FutexScope::Shared, wait);
}

std::string host_identity() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return std::string(name) + "/" + read_first_line("/proc/sys/kernel/random/boot_id") + "/" +
         link_target("/proc/self/ns/net") + "/" + link_target("/proc/self/ns/pid");
}

}  // namespace tpcli::dist

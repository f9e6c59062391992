#include "tensor/aligned_storage.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <map>
#include <mutex>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace tpcli::tensor {

namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool ARENA_ENABLED = false;
#else
constexpr bool ARENA_ENABLED = true;
#endif
constexpr size_t CHUNK_BYTES = size_t{32} << 20;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

void* aligned_block(size_t bytes, size_t alignment) {
  void* p = nullptr;
  if (posix_memalign(&p, alignment, bytes == 0 ? CACHE_LINE : bytes) != 0) throw std::bad_alloc();
  return p;
}

// Advice, not a requirement: a kernel without THP says no and the memory keeps 4 KB pages.
void advise_huge_pages([[maybe_unused]] void* p, [[maybe_unused]] size_t bytes) {
#if defined(MADV_HUGEPAGE)
  (void)madvise(p, bytes, MADV_HUGEPAGE);
#endif
}

struct Chunk {
  size_t size = 0;
  std::map<size_t, size_t> free_ranges;  // offset -> length, coalesced
  size_t live_bytes = 0;
  int carving_scopes = 0;
};

// Every chunk by its base address, shared by all threads (a buffer may die on another thread).
std::mutex arena_mutex;
std::map<char*, Chunk> chunks;
std::atomic<size_t> chunk_count{0};
thread_local int scope_depth = 0;
thread_local std::vector<char*> carving;  // this thread's scope's chunks

void release_if_unused(std::map<char*, Chunk>::iterator it) {
  if (it->second.live_bytes != 0 || it->second.carving_scopes != 0) return;
  std::free(it->first);
  chunks.erase(it);
  chunk_count.fetch_sub(1, std::memory_order_relaxed);
}

// First fit in one chunk; nullptr if no free range holds `bytes`. With arena_mutex.
char* carve(char* base, Chunk& c, size_t bytes) {
  for (auto it = c.free_ranges.begin(); it != c.free_ranges.end(); ++it) {
    if (it->second < bytes) continue;
    const size_t offset = it->first, rest = it->second - bytes;
    c.free_ranges.erase(it);
    if (rest) c.free_ranges.emplace(offset + bytes, rest);
    c.live_bytes += bytes;
    return base + offset;
  }
  return nullptr;
}

void* arena_allocate(size_t bytes) {
  bytes = round_up(bytes, CACHE_LINE);
  std::lock_guard<std::mutex> lock(arena_mutex);
  for (char* base : carving)
    if (char* p = carve(base, chunks.at(base), bytes)) return p;
  const size_t size = std::max(CHUNK_BYTES, round_up(bytes, HUGE_PAGE));
  char* base = static_cast<char*>(aligned_block(size, HUGE_PAGE));
  advise_huge_pages(base, size);
  Chunk& c = chunks[base];
  c.size = size;
  c.free_ranges.emplace(0, size);
  c.carving_scopes = 1;
  chunk_count.fetch_add(1, std::memory_order_relaxed);
  carving.push_back(base);
  return carve(base, c, bytes);
}

// A free range's whole 2 MB pages go back to the system (they are faulted in again, zeroed, when
// carved anew): a model's constructor frees temporaries in between the weights it keeps (slices
// it then fused), and without this every such range would stay resident for the whole run. The
// partial pages at the range's ends stay: live buffers share them.
void release_whole_huge_pages([[maybe_unused]] char* begin, [[maybe_unused]] size_t bytes) {
#if defined(MADV_DONTNEED)
  const auto first = reinterpret_cast<uintptr_t>(begin), last = first + bytes;
  const uintptr_t from = round_up(first, HUGE_PAGE), to = last / HUGE_PAGE * HUGE_PAGE;
  if (from < to) (void)madvise(reinterpret_cast<void*>(from), to - from, MADV_DONTNEED);
#endif
}

// Gives `p` back to its chunk; false if no chunk holds it. With arena_mutex.
bool arena_free(char* p, size_t bytes) {
  auto it = chunks.upper_bound(p);
  if (it == chunks.begin()) return false;
  --it;
  Chunk& c = it->second;
  if (p >= it->first + c.size) return false;
  bytes = round_up(bytes, CACHE_LINE);
  size_t offset = static_cast<size_t>(p - it->first), length = bytes;
  auto next = c.free_ranges.lower_bound(offset);
  if (next != c.free_ranges.end() && offset + length == next->first) {
    length += next->second;
    next = c.free_ranges.erase(next);
  }
  if (next != c.free_ranges.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      length += prev->second;
      c.free_ranges.erase(prev);
    }
  }
  c.free_ranges.emplace(offset, length);
  c.live_bytes -= bytes;
  release_whole_huge_pages(it->first + offset, length);
  release_if_unused(it);
  return true;
}

}  // namespace

void* allocate_aligned(size_t bytes) {
  if (ARENA_ENABLED && scope_depth > 0 && bytes >= HugePageArena::ARENA_MIN_BYTES) return arena_allocate(bytes);
  const size_t alignment = bytes >= HUGE_PAGE ? HUGE_PAGE : CACHE_LINE;
  void* p = aligned_block(bytes, alignment);
  // Only the whole 2 MB pages: a huge page over the tail would hold up to 2 MB nobody asked for.
  if (alignment == HUGE_PAGE) advise_huge_pages(p, bytes / HUGE_PAGE * HUGE_PAGE);
  return p;
}

void free_aligned(void* p, size_t bytes) noexcept {
  if (ARENA_ENABLED && p && bytes >= HugePageArena::ARENA_MIN_BYTES &&
      chunk_count.load(std::memory_order_relaxed) > 0) {
    std::lock_guard<std::mutex> lock(arena_mutex);
    if (arena_free(static_cast<char*>(p), bytes)) return;
  }
  std::free(p);
}

HugePageArena::HugePageArena() { ++scope_depth; }

HugePageArena::~HugePageArena() {
  if (--scope_depth > 0) return;
  std::lock_guard<std::mutex> lock(arena_mutex);
  for (char* base : carving) {
    auto it = chunks.find(base);
    --it->second.carving_scopes;
    release_if_unused(it);
  }
  carving.clear();
}

size_t HugePageArena::chunks_alive() { return chunk_count.load(); }

size_t HugePageArena::bytes_in_use() {
  std::lock_guard<std::mutex> lock(arena_mutex);
  size_t total = 0;
  for (const auto& [base, c] : chunks) total += c.live_bytes;
  return total;
}

}  // namespace tpcli::tensor

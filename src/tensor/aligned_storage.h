// tpcli::tensor — the allocator behind Tensor's floats and PackedMatrix's words: 64-byte aligned,
// and large buffers on 2 MB transparent huge pages.
//
// Why: decode streams every weight once per token, so it runs at memory speed only when every
// 64-byte vector load is one cache line (malloc gives 16-byte alignment: each load of a row then
// touches two lines) and when the page walks of a 200 MB stream stay cheap (a 4 KB page costs one
// TLB miss per 4 KB read; in a virtual machine each miss walks two page tables). Buffers of at
// least HUGE_PAGE bytes start on a 2 MB boundary and their whole 2 MB pages are advised
// MADV_HUGEPAGE (Linux; the system's transparent_hugepage setting "madvise" or "always" honours
// it, "never" ignores it). The memory is touched first by whoever fills it: a device thread that
// builds its own shard gets pages near its core.
//
// A buffer gets huge pages for its whole 2 MB pages only, and a device's weights are mostly
// 0.3-4 MB (each matrix split over the devices): a HugePageArena packs them back to back instead.
#pragma once

#include <cstddef>
#include <new>

namespace tpcli::tensor {

constexpr size_t CACHE_LINE = 64;
constexpr size_t HUGE_PAGE = size_t{2} << 20;

// Raw storage: `bytes` aligned to CACHE_LINE, or to HUGE_PAGE (huge pages advised) when
// bytes >= HUGE_PAGE; inside a HugePageArena scope, buffers of ARENA_MIN_BYTES or more come from
// the arena. std::bad_alloc when the system has no memory for it. free_aligned takes the same
// `bytes` back.
void* allocate_aligned(size_t bytes);
void free_aligned(void* p, size_t bytes) noexcept;

// While one lives on a thread, that thread's buffers of at least ARENA_MIN_BYTES are carved, one
// after another, out of chunks of 32 MB (or more) that are advised huge pages whole, so every byte
// of a model's weights sits on 2 MB pages however the matrices were cut (shards under 2 MB would
// otherwise stay on 4 KB pages, which the decode's matvec streams more slowly: more TLB misses;
// BENCHMARKS.md has the measured share and cost). Freed ranges are reused (first fit: a
// constructor's temporaries cost nothing lasting); a chunk goes back to the system once nothing
// in it is alive and no scope carves from it. Scopes nest. Under AddressSanitizer it does nothing
// (each buffer keeps its own guard zones).
class HugePageArena {
 public:
  static constexpr size_t ARENA_MIN_BYTES = size_t{64} << 10;
  HugePageArena();
  ~HugePageArena();
  HugePageArena(const HugePageArena&) = delete;
  HugePageArena& operator=(const HugePageArena&) = delete;
  // Chunks alive in the process, and the bytes carved from them and not freed (for tests).
  static size_t chunks_alive();
  static size_t bytes_in_use();
};

template <class T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U>&) noexcept {}
  T* allocate(size_t n) {
    if (n > static_cast<size_t>(-1) / sizeof(T)) throw std::bad_array_new_length();
    return static_cast<T*>(allocate_aligned(n * sizeof(T)));
  }
  void deallocate(T* p, size_t n) noexcept { free_aligned(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const AlignedAllocator<U>&) const noexcept { return true; }
};

}  // namespace tpcli::tensor

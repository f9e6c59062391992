// tpcli::tensor — the allocator behind Tensor's floats: 64-byte aligned, and large buffers on
// 2 MB transparent huge pages.
//
// Why: decode streams every weight once per token, so it runs at memory speed only when every
// 64-byte vector load is one cache line (malloc gives 16-byte alignment: each load of a row then
// touches two lines) and when the page walks of a 200 MB stream stay cheap (a 4 KB page costs one
// TLB miss per 4 KB read; in a virtual machine each miss walks two page tables). Buffers of at
// least HUGE_PAGE bytes start on a 2 MB boundary and their whole 2 MB pages are advised
// MADV_HUGEPAGE (Linux; the system's transparent_hugepage setting "madvise" or "always" honours
// it, "never" ignores it). The memory is touched first by whoever fills it: a device thread that
// builds its own shard gets pages near its core.
#pragma once

#include <cstddef>
#include <new>

namespace tpcli::tensor {

constexpr size_t CACHE_LINE = 64;
constexpr size_t HUGE_PAGE = size_t{2} << 20;

// Raw storage: `bytes` aligned to CACHE_LINE, or to HUGE_PAGE (huge pages advised) when
// bytes >= HUGE_PAGE. std::bad_alloc when the system has no memory for it.
void* allocate_aligned(size_t bytes);
void free_aligned(void* p) noexcept;

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
  void deallocate(T* p, size_t) noexcept { free_aligned(p); }
  template <class U>
  bool operator==(const AlignedAllocator<U>&) const noexcept { return true; }
};

}  // namespace tpcli::tensor

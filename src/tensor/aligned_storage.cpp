#include "tensor/aligned_storage.h"

#include <cstdlib>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace tpcli::tensor {

void* allocate_aligned(size_t bytes) {
  const size_t alignment = bytes >= HUGE_PAGE ? HUGE_PAGE : CACHE_LINE;
  void* p = nullptr;
  if (posix_memalign(&p, alignment, bytes == 0 ? CACHE_LINE : bytes) != 0) throw std::bad_alloc();
#if defined(MADV_HUGEPAGE)
  // Only the whole 2 MB pages: a huge page over the tail would hold up to 2 MB nobody asked for.
  // Advice, not a requirement: a kernel without THP says no and the buffer keeps 4 KB pages.
  if (alignment == HUGE_PAGE) (void)madvise(p, bytes / HUGE_PAGE * HUGE_PAGE, MADV_HUGEPAGE);
#endif
  return p;
}

void free_aligned(void* p) noexcept { std::free(p); }

}  // namespace tpcli::tensor

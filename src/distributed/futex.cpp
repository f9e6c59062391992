// tpcli::dist — futex wait and wake (see futex.h for the protocol).
#include "distributed/futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>

namespace tpcli::dist {

namespace {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) && std::atomic<uint32_t>::is_always_lock_free,
              "the kernel reads a futex word as a plain 32-bit integer");

int op_for(int op, FutexScope scope) { return scope == FutexScope::Process ? (op | FUTEX_PRIVATE_FLAG) : op; }

uint32_t* address(std::atomic<uint32_t>& word) { return reinterpret_cast<uint32_t*>(&word); }

}  // namespace

bool futex_wait(std::atomic<uint32_t>& word, uint32_t seen, std::atomic<uint32_t>& sleepers, FutexScope scope,
                std::optional<std::chrono::microseconds> timeout) {
  sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (word.load(std::memory_order_seq_cst) == seen) {
    timespec t{};
    if (timeout) t = {static_cast<time_t>(timeout->count() / 1000000), static_cast<long>(timeout->count() % 1000000) * 1000};
    // Relative timeout; returns at once (EAGAIN) if the word already differs, EINTR on a signal.
    ::syscall(SYS_futex, address(word), op_for(FUTEX_WAIT, scope), seen, timeout ? &t : nullptr, nullptr, 0);
  }
  sleepers.fetch_sub(1, std::memory_order_seq_cst);
  return word.load(std::memory_order_acquire) != seen;
}

void futex_wake_all(std::atomic<uint32_t>& word, const std::atomic<uint32_t>& sleepers, FutexScope scope) {
  if (sleepers.load(std::memory_order_seq_cst) > 0)
    ::syscall(SYS_futex, address(word), op_for(FUTEX_WAKE, scope), INT_MAX, nullptr, nullptr, 0);
}

}  // namespace tpcli::dist

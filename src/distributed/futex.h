// tpcli::dist — sleeping on a 32-bit word until another thread (or process) changes it: the Linux
// futex, called directly.
//
// Why not std::atomic::wait: libstdc++ 12 spins and then calls sched_yield several times before it
// sleeps. With more devices than cores and other programs running, each yield can hand the core to
// an unrelated process for a whole scheduler slice, at every wait (`tpcli bench busy` measures the
// slowdown; BENCHMARKS.md has it). A futex wait goes to sleep at once, and the waker's FUTEX_WAKE
// makes the sleeper runnable straight away.
//
// The protocol every waiter here follows (the lost-wake-up-free one):
//
//   waker:   change the state; word.fetch_add(1); futex_wake_all(word, sleepers)
//   waiter:  seen = word.load(); if (state is what I wait for) return; futex_wait(word, seen, sleepers)
//
// futex_wait returns at once if the word no longer equals `seen`, so a wake-up between the load and
// the sleep is never lost. `sleepers` counts threads inside futex_wait, so a waker with nobody
// asleep skips the system call (both sides use seq_cst, so either the waker sees the sleeper or the
// sleeper's kernel compare sees the new word).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>

namespace tpcli::dist {

// Whether the word lives in memory shared between processes (a memfd segment) or only between the
// threads of this process (cheaper: FUTEX_PRIVATE_FLAG).
enum class FutexScope { Process, Shared };

// Sleeps while word == seen, at most `timeout` (none: until woken). Returns whether the word
// changed (false on timeout, or on a spurious wake-up with the word unchanged); callers re-check
// their own condition either way.
bool futex_wait(std::atomic<uint32_t>& word, uint32_t seen, std::atomic<uint32_t>& sleepers, FutexScope scope,
                std::optional<std::chrono::microseconds> timeout = std::nullopt);

// Wakes every thread sleeping on `word` (call after changing it), unless none sleeps.
void futex_wake_all(std::atomic<uint32_t>& word, const std::atomic<uint32_t>& sleepers, FutexScope scope);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// The short spin before a sleep: polls ready() for up to `budget` (a time, not a count: a pause
// lasts ~1 ns on some CPUs and ~40 ns on others). True if ready() held.
template <class Ready>
bool spin_until(const Ready& ready, std::chrono::nanoseconds budget) {
  if (ready()) return true;
  if (budget.count() <= 0) return false;
  const auto until = std::chrono::steady_clock::now() + budget;
  for (;;) {
    for (int i = 0; i < 16; ++i) {  // read the clock every 16 polls: it costs about one pause
      cpu_relax();
      if (ready()) return true;
    }
    if (std::chrono::steady_clock::now() >= until) return false;
  }
}

}  // namespace tpcli::dist

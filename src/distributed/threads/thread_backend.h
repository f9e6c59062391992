// tpcli::dist — the thread backend: every device is a thread of this process.
//
// One ThreadBackend (a "fabric") per run holds a shared state per member set, created lazily under
// a mutex the first time any member asks for it. Collectives exchange pointers to the members' own
// buffers through that state and synchronise with a counting barrier that spins briefly and then
// sleeps on a futex (distributed/futex.h): 8 devices on 2 cores is normal, and there spinning collapses,
// and so does yielding the core once other programs run beside it.
// Small reductions go through per-member staging buffers and cost one barrier.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "distributed/backend.h"

namespace tpcli::dist {

struct ThreadGroupState;  // thread_backend.cpp

class ThreadBackend : public Backend {
 public:
  // world_size: devices in the run (bounds ranks; with the core count it sets how long waits spin
  // before they sleep).
  explicit ThreadBackend(int world_size);
  ~ThreadBackend() override;

  std::shared_ptr<Communicator> communicator(int rank, const std::vector<int>& members) override;
  // Channel 0 is communicator()'s; channel 1 carries a member's started collectives (AsyncWorker).
  std::shared_ptr<Communicator> channel_communicator(int rank, const std::vector<int>& members, int channel);
  void abort(int failed_rank, const std::string& message) override;
  void device_finished(int rank) override;

  // Read by waiting members (lock-free).
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  const std::string& abort_message() const { return abort_message_; }  // valid once aborted()
  std::chrono::nanoseconds spin_budget() const { return spin_budget_; }

 private:
  int world_size_;
  std::chrono::nanoseconds spin_budget_;
  std::atomic<bool> aborted_{false};
  std::string abort_message_;  // written once, before aborted_ is set
  std::mutex mutex_;           // guards groups_ and finished_
  std::map<std::pair<int, std::vector<int>>, std::shared_ptr<ThreadGroupState>> groups_;  // by (channel, members)
  std::vector<char> finished_;  // by rank
};

}  // namespace tpcli::dist

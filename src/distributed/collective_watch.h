// tpcli::dist — what ends a run whose devices are stuck in collectives.
//
// A command's signal handler may only set a flag, and its training loop reads that flag between
// steps. A device waiting in a collective never gets there when the wait is long: a modelled link
// of minutes per call, a peer process that hangs. So every device stamps when its thread enters a
// collective, and while a run has a stop flag (RunOptions::stop) run_on_mesh polls it: once
// STOP_GRACE has passed since the request, a device that has waited in one collective for
// STOP_GRACE fails the run. Backend::abort wakes the transports' waits; end() wakes the modelled-link
// holds, which only sleep (distributed/links.h). The waits of a normal step last milliseconds and never
// count, so a stop between steps still finishes the step and saves.
//
// end() is also called when a device fails, so a hold on a slow modelled link does not outlive it.
//
// The stamps are made by a communicator wrapped around the group's (WatchedCommunicator), outside
// any modelled link (LinkModelledCommunicator) so that a hold counts as waiting.
//
// A watch made outside the run (RunOptions::watch) is read while it goes on: a server's /health
// asks stuck() and reports the devices stuck rather than ok while a peer process is frozen.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "distributed/links.h"

namespace tpcli::dist {

// Long enough that no wait of a working step reaches it, short enough for `timeout`'s SIGTERM.
constexpr std::chrono::seconds STOP_GRACE{1};

class CollectiveWatch {
 public:
  using Clock = std::chrono::steady_clock;
  explicit CollectiveWatch(int devices) : since_ns_(static_cast<size_t>(devices)) {}
  int devices() const { return static_cast<int>(since_ns_.size()); }

  // Marks device `rank` as waiting in a collective for the scope's lifetime (nests: an inner scope
  // restores the outer stamp). A null watch does nothing.
  class Waiting {
   public:
    Waiting(CollectiveWatch* watch, int rank);
    ~Waiting();
    Waiting(const Waiting&) = delete;
    Waiting& operator=(const Waiting&) = delete;

   private:
    std::atomic<int64_t>* slot_ = nullptr;
    int64_t outer_ = 0;
  };

  struct LongestWait {
    int rank = -1;
    Clock::duration waited{};
  };
  // The device that has waited longest in its current collective (none when nobody waits).
  std::optional<LongestWait> longest_wait(Clock::time_point now) const;
  // "device 0 has waited 4.2 s in one collective" when a device has waited `limit` or longer.
  std::optional<std::string> stuck(Clock::duration limit, Clock::time_point now = Clock::now()) const;

  // Ends the run: every hold, now or later, throws CollectiveAborted(why). The first call wins.
  void end(const std::string& why);
  // Sleeps until `until`; throws CollectiveAborted if the run ends first.
  void sleep_until(Clock::time_point until);

 private:
  std::vector<std::atomic<int64_t>> since_ns_;  // [devices] steady-clock ns of entry; 0 = not waiting
  std::mutex mutex_;                            // guards why_
  std::condition_variable ended_;
  std::optional<std::string> why_;
};

// Wraps a group's communicator so that device `device`'s time in each collective (for a started
// one, in wait()) is stamped in `watch`. Only a run that can be asked to stop reads the stamps, so
// the runtime wraps only then: other runs pay no clock read per collective.
class WatchedCommunicator : public ForwardingCommunicator {
 public:
  WatchedCommunicator(std::shared_ptr<Communicator> inner, CollectiveWatch* watch, int device)
      : ForwardingCommunicator(*inner), owned_(std::move(inner)), watch_(watch), device_(device) {}
  std::unique_ptr<PendingCollective> start(CollectiveCall call) override;

 protected:
  void run(const Call& call, CallOn on) override;

 private:
  std::shared_ptr<Communicator> owned_;  // inner_
  CollectiveWatch* watch_;
  int device_;
};

}  // namespace tpcli::dist

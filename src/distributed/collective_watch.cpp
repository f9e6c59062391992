// tpcli::dist — collective wait stamps and interruptible modelled-link holds (collective_watch.h).
#include "distributed/collective_watch.h"

#include <cstdio>

#include "distributed/group.h"

namespace tpcli::dist {

namespace {

int64_t ns_of(CollectiveWatch::Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// A started call whose wait() is stamped as the device waiting in a collective.
class WatchedPending : public PendingCollective {
 public:
  WatchedPending(std::unique_ptr<PendingCollective> inner, CollectiveWatch* watch, int device)
      : inner_(std::move(inner)), watch_(watch), device_(device) {}
  CollectiveWatch::Clock::time_point wait() override {
    CollectiveWatch::Waiting waiting(watch_, device_);
    return inner_->wait();
  }

 private:
  std::unique_ptr<PendingCollective> inner_;
  CollectiveWatch* watch_;
  int device_;
};

}  // namespace

CollectiveWatch::Waiting::Waiting(CollectiveWatch* watch, int rank) {
  if (!watch || rank < 0 || rank >= static_cast<int>(watch->since_ns_.size())) return;
  slot_ = &watch->since_ns_[static_cast<size_t>(rank)];
  outer_ = slot_->load(std::memory_order_relaxed);
  // An inner call of an outer collective counts from the outer one's start.
  if (outer_ == 0) slot_->store(ns_of(Clock::now()), std::memory_order_relaxed);
}

CollectiveWatch::Waiting::~Waiting() {
  if (slot_) slot_->store(outer_, std::memory_order_relaxed);
}

std::optional<CollectiveWatch::LongestWait> CollectiveWatch::longest_wait(Clock::time_point now) const {
  std::optional<LongestWait> longest;
  for (size_t r = 0; r < since_ns_.size(); ++r) {
    const int64_t since = since_ns_[r].load(std::memory_order_relaxed);
    if (since == 0) continue;
    const Clock::duration waited = std::chrono::nanoseconds(ns_of(now) - since);
    if (!longest || waited > longest->waited) longest = LongestWait{static_cast<int>(r), waited};
  }
  return longest;
}

std::optional<std::string> CollectiveWatch::stuck(Clock::duration limit, Clock::time_point now) const {
  const std::optional<LongestWait> longest = longest_wait(now);
  if (!longest || longest->waited < limit) return std::nullopt;
  char text[96];
  std::snprintf(text, sizeof text, "device %d has waited %.1f s in one collective", longest->rank,
                std::chrono::duration<double>(longest->waited).count());
  return std::string(text);
}

void CollectiveWatch::end(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (why_) return;
    why_ = why;
  }
  ended_.notify_all();
}

void CollectiveWatch::sleep_until(Clock::time_point until) {
  std::unique_lock<std::mutex> lock(mutex_);
  ended_.wait_until(lock, until, [&] { return why_.has_value(); });
  if (why_) throw CollectiveAborted(*why_);
}

void WatchedCommunicator::run(const Call&, CallOn on) {
  CollectiveWatch::Waiting waiting(watch_, device_);
  on(inner_);
}

std::unique_ptr<PendingCollective> WatchedCommunicator::start(CollectiveCall call) {
  return std::make_unique<WatchedPending>(inner_.start(std::move(call)), watch_, device_);
}

}  // namespace tpcli::dist

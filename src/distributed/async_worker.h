// tpcli::dist — runs a member's started collectives (Communicator::start) on a thread of their own.
//
// Each member of a group that starts collectives gets one worker: a thread and a second
// communicator of the same members (its "channel"), used only by that thread, so started calls
// never interleave with the member's blocking ones. Calls run in the order they were started; as
// every member starts the same calls in the same order, the channels stay matched. Failures need
// no extra machinery: the channel's collectives wake with CollectiveAborted like any other, and
// wait() rethrows what the call threw.
//
// A handle dropped unwaited while its thread unwinds an exception marks the run failed (through
// `abandon`) before it waits for its call: the call may need members that are themselves waiting
// for this member elsewhere, and must end before the buffers it reads go away.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "distributed/group.h"

namespace tpcli::dist {

class AsyncWorker {
 public:
  // abandon(message): fail the run (Backend::abort for this member).
  AsyncWorker(std::shared_ptr<Communicator> channel, std::function<void(const std::string&)> abandon);
  ~AsyncWorker();  // finishes the queued calls, then joins
  AsyncWorker(const AsyncWorker&) = delete;
  AsyncWorker& operator=(const AsyncWorker&) = delete;

  std::unique_ptr<PendingCollective> submit(CollectiveCall call);

  struct Job;  // async_worker.cpp

 private:
  void run();

  std::shared_ptr<Communicator> channel_;
  std::function<void(const std::string&)> abandon_;
  std::mutex mutex_;  // guards queue_ and stopping_
  std::condition_variable wake_;
  std::deque<std::pair<CollectiveCall, std::shared_ptr<Job>>> queue_;
  bool stopping_ = false;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace tpcli::dist

// tpcli::dist — what a transport provides to the runtime: communicators for sub-groups, and abort.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "distributed/group.h"

namespace tpcli::dist {

class Backend {
 public:
  virtual ~Backend() = default;
  // The communicator through which mesh rank `rank` talks to `members` (ascending mesh ranks that
  // include `rank`). Called by every member with the same member list, in the same order.
  virtual std::shared_ptr<Communicator> communicator(int rank, const std::vector<int>& members) = 0;
  // Mark the run failed: every member blocked in (or later entering) a collective throws
  // CollectiveAborted carrying this message. Idempotent; the first message wins.
  virtual void abort(int failed_rank, const std::string& message) = 0;
  // Device `rank` returned from its body. A member still waiting for it in a collective can never
  // be released, so backends that can tell should fail such waits instead of hanging. Optional.
  virtual void device_finished(int rank) {}
};

}  // namespace tpcli::dist

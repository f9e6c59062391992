// Test support: collectives as (name, payload bytes) -> calls, from a plan (model/comm_plan.h) or
// from what one device recorded in a trace (dist::Trace, Event::payload), so the two compare.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "distributed/trace.h"
#include "model/comm_plan.h"

namespace tpcli::testing {

using CallCounts = std::map<std::pair<std::string, int64_t>, int64_t>;

inline CallCounts planned_calls(const std::vector<model::PlannedCollective>& plan) {
  CallCounts out;
  for (const auto& p : plan) out[{p.name, p.bytes()}] += p.calls;
  return out;
}

// Collectives of `track` that moved data (a size-1 group's calls record 0 bytes and are left out),
// started at or after from_ns: blocking ones and started ones (drawn on the device's async track).
inline CallCounts recorded_calls(const dist::Trace& trace, int track, int64_t from_ns = 0) {
  CallCounts out;
  for (const dist::Trace::Event& e : trace.events())
    if ((e.track == track || e.track == dist::Trace::ASYNC_TRACK_BASE + track) && e.category == "collective" && e.payload >= 0 && e.bytes > 0 && e.start_ns >= from_ns)
      ++out[{e.name, e.payload}];
  return out;
}

}  // namespace tpcli::testing

// Test support for the dist tests: a run on the threads backend that must fail, promptly, with a
// named error from a given device.
#pragma once

#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <string>

#include "distributed/runtime.h"

namespace tpcli::testing {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Runs `body` on `mesh`, expecting DeviceError from `rank` whose message contains `text`, within 5 s.
inline void expect_failure(const dist::Mesh& mesh, const std::function<void(dist::Device&)>& body, int rank,
                           const std::string& text) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    dist::run_on_mesh(mesh, body);
    FAIL("run_on_mesh returned normally; expected device " << rank << " to fail with '" << text << "'");
  } catch (const dist::DeviceError& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find(text) != std::string::npos);
    if (rank >= 0) {  // -1: any device may report it
      CHECK(e.rank() == rank);
      CHECK(std::string(e.what()).find("device " + std::to_string(rank)) != std::string::npos);
    }
  }
  CHECK(seconds_since(t0) < 5.0);
}

}  // namespace tpcli::testing

// Test support: the read-only ../shared folder (real checkpoints, tokenizers, reference outputs),
// and skipping a test visibly when something it needs is absent.
//
// A test that cannot run ends its process with SKIP_EXIT_CODE, which CMake registers as every
// test's SKIP_RETURN_CODE: ctest then reports it "Skipped", never "Passed" (ctest runs one
// TEST_CASE per process; run by hand, the binary stops at the first skip with exit code 77).
// TPCLI_SHARED_DIR in the environment overrides the folder CMake compiled in (a run without the
// data: TPCLI_SHARED_DIR=/nonexistent ctest).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace tpcli::testing {

constexpr int SKIP_EXIT_CODE = 77;

inline std::string shared_dir() {
  const char* from_env = std::getenv("TPCLI_SHARED_DIR");
  return from_env && *from_env ? std::string(from_env) : std::string(TPCLI_SHARED_DIR);
}

inline std::string shared_path(const std::string& relative) { return shared_dir() + "/" + relative; }

inline bool shared_present(const std::string& relative) { return std::filesystem::exists(shared_path(relative)); }

[[noreturn]] inline void skip_test(const std::string& why) {
  std::fprintf(stderr, "SKIPPED: %s\n", why.c_str());
  std::fflush(nullptr);
  std::_Exit(SKIP_EXIT_CODE);
}

// Skips the running test unless ../shared/RELATIVE exists.
inline void require_shared(const std::string& relative) {
  if (!shared_present(relative)) skip_test(shared_path(relative) + " is absent (shared data not mounted)");
}

}  // namespace tpcli::testing

#define TPCLI_REQUIRE_SHARED(rel) ::tpcli::testing::require_shared(rel)

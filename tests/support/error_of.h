// Test support: the message of the error a call throws, for checking one-line errors.
#pragma once

#include <exception>
#include <functional>
#include <string>

namespace tpcli::testing {

// what() of the Error that `call` throws, or "(no error)"; any other exception propagates (and
// fails the test), so a config test catching ConfigError also checks the error's type.
template <class Error = std::exception>
std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace tpcli::testing

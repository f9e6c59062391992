// tpcli::cli — `tpcli inspect FILE`, and how other files teach it new file kinds.
//
// inspect.cpp knows TOML files (run configs and models/*.toml). A checkpoint format adds itself
// from its own cli/ file, without touching inspect.cpp:
//
//   static const bool registered = tpcli::cli::register_inspector(
//       {"safetensors checkpoint",
//        [](const std::string& path) { return path.ends_with(".safetensors"); },
//        [](const std::string& path, std::ostream& out) { ... print header, config, tensors ... }});
//
// Registered inspectors are asked first, in registration order; the first that accepts the path
// describes it. They report bad files by throwing UsageError (exit 2).
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <vector>

namespace tpcli::cli {

struct Inspector {
  std::string kind;  // "safetensors checkpoint"
  std::function<bool(const std::string& path)> accepts;
  std::function<void(const std::string& path, std::ostream& out)> describe;
};

bool register_inspector(Inspector inspector);
const std::vector<Inspector>& inspectors();

}  // namespace tpcli::cli

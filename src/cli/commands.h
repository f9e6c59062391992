// tpcli::cli — how subcommand files plug into main without main knowing them.
//
// Each file in cli/ registers its subcommand with a static registrar:
//
//   static const bool registered = tpcli::cli::register_command(
//       {"infer", "Generate text with a model split over devices", setup_infer});
//
// `setup` adds options to the CLI11 sub-app and sets its callback. Callbacks report bad input by
// throwing UsageError (one line, exit 2) and runtime failures by throwing std::exception (exit 1);
// main prints "tpcli: <message>" and exits with that code. Benchmarks register under `tpcli bench`
// with register_bench.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace tpcli::cli {

struct Command {
  std::string name;
  std::string description;
  std::function<void(CLI::App& sub)> setup;
};

// Bad flags, config, or input files: printed as one line, exit code 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

bool register_command(Command command);
bool register_bench(Command command);
const std::vector<Command>& commands();
const std::vector<Command>& benches();

}  // namespace tpcli::cli

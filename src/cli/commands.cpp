#include "cli/commands.h"

namespace tpcli::cli {

namespace {

// Function-local statics: registrars in other files run during static initialisation, in an
// order the linker picks, so the lists must exist before the first registration.
std::vector<Command>& command_list() {
  static std::vector<Command> list;
  return list;
}

std::vector<Command>& bench_list() {
  static std::vector<Command> list;
  return list;
}

}  // namespace

bool register_command(Command command) {
  command_list().push_back(std::move(command));
  return true;
}

bool register_bench(Command command) {
  bench_list().push_back(std::move(command));
  return true;
}

const std::vector<Command>& commands() { return command_list(); }
const std::vector<Command>& benches() { return bench_list(); }

}  // namespace tpcli::cli

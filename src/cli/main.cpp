// tpcli — entry point: builds the CLI11 app from the registered subcommands (cli/commands.h) and
// turns errors into one line and an exit code:
//   bad flags (CLI11 parse errors)            -> "tpcli SUBCOMMAND: CLI11's message", one line, exit 2
//   CLI::RuntimeError(code) from a command    -> exit code, nothing printed (the command did)
//   config::ConfigError                       -> "FILE:LINE:COL: message", exit 2
//   cli::UsageError                           -> "tpcli SUBCOMMAND: message", exit 2
//   any other exception                       -> "tpcli: message", exit 1
#include <malloc.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <new>
#include <string>

#include "cli/commands.h"
#include "config/run_config.h"
#include "distributed/mpi/mpi_backend.h"
#include "tensor/isa.h"

namespace {

using tpcli::cli::Command;

// The subcommands every tpcli build has, in help order (each file in cli/ registers its own).
constexpr const char* HELP_ORDER[] = {"train", "infer", "init", "export", "inspect", "launch"};

const Command& find_command(const std::string& name) {
  for (const auto& command : tpcli::cli::commands())
    if (command.name == name) return command;
  throw std::logic_error("subcommand '" + name + "' is not linked into this build");
}

void add_bench(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks");
  for (const auto& b : tpcli::cli::benches()) b.setup(*bench->add_subcommand(b.name, b.description));
  bench->require_subcommand(1);
}

// "tpcli bench matmul": the chain of subcommands the user ran.
std::string command_path(const CLI::App& app) {
  std::string path = "tpcli";
  const CLI::App* current = &app;
  while (current) {
    auto chosen = current->get_subcommands();
    current = chosen.empty() ? nullptr : chosen.front();
    if (current) path += " " + current->get_name();
  }
  return path;
}

// --help and --version print as CLI11 formats them (exit 0); a bad flag is one line like every
// other error, "tpcli infer: --model is required (see --help)", exit 2.
int exit_for_cli11(CLI::App& app, const CLI::Error& e) {
  if (e.get_exit_code() == 0) return app.exit(e);
  std::string message = e.what();
  for (char& c : message)
    if (c == '\n') c = ' ';
  while (!message.empty() && message.back() == ' ') message.pop_back();
  std::cerr << command_path(app) << ": " << message << " (see --help)\n";
  return 2;
}

}  // namespace

// libgomp reads OMP_WAIT_POLICY when the program loads, before main. Its default spins, and
// spinning BLIS threads starve the device threads on a busy 2-core machine (TOOLCHAIN.md records
// the slowdowns), so a run without an explicit policy re-executes itself with "passive".
static void ensure_passive_openmp(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  setenv("OMP_WAIT_POLICY", "passive", 1);
  execv("/proc/self/exe", argv);  // only returns on failure: then run with the default policy
}

// glibc returns freed memory above 128 KB to the kernel and maps big blocks afresh, so a buffer
// allocated and freed per step (a 1 MB ZeroMQ message, a collective's temporary) is page-faulted
// and zeroed again every time; page faults are costly in the VMs these machines are. Keeping up to
// 256 MB of freed heap and mapping only blocks over 32 MB lets those buffers be reused as they
// are (BENCHMARKS.md has what it did to all_sum over ZeroMQ). (Setting the trim threshold alone
// would be worse: it also fixes the mmap threshold at its 128 KB default.)
static void keep_freed_memory() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
}

static int run_command(CLI::App& app, int argc, char** argv);

int main(int argc, char** argv) {
  ensure_passive_openmp(argv);
  keep_freed_memory();
  CLI::App app{"tpcli: train and run Llama-style transformers split over a mesh of devices", "tpcli"};
  app.set_version_flag("--version", std::string("tpcli ") + TPCLI_VERSION);
  app.require_subcommand(1);
  try {
    for (const char* name : HELP_ORDER) {
      const Command& command = find_command(name);
      command.setup(*app.add_subcommand(command.name, command.description));
    }
    add_bench(app);
    for (const auto& command : tpcli::cli::commands()) {
      const bool placed = std::any_of(std::begin(HELP_ORDER), std::end(HELP_ORDER),
                                      [&](const char* name) { return command.name == name; });
      if (!placed) command.setup(*app.add_subcommand(command.name, command.description));
    }
  } catch (const std::exception& e) {  // a missing or doubly registered command: a build mistake
    std::cerr << "tpcli: internal error while building the command line: " << e.what() << "\n";
    return 1;
  }

  const int code = run_command(app, argc, argv);
  // Under mpirun, a rank that fails must end the job: a normal exit would enter MPI_Finalize, which
  // waits for the other ranks, and they wait in a collective for this one.
  if (code != 0) tpcli::dist::mpi_abort_job(code);
  return code;
}

// Parses the command line and runs the chosen subcommand; every error becomes its line and code.
static int run_command(CLI::App& app, int argc, char** argv) {
  try {
    tpcli::tensor::detected_isa();  // a bad TPCLI_ISA is a one-line error before any work
    app.parse(argc, argv);          // runs the chosen subcommand's callback
    return 0;
  } catch (const CLI::RuntimeError& e) {  // CLI::RuntimeError(code): the command printed its own
    return e.get_exit_code();             // message. A ParseError in CLI11 2.1: catch it first.
  } catch (const CLI::ParseError& e) {
    return exit_for_cli11(app, e);
  } catch (const CLI::Error& e) {
    return exit_for_cli11(app, e);
  } catch (const tpcli::config::ConfigError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const tpcli::cli::UsageError& e) {
    std::cerr << command_path(app) << ": " << e.what() << "\n";
    return 2;
  } catch (const std::bad_alloc&) {  // one not caught where it happened (those name their size)
    std::cerr << command_path(app) << ": out of memory (a smaller model, seq_len or batch may fit)\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "tpcli: " << e.what() << "\n";
    return 1;
  }
}

// tpcli launch — run a command as N processes connected by ZeroMQ (see distributed/launcher.h).
//
//   tpcli launch -n 2 -- tpcli infer --model m.bin -z tok.bin -i "Once upon a time" --backend zmq
//   tpcli launch -n 4 --hosts 10.0.0.1,10.0.0.2 --port 29500 -- tpcli train run.toml --backend zmq
//
// A command that names no mesh (no --devices/--mesh, no [mesh] axes) runs on the launched world:
// N processes x --devices-per-process along the tensor axis (cli/common_flags.h).
//
// With --hosts/--hostfile each rank runs through `ssh -o BatchMode=yes` ($TPCLI_SSH replaces "ssh"),
// in the same directory, with the same absolute path to tpcli on every host.
//
// Rank 0's stdout is the run's output, passed through unchanged; everything else goes to stderr
// prefixed "[rank] " (--tag-output prefixes rank 0's stdout too); a stderr line many ranks print
// alike is shown once and counted at the end. The exit code is the first failing rank's.
#include <CLI/CLI.hpp>
#include <memory>
#include <sstream>

#include "cli/commands.h"
#include "distributed/launch/launcher.h"

namespace tpcli::cli {
namespace {

struct LaunchFlags {
  dist::LaunchOptions options;
  std::string hosts;     // "h1,h2"
  std::string hostfile;
  std::vector<std::string> command;
};

std::vector<std::string> split_hosts(const std::string& list) {
  std::vector<std::string> hosts;
  std::stringstream s(list);
  for (std::string h; std::getline(s, h, ',');)
    if (!h.empty()) hosts.push_back(h);
  if (hosts.empty()) throw UsageError("--hosts '" + list + "' names no host");
  return hosts;
}

void setup_launch(CLI::App& sub) {
  auto f = std::make_shared<LaunchFlags>();
  const std::string most = std::to_string(dist::MAX_RANKS_PER_HOST);
  sub.add_option("-n,--processes", f->options.processes, "number of ranks (processes) to start, at most " + most + " per host")
      ->required();
  auto* hosts = sub.add_option("--hosts", f->hosts,
                               "comma-separated hosts ([user@]IPv4 address or name), ranks dealt round-robin, "
                               "started over ssh");
  sub.add_option("--hostfile", f->hostfile, "file with one host per line ('host slots=N' repeats it)")
      ->excludes(hosts);
  sub.add_option("--port", f->options.port, "coordinator port on rank 0's host (default: a free one locally, 29500 with hosts)");
  sub.add_option("--timeout", f->options.timeout_s, "seconds a rank waits for a silent peer before failing")
      ->capture_default_str();
  sub.add_option("--devices-per-process", f->options.devices_per_process, "thread devices in each process")
      ->capture_default_str();
  sub.add_option("--transport", f->options.transport, "between processes: ipc (one host) or tcp (default: ipc locally)")
      ->check(CLI::IsMember({"ipc", "tcp"}));
  sub.add_flag("--tag-output", f->options.tag_output, "prefix rank 0's stdout with [0] too");
  sub.add_option("command", f->command, "the command each rank runs, after --")->required();
  sub.footer(
      "Example: tpcli launch -n 2 -- tpcli infer --model m.bin -z tok.bin -i \"Once\" --backend zmq\n"
      "A command without --devices/--mesh (or a config without [mesh] axes) runs on the launched world:\n"
      "-n processes x --devices-per-process devices along the tensor axis.\n"
      "With --hosts/--hostfile, rank r runs on host r % hosts over `ssh -o BatchMode=yes` (no password\n"
      "prompts: set up keys), cd'd to this directory, with \"tpcli\" meaning this executable's absolute\n"
      "path, which must exist on every host. Ranks bind on their host's address and rank 0 binds the\n"
      "coordinator on the first host's at --port. A remote rank is stopped (SIGTERM, then SIGKILL)\n"
      "when its ssh connection closes.\n"
      "Environment: TPCLI_SSH replaces the ssh command (default \"ssh\", split at spaces; e.g.\n"
      "TPCLI_SSH=\"ssh -p 2222\"); it is called as: TPCLI_SSH -o BatchMode=yes -o ConnectTimeout=S -T\n"
      "HOST 'REMOTE COMMAND'.");
  sub.callback([f] {
    dist::LaunchOptions options = f->options;
    if (!f->hosts.empty()) options.hosts = split_hosts(f->hosts);
    try {
      if (!f->hostfile.empty()) options.hosts = dist::read_hostfile(f->hostfile);
      const int code = dist::launch(options, f->command);
      if (code != 0) throw CLI::RuntimeError(code);  // the ranks printed their own errors
    } catch (const dist::LaunchError& e) {
      throw UsageError(e.what());
    }
  });
}

const bool registered = register_command({"launch", "Run a command as N processes connected by ZeroMQ", setup_launch});

}  // namespace
}  // namespace tpcli::cli

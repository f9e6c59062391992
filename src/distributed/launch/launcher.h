// tpcli::dist — the process launcher behind `tpcli launch`: N ranks of one command, each told its
// place through the environment (as MLX's launcher does with MLX_RANK):
//
//   TPCLI_RANK, TPCLI_WORLD_SIZE, TPCLI_COORDINATOR (tcp://host0:port, bound by rank 0),
//   TPCLI_HOST (the address a rank binds its inbox on), TPCLI_TRANSPORT (ipc when every rank is
//   local, tcp across hosts), TPCLI_TIMEOUT, TPCLI_DEVICES_PER_PROCESS, TPCLI_JOB (a random token
//   naming this launch: the coordinator refuses ranks of other launches).
//
// With hosts, rank r runs on hosts[r % size] through `ssh -o BatchMode=yes -o ConnectTimeout=S -T
// host CMD` (S = min(timeout, 10)); the ssh command itself is $TPCLI_SSH (default "ssh", split at
// spaces). ssh forwards no environment, so CMD carries the TPCLI_* variables (and only those), every
// word shell-quoted:
//
//   exec env TPCLI_RANK=1 ... sh -c WRAPPER tpcli-rank CWD COMMAND...
//
// WRAPPER cds to the launcher's working directory (same paths on every host), starts COMMAND in a
// session of its own and watches its stdin, a pipe from the launcher. When that pipe closes (the
// launcher stops the rank or dies, or the connection drops) it sends COMMAND's process group
// SIGTERM, then SIGKILL 3 s later: a tty-less ssh gives the remote side no SIGHUP, so this lifeline
// is what stops remote ranks (as mpirun's daemons kill their processes when they lose mpirun).
// "tpcli" in COMMAND becomes this executable's absolute path, which must exist on every host.
// TPCLI_HOST and the coordinator are each host's IPv4 address (a name is resolved on the launcher's
// machine; "user@host" binds on host). ssh's exit code 255 is reported as a failure to reach the host.
//
// Output: rank 0's stdout is passed through byte for byte (it is the run's output: redirect it,
// diff it); every other stream goes to stderr one line at a time, prefixed "[rank] ". With
// tag_output every line of every rank is prefixed, stdout lines to stdout.
//
// A stderr line several ranks print alike is shown once, from the first of them, and noted at the end as
// "tpcli launch: (990 processes) LINE": a thousand ranks failing alike make two lines, not 990.
//
// When a rank fails (non-zero exit or a signal) the others get SIGTERM, then SIGKILL after a grace
// period; launch returns the failed rank's exit code (128 + signal for a signal). Local ranks (and
// ssh clients) die with the launcher (PR_SET_PDEATHSIG), so a killed launcher leaves no orphans.
//
// Ctrl-C: each rank runs in a process group of its own, so a terminal's SIGINT reaches only the
// launcher. The first SIGINT or SIGTERM is passed to rank 0 alone, which stops as it does when run
// alone (serve drains its requests, train saves) and ends the other ranks through its collectives;
// those still running kill_grace_s after rank 0 ended are stopped. A second signal stops every rank
// at once. (A remote rank 0 gets the signal as its ssh client's end: SIGTERM through the lifeline.)
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace tpcli::dist {

// Ranks one host may run. Each rank is a process with its own threads, sockets and copy of the
// weights: far past the cores it only thrashes, and a mistyped -n 1000 would fork a thousand.
// --devices-per-process adds devices without processes.
constexpr int MAX_RANKS_PER_HOST = 256;

struct LaunchOptions {
  int processes = 1;                 // -n: ranks to start, at most MAX_RANKS_PER_HOST on any host
  std::vector<std::string> hosts;    // empty: all on this machine; else rank r runs on hosts[r % size] over ssh
  int port = 0;                      // coordinator port; 0: a free one (local) or 29500 (hosts)
  int timeout_s = 30;                // passed to the ranks (TPCLI_TIMEOUT)
  int devices_per_process = 1;       // passed to the ranks (TPCLI_DEVICES_PER_PROCESS)
  std::string transport;             // "" (ipc when local, tcp across hosts), "tcp" or "ipc"
  bool tag_output = false;           // prefix rank 0's stdout too
  int out_fd = 1;                    // where forwarded stdout goes
  int err_fd = 2;                    // where forwarded stderr (and the launcher's notes) go
  double kill_grace_s = 3.0;         // SIGTERM -> SIGKILL delay when stopping the ranks
  bool stop_on_failure = true;       // false: let the other ranks notice a failure themselves (tests)
  std::string ssh;                   // with hosts: the ssh command, split at spaces; empty: $TPCLI_SSH or "ssh"
};

// Bad launch options (port in use, empty command, unreadable hostfile, unresolvable host): one line,
// before any start.
class LaunchError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Runs `command` as options.processes ranks and waits for all of them. A command starting with
// "tpcli" runs this very executable. Returns 0 if every rank succeeded, else the first failure's code.
int launch(const LaunchOptions& options, std::vector<std::string> command);

// One host per line; blank lines and '#' comments are skipped; "host slots=N" repeats the host N times.
std::vector<std::string> read_hostfile(const std::string& path);

// The path of the running executable (/proc/self/exe).
std::string self_executable();

}  // namespace tpcli::dist

// Test support: runs the tpcli binary (TPCLI_BINARY) as a user would, through the shell, and
// captures its stdout, stderr, exit code and wall time. One helper for every suite that drives
// the binary, so quoting, capture and exit-code decoding are written once.
#pragma once

#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "support/temp_dir.h"

namespace tpcli::testing {

struct RunResult {
  int code = -1;  // exit code; 128 + the signal number if killed by one (as the shell reports it)
  std::string out, err;
  double seconds = 0;  // wall time of the whole command
};

struct RunOptions {
  std::string cwd;                   // folder to run in; "" = the test's own working directory
  std::string environment;           // "NAME=value ..." set for tpcli only; "" = inherited as is
  std::optional<std::string> input;  // text on stdin; none = stdin from /dev/null
  int timeout_seconds = 0;           // > 0: killed by timeout(1) after this long (exit 124)
  std::string launcher;              // shell words before the binary, e.g. "mpirun -n 2" ("" = none)
  std::string binary = TPCLI_BINARY; // the program to run
};

// `arg` as one shell word, whatever it contains.
inline std::string shell_quote(const std::string& arg) {
  std::string quoted = "'";
  for (char c : arg) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// Runs tpcli with `command_line` after the binary, split into words by the shell (so quotes in it
// are honoured and the caller quotes what needs it).
inline RunResult run_tpcli_line(const std::string& command_line, const RunOptions& options = {}) {
  const TempDir capture;
  const std::string out = (capture.path() / "out").string(), err = (capture.path() / "err").string();
  const std::string in = options.input ? capture.write("in", *options.input) : std::string("/dev/null");
  std::string command;
  if (!options.cwd.empty()) command += "cd " + shell_quote(options.cwd) + " && ";
  if (!options.environment.empty()) command += options.environment + " ";
  if (options.timeout_seconds > 0) command += "timeout " + std::to_string(options.timeout_seconds) + " ";
  if (!options.launcher.empty()) command += options.launcher + " ";
  command += shell_quote(options.binary) + " " + command_line;
  command += " <" + shell_quote(in) + " >" + shell_quote(out) + " 2>" + shell_quote(err);
  const auto start = std::chrono::steady_clock::now();
  const int status = std::system(command.c_str());
  RunResult result;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.out = slurp(out);
  result.err = slurp(err);
  return result;
}

// Runs tpcli with `args`, each passed as one argument exactly as given.
inline RunResult run_tpcli(const std::vector<std::string>& args, const RunOptions& options = {}) {
  std::string command_line;
  for (const auto& arg : args) {
    if (!command_line.empty()) command_line += ' ';
    command_line += shell_quote(arg);
  }
  return run_tpcli_line(command_line, options);
}

}  // namespace tpcli::testing

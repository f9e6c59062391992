// tpcli::cli — `tpcli serve` run as a child of this same binary, for `tpcli bench serve --model`:
// started on a free loopback port, waited for until GET /health answers 200, and stopped with SIGTERM
// (then SIGKILL after a grace period) when the handle goes, even when the benchmark throws.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace tpcli::cli {

class ServeChild {
 public:
  // Runs `tpcli serve --model MODEL --host 127.0.0.1 --port P EXTRA...` and waits up to `ready_s`
  // seconds for /health; throws std::runtime_error (naming the exit status) if it dies or stays silent.
  ServeChild(const std::string& model, const std::vector<std::string>& extra_args, int ready_s);
  ~ServeChild();
  ServeChild(const ServeChild&) = delete;
  ServeChild& operator=(const ServeChild&) = delete;

  const std::string& url() const { return url_; }

 private:
  void wait_until_healthy(int ready_s);
  void stop();

  pid_t pid_ = -1;
  std::string url_;
};

}  // namespace tpcli::cli

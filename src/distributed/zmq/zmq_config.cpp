// tpcli::dist — ZmqConfig from the TPCLI_* variables `tpcli launch` sets, and fnv1a. Needs no
// ZeroMQ: commands read the launched world from here even in a build without the zmq backend.
#include "distributed/zmq/zmq_config.h"

#include <arpa/inet.h>
#include <netdb.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <numeric>
#include <stdexcept>

namespace tpcli::dist {

namespace {

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error("zmq: " + what); }

int env_int(const char* name, int fallback, bool required) {
  const char* v = std::getenv(name);
  if (!v || !*v) {
    if (required) fail(std::string(name) + " is not set (start ranks with `tpcli launch`)");
    return fallback;
  }
  try {
    size_t used = 0;
    int x = std::stoi(v, &used);
    if (used != std::strlen(v)) throw std::invalid_argument(v);
    return x;
  } catch (const std::exception&) {
    fail(std::string(name) + "=" + v + " is not an integer");
  }
}

std::string env_str(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

// TPCLI_HOST as an IPv4 address ZeroMQ can bind and peers can reach: names are resolved here
// (ZeroMQ binds only to addresses and interfaces), wildcards refused (peers cannot dial them).
std::string inbox_host(const std::string& host, int world_size) {
  if ((host == "*" || host == "0.0.0.0") && world_size > 1)
    fail("TPCLI_HOST=" + host + " cannot be given to the other ranks: set this host's own address");
  in_addr numeric{};
  if (host == "*" || inet_pton(AF_INET, host.c_str(), &numeric) == 1) return host;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || !found)
    fail("TPCLI_HOST=" + host + " does not resolve to an IPv4 address");
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr, text, sizeof text);
  freeaddrinfo(found);
  return text;
}

}  // namespace

uint64_t fnv1a(std::string_view bytes, uint64_t h) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

bool ZmqConfig::in_env() {
  const char* v = std::getenv("TPCLI_RANK");
  return v && *v;
}

ZmqConfig ZmqConfig::from_env() {
  ZmqConfig c;
  c.rank = env_int("TPCLI_RANK", 0, true);
  c.world_size = env_int("TPCLI_WORLD_SIZE", 1, true);
  c.coordinator = env_str("TPCLI_COORDINATOR", "");
  if (c.coordinator.empty()) fail("TPCLI_COORDINATOR is not set (start ranks with `tpcli launch`)");
  if (c.coordinator.find("://") == std::string::npos) c.coordinator = "tcp://" + c.coordinator;
  c.transport = env_str("TPCLI_TRANSPORT", c.transport);
  c.host = env_str("TPCLI_HOST", c.host);
  c.devices_per_process = env_int("TPCLI_DEVICES_PER_PROCESS", 1, false);
  c.timeout_s = env_int("TPCLI_TIMEOUT", 30, false);
  c.shared_memory = env_int("TPCLI_SHM", 1, false) != 0;
  c.job = env_str("TPCLI_JOB", c.job);
  if (c.job.find_first_of(" \t\n") != std::string::npos) fail("TPCLI_JOB='" + c.job + "' must be one word");
  if (c.world_size < 1) fail("TPCLI_WORLD_SIZE=" + std::to_string(c.world_size) + " must be at least 1");
  if (c.rank < 0 || c.rank >= c.world_size)
    fail("TPCLI_RANK=" + std::to_string(c.rank) + " is outside TPCLI_WORLD_SIZE=" + std::to_string(c.world_size));
  if (c.devices_per_process < 1)
    fail("TPCLI_DEVICES_PER_PROCESS=" + std::to_string(c.devices_per_process) + " must be at least 1");
  if (c.timeout_s <= 0) fail("TPCLI_TIMEOUT must be a positive number of seconds");
  if (c.transport != "tcp" && c.transport != "ipc") fail("TPCLI_TRANSPORT=" + c.transport + " must be tcp or ipc");
  if (c.transport == "tcp") c.host = inbox_host(c.host, c.world_size);
  // Same command line on every rank (the launcher starts them all with one).
  std::ifstream cmdline("/proc/self/cmdline", std::ios::binary);
  c.config_hash = fnv1a(std::string((std::istreambuf_iterator<char>(cmdline)), std::istreambuf_iterator<char>()));
  return c;
}

std::vector<int> zmq_local_ranks(const ZmqConfig& config) {
  std::vector<int> ranks(static_cast<size_t>(config.devices_per_process));
  std::iota(ranks.begin(), ranks.end(), config.rank * config.devices_per_process);
  return ranks;
}

bool is_primary_process() {
  const char* v = std::getenv("TPCLI_RANK");
  return !v || !*v || std::string(v) == "0";
}

}  // namespace tpcli::dist

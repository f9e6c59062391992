// serve/: `tpcli serve` as a user runs it: SIGTERM lets what runs finish and exits 0; two zmq
// processes answer as the thread backend does; a port in use or a bad flag is one line, exit 2.
#include <catch2/catch.hpp>

#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "distributed/mpi/mpi_backend.h"
#include "formats/llama2c.h"
#include "formats/peft_adapter.h"
#include "model/lora_adapter.h"
#include "model/random_lora.h"
#include "support/run_tpcli.h"
#include "support/shared_data.h"

using namespace tpcli::testing;
using nlohmann::json;

namespace {

// A port nobody listens on now (bound, read, released).
int free_port() {
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t n = sizeof a;
  getsockname(s, reinterpret_cast<sockaddr*>(&a), &n);
  close(s);
  return ntohs(a.sin_port);
}

std::vector<std::string> serve_args(int port, const std::vector<std::string>& extra) {
  std::vector<std::string> args = {TPCLI_BINARY, "serve", "--model", shared_path("data/stories260K.bin"), "-z",
                                   shared_path("data/tok512.bin"), "--template", "zephyr", "--port", std::to_string(port)};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// A process started in the background, its output in a temporary folder; waited for at the end.
// `own_group`: in a process group of its own, as a terminal's foreground job (signal_group: Ctrl-C).
class Background {
 public:
  explicit Background(const std::vector<std::string>& args, bool own_group = false) {
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    posix_spawn_file_actions_t files;
    posix_spawn_file_actions_init(&files);
    posix_spawn_file_actions_addopen(&files, 1, (dir_.path() / "out").c_str(), O_WRONLY | O_CREAT, 0644);
    posix_spawn_file_actions_addopen(&files, 2, (dir_.path() / "err").c_str(), O_WRONLY | O_CREAT, 0644);
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    if (own_group) {
      posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
      posix_spawnattr_setpgroup(&attributes, 0);
    }
    posix_spawn(&pid_, argv[0], &files, &attributes, argv.data(), environ);
    posix_spawnattr_destroy(&attributes);
    posix_spawn_file_actions_destroy(&files);
  }
  ~Background() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  void signal(int s) const { kill(pid_, s); }
  void signal_group(int s) const { kill(-pid_, s); }
  // The exit code (128 + signal when killed), waiting up to `seconds`; -1 if it is still running.
  int wait(int seconds) {
    for (int i = 0; i < seconds * 20; ++i) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = 0;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return -1;
  }
  std::string err() const { return slurp((dir_.path() / "err").string()); }

 private:
  TempDir dir_;
  pid_t pid_ = 0;
};

// A stream of 400 tokens from the server on `port`, started on its own thread: `streaming` turns
// true with the first bytes; `body` holds them all once the thread is joined.
std::thread stream_400_tokens(int port, std::string& body, std::atomic<bool>& streaming) {
  return std::thread([port, &body, &streaming] {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = json{{"prompt", "Once"}, {"max_tokens", 400}, {"ignore_eos", true}, {"stream", true}}.dump();
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      body.append(data, n);
      streaming = true;
      return true;
    };
    c.send(req);
  });
}

bool healthy(int port, int seconds) {
  httplib::Client c("127.0.0.1", port);
  for (int i = 0; i < seconds * 10; ++i) {
    if (const auto r = c.Get("/health"); r && r->status == 200) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

std::string chat(int port, int seed) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60);
  const json body = {{"messages", {{{"role", "user"}, {"content", "Tell me about a dog."}}}}, {"max_tokens", 40}, {"temperature", 0.9}, {"seed", seed}};
  const auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  return r && r->status == 200 ? json::parse(r->body)["choices"][0]["message"]["content"].get<std::string>() : "(failed)";
}

}  // namespace

TEST_CASE("serve cli: SIGTERM stops accepting, lets a running stream finish and exits 0", "[serve]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  const int port = free_port();
  Background server(serve_args(port, {"--devices", "2", "--grace", "20"}));
  REQUIRE(healthy(port, 30));
  std::atomic<bool> streaming{false};
  std::string body;
  std::thread client = stream_400_tokens(port, body, streaming);
  while (!streaming) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  server.signal(SIGTERM);
  client.join();
  CHECK(server.wait(30) == 0);
  CHECK(body.find("\"finish_reason\":\"length\"") != std::string::npos);
  CHECK(body.ends_with("data: [DONE]\n\n"));
  httplib::Client after("127.0.0.1", port);
  CHECK(!after.Get("/health"));  // nobody listens any more
}

TEST_CASE("serve cli: two zmq processes answer as the thread backend does", "[serve][zmq]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  const int threads_port = free_port();
  std::string threads_answer;
  {
    Background threads(serve_args(threads_port, {"--devices", "2"}));
    REQUIRE(healthy(threads_port, 30));
    threads_answer = chat(threads_port, 5);
    threads.signal(SIGTERM);
    CHECK(threads.wait(30) == 0);
  }
  const int zmq_port = free_port();
  std::vector<std::string> launch = {TPCLI_BINARY, "launch", "-n", "2", "--"};
  for (const std::string& a : serve_args(zmq_port, {"--backend", "zmq"})) launch.push_back(a);
  Background zmq(launch);
  REQUIRE(healthy(zmq_port, 30));
  CHECK(chat(zmq_port, 5) == threads_answer);
  CHECK(threads_answer != "(failed)");
}

// Issue 39: Ctrl-C on `tpcli launch -n 2 -- tpcli serve --backend zmq` reached every rank at once
// (the terminal signals the whole foreground group, and the launcher stopped all ranks): a running
// stream ended without [DONE]. Now only the launcher gets it, and passes it to rank 0, which drains.
TEST_CASE("serve cli: Ctrl-C on launch -n 2 serve --backend zmq drains as one server does, exit 0", "[serve][zmq]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  const int port = free_port();
  std::vector<std::string> launch = {TPCLI_BINARY, "launch", "-n", "2", "--"};
  for (const std::string& a : serve_args(port, {"--backend", "zmq", "--grace", "20"})) launch.push_back(a);
  Background launcher(launch, /*own_group=*/true);
  REQUIRE(healthy(port, 30));
  std::atomic<bool> streaming{false};
  std::string body;
  std::thread client = stream_400_tokens(port, body, streaming);
  while (!streaming) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  launcher.signal_group(SIGINT);  // what a terminal's Ctrl-C does
  client.join();
  INFO(launcher.err());
  CHECK(launcher.wait(30) == 0);
  CHECK(launcher.err().find("tpcli launch: got Interrupt; passed to rank 0") != std::string::npos);
  CHECK(launcher.err().find("stopping all ranks") == std::string::npos);
  CHECK(body.find("\"finish_reason\":\"length\"") != std::string::npos);
  CHECK(body.ends_with("data: [DONE]\n\n"));
}

// Issue 39: under mpirun, a frozen rank (SIGSTOP) left the server without an answer and /health ok.
// Now /health says the devices are stuck, and within TPCLI_TIMEOUT the request fails 500 naming the
// rank, and the job ends.
TEST_CASE("serve cli: mpirun -n 2 serve with rank 1 frozen: /health says stuck, the request gets 500 naming it", "[serve][mpi]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  if (!tpcli::dist::mpi_available()) skip_test("this build has no MPI backend");
  const TempDir dir;
  const std::string pid_file = (dir.path() / "rank1.pid").string();
  const int port = free_port();
  std::string command = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 "
                        "TPCLI_TIMEOUT=5 exec timeout 60 mpirun --oversubscribe -n 2 sh -c "
                        "'if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then echo $$ > " + pid_file + "; fi; exec \"$@\"' sh";
  for (const std::string& a : serve_args(port, {"--backend", "mpi"})) command += " " + shell_quote(a);
  Background job({"/bin/sh", "-c", command});
  REQUIRE(healthy(port, 60));
  const pid_t rank1 = std::stoi(slurp(pid_file));
  REQUIRE(kill(rank1, SIGSTOP) == 0);

  const auto start = std::chrono::steady_clock::now();
  int status = 0;
  std::string answer;
  std::thread client([&] {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60);
    if (const auto r = c.Post("/v1/completions", json{{"prompt", "Once"}, {"max_tokens", 20}}.dump(), "application/json")) {
      status = r->status;
      answer = r->body;
    }
  });
  std::this_thread::sleep_for(std::chrono::seconds(3));  // past DEVICES_STUCK_AFTER, before the timeout
  httplib::Client health("127.0.0.1", port);
  const auto during = health.Get("/health");
  client.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  kill(rank1, SIGCONT);  // in case the job is still there, so that it can end
  INFO(job.err());
  REQUIRE(during);
  CHECK(during->status == 503);
  CHECK(during->body.find("\"stuck\"") != std::string::npos);
  CHECK(status == 500);
  CHECK(answer.find("got nothing from rank 1") != std::string::npos);
  CHECK(seconds < 15);
  const int code = job.wait(30);
  CHECK(code != 0);
  CHECK(code != -1);
  CHECK(code != 124);
}

TEST_CASE("serve cli: --adapter answers alike on 1 and 2 devices, and otherwise than the base", "[serve][lora]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  const TempDir dir;
  const std::string adapter = (dir.path() / "adapter").string();
  {
    const tpcli::formats::Llama2cFile file(shared_path("data/stories260K.bin"));
    std::vector<int> layers;
    for (int l = 0; l < file.config().n_layers; ++l) layers.push_back(l);
    tpcli::formats::save_peft_adapter(adapter, random_adapter(file.config(), LORA_ALL, layers, 4, 51), file.config());
  }
  auto answer = [&](const std::vector<std::string>& extra) {
    const int port = free_port();
    Background server(serve_args(port, extra));
    REQUIRE(healthy(port, 30));
    const std::string text = chat(port, 5);
    server.signal(SIGTERM);
    CHECK(server.wait(30) == 0);
    return text;
  };
  const std::string one = answer({"--adapter", adapter});
  CHECK(one != "(failed)");
  CHECK(answer({"--adapter", adapter, "--devices", "2"}) == one);
  CHECK(answer({}) != one);
}

TEST_CASE("serve cli: a port in use, a missing model and bad flags are one line and exit 2", "[serve]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  const int port = free_port();
  Background first(serve_args(port, {}));
  REQUIRE(healthy(port, 30));
  const std::string model = shell_quote(shared_path("data/stories260K.bin")), tokenizer = shell_quote(shared_path("data/tok512.bin"));
  const std::string base = "serve --model " + model + " -z " + tokenizer + " ";
  const struct {
    std::string flags, names;
  } cases[] = {{"--port " + std::to_string(port), std::to_string(port)},
               {"--port 70000", "--port"},
               {"--parallel 0", "--parallel"},
               {"--kv-memory 12", "--kv-memory"},
               {"--kv-dtype q4", "--kv-dtype q4: not a KV cache type (f32, bf16 or f16)"},
               {"--template nonsense", "nonsense"},
               {"--template zephyr --reasoning-parser nope", "--reasoning-parser nope: not a reasoning parser (deepseek_r1, "},
               // Issue 39: sizes past int64_t, or past the machine, named before the model loads.
               {"--kv-memory 9223372036854775807", "--kv-memory 9223372036854775807: not a size"},
               {"--kv-memory 1e30G", "--kv-memory 1e30G: not a size"},
               {"--kv-memory 100000G", "more than this machine's"},
               {"--kv-blocks 2147483647", "--kv-blocks 2147483647: a KV pool of"}};
  for (const auto& c : cases) {
    INFO(c.flags);
    const RunResult r = run_tpcli_line(base + c.flags, {.timeout_seconds = 30});
    CHECK(r.code == 2);
    CHECK(r.err.find(c.names) != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
  const RunResult missing = run_tpcli_line("serve --model /nonexistent.bin", {.timeout_seconds = 30});
  CHECK(missing.code == 2);
  CHECK(missing.err.find("/nonexistent.bin") != std::string::npos);
}

// Issue 39: --max-queue (or --parallel) near INT_MAX overflowed the queue's bound: every request got
// 429 "0 requests are waiting or running".
TEST_CASE("serve cli: --max-queue and --parallel at INT_MAX take requests", "[serve]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  for (const char* flag : {"--max-queue", "--parallel"}) {
    INFO(flag);
    const int port = free_port();
    Background server(serve_args(port, {flag, "2147483647", "--kv-blocks", "64"}));  // not an eighth of memory
    REQUIRE(healthy(port, 30));
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60);
    const auto r = c.Post("/v1/completions", json{{"prompt", "Once"}, {"max_tokens", 5}}.dump(), "application/json");
    REQUIRE(r);
    CHECK(r->status == 200);
    server.signal(SIGTERM);
    CHECK(server.wait(30) == 0);
  }
}

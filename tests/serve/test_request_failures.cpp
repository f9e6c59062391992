// serve/: what one request meets ends that request, never the server. Stop strings met as the
// sequence reaches max_tokens, and clients hanging up one event before the end, make the HTTP
// thread cancel sequences the engine has already finished and forgotten, hundreds of times over;
// a model whose embedding row 300 holds +inf fails the requests that feed token 300 (a 500, or an
// error event in a stream, counted in /metrics) while the others are answered as alone.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "live_server.h"
#include "support/poisoned_model.h"

using namespace tpcli;
using namespace tpcli::testing;
using nlohmann::json;

namespace {

// Reads a stream's server-sent events until `leave_after` of them came (0: to the end); the raw text.
std::string stream_text(httplib::Client& c, const json& body, size_t leave_after = 0) {
  std::string text;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    text.append(data, n);
    size_t events = 0;
    for (size_t at = 0; (at = text.find("data: ", at)) != std::string::npos; at += 6) ++events;
    return !leave_after || events < leave_after;
  };
  c.send(req);
  return text;
}

}  // namespace

TEST_CASE("serve failures: stop strings met at max_tokens and clients leaving one event early never end the server", "[serve]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  LiveServer server(2);
  constexpr int CLIENTS = 6, ROUNDS = 50;
  std::atomic<int> answered{0}, refused{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < CLIENTS; ++i)
    clients.emplace_back([&, i] {
      httplib::Client c = server.client();
      for (int r = 0; r < ROUNDS; ++r) {
        // Greedy answers of stories260K meet "\n" or "." within a few dozen tokens: max_tokens around
        // there makes the stop string and the sequence's end race.
        json body = {{"prompt", "Once upon a time"}, {"max_tokens", 8 + (i * ROUNDS + r) % 56}, {"temperature", 0}, {"stop", {"\n", "."}}};
        if (r % 3 == 2) {
          body["stream"] = true;
          stream_text(c, body, static_cast<size_t>(body["max_tokens"].get<int>() - 1));  // hangs up one event before the end
          continue;
        }
        const auto res = c.Post("/v1/completions", body.dump(), "application/json");
        (res && res->status == 200 ? answered : refused)++;
      }
    });
  for (std::thread& t : clients) t.join();
  CHECK(refused == 0);
  CHECK(answered == CLIENTS * (ROUNDS - ROUNDS / 3));
  httplib::Client c = server.client();
  const auto health = c.Get("/health");
  REQUIRE(health);
  CHECK(health->status == 200);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (metric(c, "tpcli_kv_blocks_used") > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(metric(c, "tpcli_kv_blocks_used") == 0);
}

TEST_CASE("serve failures: a request whose logits are not finite fails alone, and the server and its neighbours go on", "[serve]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  const std::string folder = std::filesystem::temp_directory_path().string() + "/tpcli-serve-failures";
  std::filesystem::create_directories(folder);
  const std::string model = folder + "/stories260K-inf.bin";
  write_poisoned_stories260k(300, model);
  json clean_body = {{"prompt", "Once upon a time"}, {"max_tokens", 12}, {"temperature", 0}};
  std::string clean_alone;
  {
    LiveServer healthy(1);
    httplib::Client c = healthy.client();
    const auto res = c.Post("/v1/completions", clean_body.dump(), "application/json");
    REQUIRE(res);
    REQUIRE(res->status == 200);
    clean_alone = json::parse(res->body)["choices"][0]["text"];
  }
  LiveServer server(2, {}, {}, model);
  httplib::Client c = server.client();
  const json poisoned_body = {{"prompt", {1, 300, 45}}, {"max_tokens", 5}};
  std::string stream_events;
  std::thread neighbour_streams([&] {
    httplib::Client s = server.client();
    json body = poisoned_body;
    body["stream"] = true;
    stream_events = stream_text(s, body);
  });
  const auto failed = c.Post("/v1/completions", poisoned_body.dump(), "application/json");
  neighbour_streams.join();
  REQUIRE(failed);
  INFO(failed->body);
  CHECK(failed->status == 500);
  CHECK(json::parse(failed->body)["error"]["message"].get<std::string>().find("not finite") != std::string::npos);
  INFO(stream_events);
  CHECK(stream_events.find("\"error\"") != std::string::npos);
  CHECK(stream_events.find("not finite") != std::string::npos);
  CHECK(stream_events.find("data: [DONE]") != std::string::npos);
  const auto clean = c.Post("/v1/completions", clean_body.dump(), "application/json");
  REQUIRE(clean);
  INFO(clean->body);
  REQUIRE(clean->status == 200);
  CHECK(json::parse(clean->body)["choices"][0]["text"] == clean_alone);
  CHECK(metric(c, "tpcli_failed_requests_total") == 2);
  CHECK(c.Get("/health")->status == 200);
}

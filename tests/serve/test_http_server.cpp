// serve/: the OpenAI API over a live 2-device server (stories260K): every endpoint, streams in
// OpenAI's shape equal to whole answers, stop strings, log-probabilities, the errors' shapes, and
// 64 concurrent streaming clients (some leaving mid-stream) each getting the very answer it gets
// alone; a client that leaves frees its KV blocks.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "live_server.h"
#include <cmath>
#include "serve/engine_service.h"

using namespace tpcli;
using namespace tpcli::testing;
using nlohmann::json;

namespace {

json post(httplib::Client& c, const std::string& path, const json& body, int want_status = 200) {
  const auto res = c.Post(path.c_str(), body.dump(), "application/json");
  REQUIRE(res);
  INFO(res->body);
  REQUIRE(res->status == want_status);
  return json::parse(res->body);
}

// The data: events of a stream, parsed ("[DONE]" as a string); `leave_after` events, then the
// client hangs up (0: read to the end; an answer other than 200 leaves no events). No Catch2
// assertions: clients run on threads.
std::vector<json> stream(httplib::Client& c, const std::string& path, const json& body, size_t leave_after = 0) {
  std::string buffer;
  std::vector<json> events;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buffer.append(data, n);
    for (size_t end; (end = buffer.find("\n\n")) != std::string::npos; buffer.erase(0, end + 2)) {
      const std::string event = buffer.substr(0, end);
      if (!event.starts_with("data: ")) continue;  // a comment
      const std::string data = event.substr(6);
      events.push_back(data == "[DONE]" ? json("[DONE]") : json::parse(data));
      if (leave_after && events.size() >= leave_after) return false;
    }
    return true;
  };
  const httplib::Result res = c.send(req);
  if (!leave_after && (!res || res->status != 200)) return {};
  return events;
}

std::string joined_deltas(const std::vector<json>& events) {
  std::string text;
  for (const json& e : events)
    if (e.is_object() && e.contains("choices") && !e["choices"].empty()) {
      const json& choice = e["choices"][0];
      text += choice.contains("delta") ? choice["delta"].value("content", "") : choice.value("text", "");
    }
  return text;
}

json chat_body(const std::string& user, int max_tokens, double temperature, int seed) {
  return {{"model", "stories260K"},
          {"messages", {{{"role", "system"}, {"content", "You tell stories."}}, {{"role", "user"}, {"content", user}}}},
          {"max_tokens", max_tokens},
          {"temperature", temperature},
          {"seed", seed}};
}

}  // namespace

TEST_CASE("serve: health, models, tokenize, status, metrics, the page, and errors in OpenAI's shape", "[serve]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  serve::ServerOptions options;
  options.max_body_bytes = 1 << 16;
  LiveServer server(2, {}, options);
  httplib::Client c = server.client();
  CHECK(c.Get("/health")->status == 200);
  const json models = json::parse(c.Get("/v1/models")->body);
  CHECK(models["data"][0]["id"] == "stories260K");
  const json tokens = post(c, "/tokenize", {{"content", "Once upon a time"}});
  CHECK(tokens["tokens"][0] == 1);  // the beginning of sequence
  json text_ids = tokens["tokens"];
  text_ids.erase(0);
  CHECK(post(c, "/detokenize", {{"tokens", text_ids}})["content"] == "Once upon a time");
  const json status = json::parse(c.Get("/status")->body);
  CHECK(status["devices"] == 2);
  CHECK(status["context"] == 512);
  CHECK(c.Get("/")->get_header_value("Content-Type").starts_with("text/html"));

  const auto unknown = c.Get("/v2/nothing");
  CHECK(unknown->status == 404);
  CHECK(json::parse(unknown->body)["error"]["code"] == "not_found");
  const auto big = c.Post("/v1/completions", std::string(1 << 17, ' '), "application/json");
  CHECK(big->status == 413);
  CHECK(json::parse(big->body).contains("error"));
  const auto bad = c.Post("/v1/chat/completions", "{\"messages\": [", "application/json");
  CHECK(bad->status == 400);
  CHECK(json::parse(bad->body)["error"]["type"] == "invalid_request_error");
  const json too_long = post(c, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 100000}}, 400);
  CHECK(too_long["error"]["param"] == "max_tokens");
  CHECK(too_long["error"]["code"] == "context_length_exceeded");
  post(c, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 4}});
  const std::string metrics = c.Get("/metrics")->body;
  CHECK(metrics.find("tpcli_requests_total{status=\"400\"} 2") != std::string::npos);
  CHECK(metrics.find("tpcli_generation_tokens_total 4") != std::string::npos);
  CHECK(metrics.find("tpcli_time_to_first_token_seconds_count 1") != std::string::npos);
}

TEST_CASE("serve: an API key guards all but the page and /health, and a port in use is an error", "[serve]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  serve::ServerOptions options;
  options.api_key = "sesame";
  LiveServer server(1, {}, options);
  httplib::Client c = server.client();
  CHECK(c.Get("/health")->status == 200);
  const auto refused = c.Get("/v1/models");
  CHECK(refused->status == 401);
  CHECK(json::parse(refused->body)["error"]["type"] == "authentication_error");
  CHECK(c.Get("/v1/models", {{"Authorization", "Bearer sesame"}})->status == 200);
  CHECK(c.Get("/v1/models", {{"Authorization", "Bearer sesamE"}})->status == 401);

  serve::EngineService other({});
  serve::ServerOptions same_port;
  same_port.port = server.port();
  serve::HttpServer second(other, {}, same_port);
  CHECK_THROWS_WITH(second.bind(), Catch::Contains(std::to_string(server.port())));
}

TEST_CASE("serve: a stream is OpenAI's chunks and joins to the whole answer, and stop strings and log-probabilities", "[serve]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  LiveServer server(2);
  httplib::Client c = server.client();
  json body = chat_body("Tell me about a cat.", 40, 0.0, 1);
  const json whole = post(c, "/v1/chat/completions", body);
  const std::string text = whole["choices"][0]["message"]["content"];
  REQUIRE(text.size() > 10);
  CHECK(whole["object"] == "chat.completion");
  CHECK(whole["usage"]["completion_tokens"].get<int>() <= 40);

  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  const std::vector<json> events = stream(c, "/v1/chat/completions", body);
  REQUIRE(events.size() >= 4);
  CHECK(events.front()["choices"][0]["delta"]["role"] == "assistant");
  CHECK(events.back() == "[DONE]");
  const json& usage = events[events.size() - 2];
  CHECK(usage["choices"].empty());
  CHECK(usage["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"]);
  CHECK(usage["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]);
  CHECK(usage["usage"]["prompt_tokens_details"]["cached_tokens"] > 0);  // the same prompt again
  CHECK(events[events.size() - 3]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]);
  CHECK(joined_deltas(events) == text);

  // A stop string from the middle of the answer ends it there, unsent.
  const std::string stop = text.substr(text.size() / 2, 3);
  json stopped = chat_body("Tell me about a cat.", 40, 0.0, 1);
  stopped["stop"] = stop;
  const json cut = post(c, "/v1/chat/completions", stopped);
  CHECK(cut["choices"][0]["message"]["content"] == text.substr(0, text.find(stop)));
  CHECK(cut["choices"][0]["finish_reason"] == "stop");
  stopped["stream"] = true;
  CHECK(joined_deltas(stream(c, "/v1/chat/completions", stopped)) == text.substr(0, text.find(stop)));

  // Greedy: each token is its own likeliest alternative.
  json asked = chat_body("Tell me about a cat.", 12, 0.0, 1);
  asked["logprobs"] = true;
  asked["top_logprobs"] = 3;
  const json lp = post(c, "/v1/chat/completions", asked)["choices"][0]["logprobs"]["content"];
  REQUIRE(lp.size() == 12);
  for (const json& e : lp) {
    CHECK(e["logprob"].get<double>() <= 0);
    REQUIRE(e["top_logprobs"].size() == 3);
    CHECK(e["top_logprobs"][0]["token"] == e["token"]);
    CHECK(e["top_logprobs"][0]["logprob"] == e["logprob"]);
  }
  const json completion = post(c, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}, {"logprobs", 2}});
  CHECK(completion["object"] == "text_completion");
  CHECK(completion["choices"][0]["logprobs"]["tokens"].size() == 8);
}

TEST_CASE("serve: a stop string ends its sequence at the step that produced it, no step more", "[serve]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  LiveServer server(2);
  httplib::Client c = server.client();
  const auto settled_steps = [&] {  // once the leader has recorded the last step (nothing runs then)
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (server.service().snapshot().running > 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return server.service().snapshot().steps;
  };
  struct Answer {
    std::string text;
    int tokens = 0;
    int64_t steps = 0;  // the engine's, for this answer alone
  };
  const auto answer = [&](const json& body) {
    const int64_t before = settled_steps();
    const json a = post(c, "/v1/chat/completions", body);
    return Answer{a["choices"][0]["message"]["content"], a["usage"]["completion_tokens"], settled_steps() - before};
  };
  json body = chat_body("Tell me about a cat.", 40, 0.0, 1);
  const Answer whole = answer(body);
  REQUIRE(whole.text.size() > 10);
  const std::string stop = whole.text.substr(whole.text.size() / 2, 3);
  body["stop"] = stop;
  const Answer cut = answer(body);
  CHECK(cut.text == whole.text.substr(0, whole.text.find(stop)));
  REQUIRE(cut.tokens < whole.tokens);
  CHECK(cut.steps == cut.tokens);  // the prompt in one step, then a token a step
  body.erase("stop");
  body["max_tokens"] = cut.tokens;  // the same tokens, ended by max_tokens
  const Answer same = answer(body);
  CHECK(same.tokens == cut.tokens);
  CHECK(cut.steps == same.steps);
}

TEST_CASE("serve: 64 concurrent streaming clients, some leaving mid-stream, each get the answer they get alone", "[serve]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  serve::ServiceOptions service;
  service.engine.parallel = 16;
  LiveServer server(2, service);
  constexpr int CLIENTS = 64;
  const char* openings[] = {"Tell me about a cat.", "Who is Lily?", "What is in the box?", "Sing a song."};
  std::vector<json> bodies;
  for (int i = 0; i < CLIENTS; ++i) {
    json b = chat_body(openings[i % 4], 16 + i % 24, i % 3 == 0 ? 0.0 : 0.9, 100 + i);
    b["stream"] = true;
    bodies.push_back(b);
  }
  std::vector<std::string> together(CLIENTS);
  const auto leaves = [](int i) { return i % 5 == 2; };  // hangs up after a few chunks
  std::vector<std::thread> clients;
  for (int i = 0; i < CLIENTS; ++i)
    clients.emplace_back([&, i] {
      httplib::Client c = server.client();
      together[static_cast<size_t>(i)] = joined_deltas(stream(c, "/v1/chat/completions", bodies[static_cast<size_t>(i)], leaves(i) ? 4 : 0));
    });
  for (std::thread& t : clients) t.join();
  httplib::Client c = server.client();
  for (int i = 0; i < CLIENTS; ++i) {
    if (leaves(i)) continue;
    INFO("client " << i);
    CHECK(joined_deltas(stream(c, "/v1/chat/completions", bodies[static_cast<size_t>(i)])) == together[static_cast<size_t>(i)]);
  }
  // Every sequence, those whose clients left included, has given its blocks back.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (metric(c, "tpcli_kv_blocks_used") > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(metric(c, "tpcli_kv_blocks_used") == 0);
  CHECK(metric(c, "tpcli_running_sequences") == 0);
}

TEST_CASE("serve: a full queue is 429 with Retry-After, and a client that leaves frees its sequence at once", "[serve]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  serve::ServiceOptions service;
  service.engine.parallel = 1;
  service.max_queue = 0;
  LiveServer server(1, service);
  std::atomic<bool> first_token{false}, hang_up{false};
  std::thread long_one([&] {
    httplib::Client c = server.client();
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = json{{"prompt", "Once"}, {"max_tokens", 500}, {"ignore_eos", true}, {"stream", true}}.dump();
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
      first_token = true;
      return !hang_up;
    };
    c.send(req);
  });
  while (!first_token) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  httplib::Client c = server.client();
  const auto busy = c.Post("/v1/completions", json{{"prompt", "x"}, {"max_tokens", 2}}.dump(), "application/json");
  CHECK(busy->status == 429);
  CHECK(busy->get_header_value("Retry-After") == "1");
  CHECK(json::parse(busy->body)["error"]["type"] == "rate_limit_error");
  hang_up = true;
  long_one.join();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (server.service().in_flight() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(server.service().in_flight() == 0);
  CHECK(metric(c, "tpcli_generation_tokens_total") < 500);
}

TEST_CASE("serve: log-probabilities are the log-softmax of the logits forward() gives alone", "[serve]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  LiveServer server(2);
  httplib::Client c = server.client();
  const std::vector<int> prompt = {1, 403, 407, 280, 261};
  const json lp = post(c, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 1}, {"temperature", 0}, {"logprobs", 3}})["choices"][0]["logprobs"];
  // The reference: one device, token by token, log-softmax in double.
  std::vector<float> logits;
  dist::run_on_mesh(dist::Mesh::line(1), [&](dist::Device& dev) {
    model::Llama m(server.weights(), dev.axis("model"));
    for (size_t pos = 0; pos < prompt.size(); ++pos) {
      const std::span<const float> l = m.forward(prompt[pos], static_cast<int>(pos));
      if (pos + 1 == prompt.size()) logits.assign(l.begin(), l.end());
    }
  });
  double top = logits[0];
  for (const float x : logits) top = std::max<double>(top, x);
  double sum = 0;
  for (const float x : logits) sum += std::exp(x - top);
  const size_t best = static_cast<size_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const double want = logits[best] - top - std::log(sum);
  CHECK(lp["token_logprobs"][0].get<double>() == Approx(want).margin(1e-4));
  CHECK(lp["tokens"][0] == server.tokenizer().decode_ids(std::span<const int>(std::vector<int>{static_cast<int>(best)}), false));
  REQUIRE(lp["top_logprobs"][0].size() == 3);
  for (const auto& [text, value] : lp["top_logprobs"][0].items()) CHECK(value.get<double>() <= want + 1e-4);
}

TEST_CASE("serve: top_k, min_p, penalties and logit_bias reach every device: the same answers on 1 and 2 devices", "[serve][sampling]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  const json penalised = {{"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0.8}, {"seed", 5},
                          {"top_k", 20},  {"min_p", 0.02},  {"presence_penalty", 1.5}, {"frequency_penalty", 0.5},
                          {"repetition_penalty", 1.2}, {"logit_bias", {{"13", -100}, {"400", 3}}}};
  json greedy_biased = {{"prompt", "Once upon a time"}, {"max_tokens", 6}, {"temperature", 0}, {"logit_bias", {{"400", 100}}}};
  json plain = penalised;
  for (const char* key : {"top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias"}) plain.erase(key);
  std::string answers[2][3];
  for (const int devices : {1, 2}) {
    LiveServer server(devices);
    httplib::Client c = server.client();
    int i = 0;
    for (const json& body : {penalised, greedy_biased, plain})
      answers[devices - 1][i++] = post(c, "/v1/completions", body)["choices"][0]["text"].get<std::string>();
    const std::string& biased = answers[devices - 1][1];  // token 400 six times
    REQUIRE(!biased.empty());
    REQUIRE(biased.size() % 6 == 0);
    std::string six;
    for (int k = 0; k < 6; ++k) six += biased.substr(0, biased.size() / 6);
    CHECK(biased == six);
  }
  for (int i = 0; i < 3; ++i) CHECK(answers[1][i] == answers[0][i]);
  CHECK(answers[0][0] != answers[0][2]);  // the parameters changed the answer
}

TEST_CASE("serve: n choices of one prompt: each the answer its seed gives alone, whole or streamed by index", "[serve]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  LiveServer server(2);
  httplib::Client c = server.client();
  json body = chat_body("Tell me about a dog.", 16, 0.9, 40);
  body["n"] = 3;
  const json whole = post(c, "/v1/chat/completions", body);
  REQUIRE(whole["choices"].size() == 3);
  int completion_tokens = 0;
  std::vector<std::string> texts;
  for (int i = 0; i < 3; ++i) {
    INFO("choice " << i);
    const json& choice = whole["choices"][static_cast<size_t>(i)];
    CHECK(choice["index"] == i);
    texts.push_back(choice["message"]["content"]);
    const json alone = post(c, "/v1/chat/completions", chat_body("Tell me about a dog.", 16, 0.9, 40 + i));
    CHECK(alone["choices"][0]["message"]["content"] == texts.back());
    completion_tokens += alone["usage"]["completion_tokens"].get<int>();
  }
  CHECK(texts[0] != texts[1]);  // seeds one apart
  CHECK(whole["usage"]["completion_tokens"] == completion_tokens);
  CHECK(whole["usage"]["prompt_tokens"] == post(c, "/v1/chat/completions", chat_body("Tell me about a dog.", 1, 0.9, 1))["usage"]["prompt_tokens"]);

  body["stream"] = true;
  std::vector<std::string> streamed(3);
  std::vector<int> finishes(3, 0);
  for (const json& e : stream(c, "/v1/chat/completions", body)) {
    if (!e.is_object() || e["choices"].empty()) continue;
    const json& choice = e["choices"][0];
    const auto i = choice["index"].get<size_t>();
    REQUIRE(i < 3);
    streamed[i] += choice["delta"].value("content", "");
    if (!choice["finish_reason"].is_null()) ++finishes[i];
  }
  CHECK(streamed == texts);
  CHECK(finishes == std::vector<int>{1, 1, 1});
}

namespace {

// Whitespace trimmed off both ends (left only: `right` false).
std::string trimmed(const std::string& s, bool right = true) {
  const auto space = [](char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; };
  size_t begin = 0, end = s.size();
  while (begin < end && space(s[begin])) ++begin;
  while (right && end > begin && space(s[end - 1])) --end;
  return s.substr(begin, end - begin);
}

}  // namespace

TEST_CASE("serve: reasoning goes to reasoning_content, whole and streamed, and the reply to content", "[serve][reasoning]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  // stories260K writes no reasoning markers, so each case first takes a server's answer without
  // markers, then names markers it holds: the opener its answer starts with (or one the prompt
  // ends with), a closer from its middle. The answer is the same (the same seed and prompt).
  const text::ChatTemplate zephyr = text::chat_template_named("zephyr");
  const text::ChatTemplate opened = text::chat_template_from_source(
      "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}</s>\n{% endfor %}<|assistant|>\n<think>\n", "opens-reasoning");
  REQUIRE(opened.reasoning);  // read off the source
  CHECK_FALSE(zephyr.reasoning);
  const json body = chat_body("Tell me a story.", 60, 1.0, 5);
  for (const bool prompt_opens : {false, true}) {
    INFO((prompt_opens ? "the prompt opens the reasoning" : "the answer opens the reasoning"));
    text::ChatTemplate chat = prompt_opens ? opened : zephyr;
    chat.reasoning.reset();
    std::string answer;
    {
      LiveServer plain(1, {}, {}, {}, chat);
      httplib::Client c = plain.client();
      const json whole = post(c, "/v1/chat/completions", body);
      CHECK_FALSE(whole["choices"][0]["message"].contains("reasoning_content"));
      answer = whole["choices"][0]["message"]["content"];
    }
    INFO("the answer: " << json(answer).dump());
    REQUIRE(answer.size() > 40);
    const size_t first = answer.find_first_not_of(" \n");
    const std::string open = prompt_opens ? "<think>" : answer.substr(first, 3);
    const size_t reasoning_from = prompt_opens ? 0 : first + open.size();
    size_t middle = answer.size() / 2;  // four ASCII bytes: a marker is whole characters
    while (middle + 4 < answer.size() && !std::all_of(answer.begin() + middle, answer.begin() + middle + 4, [](char c) { return c > ' ' && c < 127; }))
      ++middle;
    const std::string close = answer.substr(middle, 4);
    const size_t close_at = answer.find(close, reasoning_from);
    const std::string want_reasoning = trimmed(answer.substr(reasoning_from, close_at - reasoning_from));
    const std::string want_reply = trimmed(answer.substr(close_at + close.size()), false);
    INFO("markers " << json(open).dump() << " " << json(close).dump());
    CHECK_FALSE(want_reasoning.empty());
    CHECK_FALSE(want_reply.empty());

    chat.reasoning = text::ReasoningMarkers{open, close};
    LiveServer server(1, {}, {}, {}, chat);
    httplib::Client c = server.client();
    const json whole = post(c, "/v1/chat/completions", body);
    const json& message = whole["choices"][0]["message"];
    CHECK(message["reasoning_content"] == want_reasoning);
    CHECK(message["content"] == want_reply);

    json streamed_body = body;
    streamed_body["stream"] = true;
    std::string reasoning, reply;
    for (const json& e : stream(c, "/v1/chat/completions", streamed_body))
      if (e.is_object() && !e["choices"].empty()) {
        reasoning += e["choices"][0]["delta"].value("reasoning_content", "");
        reply += e["choices"][0]["delta"].value("content", "");
      }
    CHECK(reasoning == want_reasoning);
    CHECK(reply == want_reply);

    // A grammar shapes the answer from its first token: all of it is the reply.
    json constrained = body;
    constrained["grammar"] = "root ::= [a-z ]+";
    const json shaped = post(c, "/v1/chat/completions", constrained);
    CHECK_FALSE(shaped["choices"][0]["message"].contains("reasoning_content"));
    const std::string text = shaped["choices"][0]["message"]["content"];
    CHECK(!text.empty());
    CHECK(text.find_first_not_of("abcdefghijklmnopqrstuvwxyz ") == std::string::npos);
  }
}

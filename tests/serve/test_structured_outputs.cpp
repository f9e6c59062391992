// serve/: structured outputs and required tool calls over a live 2-device server (stories260K,
// whose weights know nothing of JSON): every answer to a JSON schema that ends parses and
// validates (a validator written apart from the constraint code: tests/grammar), a request's
// constrained neighbours leave its answer unchanged, tool_choice "required" returns a call of a
// declared function whose arguments validate, whole and streamed alike.
#include <catch2/catch.hpp>

#include <chrono>
#include <thread>

#include <nlohmann/json.hpp>

#include "../grammar/json_schema_validator.h"
#include "live_server.h"

using namespace tpcli;
using namespace tpcli::testing;
using json = nlohmann::ordered_json;

namespace {

json post(httplib::Client& c, const json& body, int want_status = 200) {
  const auto res = c.Post("/v1/chat/completions", body.dump(), "application/json");
  REQUIRE(res);
  INFO(res->body);
  REQUIRE(res->status == want_status);
  return json::parse(res->body);
}

json ask(const std::string& user, int max_tokens, int seed) {
  return {{"messages", {{{"role", "user"}, {"content", user}}}}, {"max_tokens", max_tokens}, {"temperature", 1.0}, {"seed", seed}};
}

// "" when `value` validates, else why not.
std::string violation(const json& schema, const json& value) {
  return grammar::testing::SchemaValidator(nlohmann::json::parse(schema.dump())).check(nlohmann::json::parse(value.dump()));
}

}  // namespace

TEST_CASE("serve: every finished answer to a JSON schema parses and validates, on random-ish weights", "[serve][grammar]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  LiveServer server(2);
  httplib::Client c = server.client();
  const std::vector<json> schemas = {
      json::parse(R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0,
                     "maximum": 120}}, "required": ["name", "age"]})"),
      json::parse(R"({"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3})"),
      json::parse(R"({"type": "object", "properties": {"ok": {"type": "boolean"}, "tags": {"type": "array", "items": {"type": "string",
                     "maxLength": 4}, "maxItems": 2}, "n": {"anyOf": [{"type": "null"}, {"type": "integer"}]}}, "required": ["ok"]})"),
  };
  int finished = 0;
  for (size_t k = 0; k < schemas.size(); ++k) {
    json body = ask("Tell me in JSON.", 120, 10 + static_cast<int>(k));
    body["n"] = 4;
    body["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "answer"}, {"schema", schemas[k]}, {"strict", true}}}};
    const json reply = post(c, body);
    for (const json& choice : reply["choices"]) {
      const std::string text = choice["message"]["content"];
      INFO("schema " << k << ": " << text);
      if (choice["finish_reason"] == "length") continue;
      CHECK(choice["finish_reason"] == "stop");
      const json value = json::parse(text, nullptr, false);
      REQUIRE_FALSE(value.is_discarded());
      CHECK(violation(schemas[k], value) == "");
      if (value.is_object() && schemas[k]["properties"].contains("name"))  // properties in the schema's order
        CHECK(text.find("\"name\"") < text.find("\"age\""));
      ++finished;
    }
  }
  CHECK(finished >= 6);

  // json_object: an object; a bad schema or grammar: a 400 naming where.
  json object = ask("JSON please.", 80, 3);
  object["response_format"] = {{"type", "json_object"}};
  const json o = post(c, object);
  if (o["choices"][0]["finish_reason"] == "stop") CHECK(json::parse(o["choices"][0]["message"]["content"].get<std::string>()).is_object());
  json bad = ask("x", 8, 1);
  bad["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "a"}, {"schema", {{"type", "string"}, {"format", "ipv6"}}}}}};
  const json e = post(c, bad, 400);
  CHECK(e["error"]["param"] == "response_format.json_schema.schema");
  CHECK(e["error"]["message"].get<std::string>().find("format") != std::string::npos);
  json bad_grammar = ask("x", 8, 1);
  bad_grammar["grammar"] = "root ::= undefined-rule";
  CHECK(post(c, bad_grammar, 400)["error"]["param"] == "grammar");
  json digits = ask("x", 6, 1);
  digits["grammar"] = "root ::= [0-9]+";
  const std::string d = post(c, digits)["choices"][0]["message"]["content"];
  CHECK(!d.empty());
  CHECK(d.find_first_not_of("0123456789") == std::string::npos);
}

TEST_CASE("serve: a plain request's answer is the same beside constrained neighbours", "[serve][grammar]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  LiveServer server(2);
  httplib::Client c = server.client();
  const json plain = ask("Tell me about a cat.", 40, 7);
  const std::string alone = post(c, plain)["choices"][0]["message"]["content"];
  std::vector<std::thread> neighbours;
  for (int i = 0; i < 3; ++i)
    neighbours.emplace_back([&, i] {
      httplib::Client n = server.client();
      json body = ask("JSON", 60, 100 + i);
      body["response_format"] = {{"type", "json_object"}};
      n.Post("/v1/chat/completions", body.dump(), "application/json");
    });
  // The plain one goes once a constrained one runs, so the two share steps.
  for (int i = 0; i < 2000 && server.service().snapshot().running == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(server.service().snapshot().running > 0);
  const std::string together = post(c, plain)["choices"][0]["message"]["content"];
  for (auto& t : neighbours) t.join();
  CHECK(together == alone);
}

TEST_CASE("serve: tool_choice required returns a call of a declared function whose arguments validate, whole and streamed",
          "[serve][grammar][tools]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  // Hermes's tool-call format in a template the 512-token vocabulary can end.
  const text::ChatTemplate hermes_like = text::chat_template_from_source(
      "{%- if tools %}<tools>{% for t in tools %}{{ t.function.name }} {% endfor %}</tools>{% endif %}"
      "{%- for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}"
      "{% else %}<|{{ m.role }}|>{{ m.content }}</s>{% endif %}{% endfor %}<|assistant|>",
      "hermes-like");  // the tools' names only: a short prompt leaves the 512-position context room for a call
  LiveServer server(2, {}, {}, {}, hermes_like);
  httplib::Client c = server.client();
  const json parameters = json::parse(R"({"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                          "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"]})");
  json body = ask("What is the weather in Paris?", 400, 21);
  body["tools"] = {{{"type", "function"}, {"function", {{"name", "get_weather"}, {"parameters", parameters}}}},
                   {{"type", "function"}, {"function", {{"name", "get_time"}, {"parameters", {{"type", "object"}, {"properties", json::object()}}}}}}};
  body["tool_choice"] = "required";
  body["parallel_tool_calls"] = false;
  const json whole = post(c, body);
  const json& message = whole["choices"][0]["message"];
  INFO(whole.dump());
  REQUIRE(whole["choices"][0]["finish_reason"] == "tool_calls");
  REQUIRE(message["tool_calls"].size() == 1);
  const json& call = message["tool_calls"][0];
  CHECK(call["type"] == "function");
  CHECK(call["id"].get<std::string>().starts_with("call_"));
  const std::string name = call["function"]["name"];
  CHECK((name == "get_weather" || name == "get_time"));
  const json arguments = json::parse(call["function"]["arguments"].get<std::string>());
  if (name == "get_weather") CHECK(violation(parameters, arguments) == "");
  CHECK(arguments.is_object());

  // A named function: that one. Streamed: the deltas join to the whole answer's call.
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  const json named = post(c, body);
  REQUIRE(named["choices"][0]["message"]["tool_calls"].size() == 1);
  CHECK(named["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather");
  body["stream"] = true;
  const auto res = c.Post("/v1/chat/completions", body.dump(), "application/json");
  REQUIRE(res);
  std::string streamed_name, streamed_arguments, finish;
  for (size_t at = 0, end; (end = res->body.find("\n\n", at)) != std::string::npos; at = end + 2) {
    const std::string event = res->body.substr(at, end - at);
    if (!event.starts_with("data: {")) continue;
    const json chunk = json::parse(event.substr(6));
    if (chunk["choices"].empty()) continue;
    const json& choice = chunk["choices"][0];
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
    if (!choice["delta"].contains("tool_calls")) continue;
    for (const json& d : choice["delta"]["tool_calls"]) {
      if (d["function"].contains("name")) streamed_name += d["function"]["name"].get<std::string>();
      streamed_arguments += d["function"]["arguments"].get<std::string>();
    }
  }
  CHECK(finish == "tool_calls");
  CHECK(streamed_name == "get_weather");
  CHECK(streamed_arguments == named["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]);

  // The arguments' keys in the order the client declared them, not the alphabet's.
  json ordered = ask("Book it.", 400, 22);
  ordered["tools"] = {{{"type", "function"}, {"function", {{"name", "book"}, {"parameters", json::parse(R"({"type": "object", "properties":
      {"zone": {"type": "integer", "minimum": 1, "maximum": 9}, "at": {"type": "integer", "minimum": 0, "maximum": 23}},
      "required": ["zone", "at"]})")}}}}};
  ordered["tool_choice"] = {{"type", "function"}, {"function", {{"name", "book"}}}};
  ordered["parallel_tool_calls"] = false;
  const json booked = post(c, ordered);
  INFO(booked.dump());
  REQUIRE(booked["choices"][0]["finish_reason"] == "tool_calls");
  const std::string booked_arguments = booked["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"];
  CHECK(json::parse(booked_arguments).begin().key() == "zone");
  CHECK(booked_arguments.find("\"zone\"") < booked_arguments.find("\"at\""));
}

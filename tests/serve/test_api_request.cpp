// serve/: OpenAI request bodies become engine requests, and every bad one is a 400 that names its
// field and never echoes the body.
#include <catch2/catch.hpp>

#include <string>

#include "serve/api_request.h"
#include "support/byte_prompt_model.h"

using namespace tpcli;
using namespace tpcli::serve;
using nlohmann::json;

namespace {

PromptModel byte_model(int context = 64) { return testing::byte_prompt_model(context); }

// The ApiError a body gets (status 0: none).
ApiError refusal(const std::string& body, Endpoint endpoint = Endpoint::chat, int context = 64) {
  try {
    parse_generation_request(parse_body(body), endpoint, byte_model(context));
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(0, "accepted");
}

}  // namespace

TEST_CASE("api request: a chat body becomes the prompt and sampling it asks for") {
  const GenerationRequest r = parse_generation_request(
      parse_body(R"({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0,
                     "top_p": 0.5, "seed": 7, "stop": ["x", "yz"], "stream": true, "stream_options": {"include_usage": true},
                     "logprobs": true, "top_logprobs": 3, "n": 1, "user": "u", "frequency_penalty": 0})"),
      Endpoint::chat, byte_model());
  CHECK(r.prompt.size() == std::string("user: hi\n").size());
  CHECK(r.max_tokens == 5);
  CHECK(r.temperature == 0.0f);
  CHECK(r.top_p == 0.5f);
  CHECK(r.seed == 7u);
  CHECK(r.stop == std::vector<std::string>{"x", "yz"});
  CHECK(r.stream);
  CHECK(r.include_usage);
  CHECK(r.logprobs);
  CHECK(r.top_logprobs == 3);
}

TEST_CASE("api request: completions take text or token ids, and max_tokens defaults to what the context leaves") {
  const GenerationRequest text = parse_generation_request(parse_body(R"({"prompt": "ab"})"), Endpoint::completion, byte_model());
  CHECK(text.prompt == std::vector<int>{0, 'a' + 1, 'b' + 1});
  CHECK(text.max_tokens == 16);
  const GenerationRequest ids =
      parse_generation_request(parse_body(R"({"prompt": [5, 6, 7], "logprobs": 2})"), Endpoint::completion, byte_model());
  CHECK(ids.prompt == std::vector<int>{5, 6, 7});
  CHECK(ids.logprobs);
  CHECK(ids.top_logprobs == 2);
  const GenerationRequest chat =
      parse_generation_request(parse_body(R"({"messages": [{"role": "user", "content": "hi"}]})"), Endpoint::chat, byte_model());
  CHECK(chat.max_tokens == 64 - 9);
}

TEST_CASE("api request: bad bodies are 400s naming the field, without echoing the body") {
  const std::string secret = "SECRET-TEXT-" + std::string(100, 'q');
  const struct {
    std::string body;
    std::string param;
  } cases[] = {
      {"", ""},
      {"{\"messages\": [", ""},
      {"[1, 2]", ""},
      {"{\"messages\": \"" + secret + "\"}", "messages"},
      {R"({"messages": []})", "messages"},
      {R"({"messages": [{"role": "wizard", "content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "user"}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": "x", "tool_calls": []}]})", "messages[0].tool_calls"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": "5"})", "max_tokens"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": -1})", "max_tokens"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})", "max_tokens"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1e400})", ""},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 99999999999999999999999})", "max_tokens"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 60})", "max_tokens"},
      {R"({"messages": [{"role": "user", "content": "x"}], "temperature": 3})", "temperature"},
      {R"({"messages": [{"role": "user", "content": "x"}], "temperature": null, "top_p": -0.5})", "top_p"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stream": "yes"})", "stream"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": true}})", "stream_options"},
      {R"({"messages": [{"role": "user", "content": "x"}], "n": 17})", "n"},
      {R"({"messages": [{"role": "user", "content": "x"}], "n": 0})", "n"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})", "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes"})", "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}],
           "tool_choice": {"type": "function", "function": {"name": "g"}}})", "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "a b"}}]})", "tools[0].function.name"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}},
           {"type": "function", "function": {"name": "f"}}]})", "tools[1].function.name"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]})",
       "tools[0].function.parameters"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"type": "function"}]}]})", "messages[0].tool_calls[0]"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}})", "response_format"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"schema": 3}}})",
       "response_format.json_schema.schema"},
      {R"({"messages": [{"role": "user", "content": "x"}], "grammar": ""})", "grammar"},
      {R"({"messages": [{"role": "user", "content": "x"}], "grammar": "root ::= [a]", "response_format": {"type": "json_object"}})", "grammar"},
      {R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": [1]})", "chat_template_kwargs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "presence_penalty": 2.5})", "presence_penalty"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})", "tools[0]"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stop": ["a", "b", "c", "d", "e"]})", "stop"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stop": [""]})", "stop"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "model": "gpt-4"})", "model"},
      {R"({"messages": [{"role": "user", "content": "x"}], "frobnicate": 1})", "frobnicate"},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"" + std::string(70, 'x') + "\"}]}", "messages"},
  };
  for (const auto& c : cases) {
    INFO(c.body.substr(0, 120));
    const ApiError e = refusal(c.body);
    CHECK(e.status() == 400);
    CHECK(e.param() == c.param);
    CHECK(std::string(e.what()).find("SECRET") == std::string::npos);
    CHECK(e.body()["error"]["type"] == "invalid_request_error");
  }
  CHECK(refusal(R"({"prompt": [1, 300]})", Endpoint::completion).param() == "prompt");
  CHECK(refusal(R"({"prompt": ["a", "b"]})", Endpoint::completion).param() == "prompt");
  CHECK(refusal(R"({"prompt": "x", "echo": true})", Endpoint::completion).param() == "echo");
  CHECK(refusal(R"({"prompt": "x", "logprobs": 6})", Endpoint::completion).param() == "logprobs");
  CHECK(refusal(R"({"prompt": "x", "messages": []})", Endpoint::completion).param() == "messages");
  CHECK(refusal("{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}").status() == 400);  // not UTF-8
}

TEST_CASE("api request: nesting 10,000 deep is refused before it is parsed") {
  const std::string deep = "{\"messages\": " + std::string(10000, '[') + std::string(10000, ']') + "}";
  const ApiError e = refusal(deep);
  CHECK(e.status() == 400);
  CHECK(std::string(e.what()).find("deeper") != std::string::npos);
  // Brackets inside strings are text, not nesting.
  CHECK(refusal("{\"messages\": [{\"role\": \"user\", \"content\": \"" + std::string(100, '[') + "\"}]}", Endpoint::chat, 256).status() == 0);
}

TEST_CASE("api request: a body's values are counted while it is parsed, and lists are bounded before they are read") {
  // The issue's body: one costly value after another (an empty object builds ~80 bytes from 3).
  std::string many = "{\"prompt\": \"x\", \"foo\": [{}";
  for (size_t i = 1; i <= MAX_JSON_VALUES; ++i) many += ",{}";
  const ApiError e = refusal(many + "]}", Endpoint::completion);
  CHECK(e.status() == 400);
  CHECK(std::string(e.what()).find(std::to_string(MAX_JSON_VALUES) + " JSON values") != std::string::npos);
  // Just under the bound, it parses (and is refused for its unknown argument, by name).
  std::string fewer = "{\"prompt\": \"x\", \"foo\": [{}";
  for (size_t i = 1; i < MAX_JSON_VALUES - 8; ++i) fewer += ",{}";
  CHECK(refusal(fewer + "]}", Endpoint::completion).param() == "foo");
  // A token-id prompt as long as the context, and a fifth stop string.
  std::string ids = "1";
  for (int i = 1; i < 64; ++i) ids += ",1";
  CHECK(refusal("{\"prompt\": [" + ids + "]}", Endpoint::completion).code() == "context_length_exceeded");
  CHECK(refusal(R"({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]})", Endpoint::completion).param() == "stop");
  std::string biases = "\"0\": 1";
  for (int i = 1; i <= 300; ++i) biases += ", \"" + std::to_string(i) + "\": 1";  // 301 entries: refused for their count
  const ApiError too_many = refusal("{\"prompt\": \"x\", \"logit_bias\": {" + biases + "}}", Endpoint::completion);
  CHECK(too_many.param() == "logit_bias");
  CHECK(std::string(too_many.what()).find("301 entries; at most 300") != std::string::npos);
}

TEST_CASE("api request: top_k, min_p, the penalties and logit_bias are read per request, defaults when absent") {
  const GenerationRequest r = parse_generation_request(
      parse_body(R"({"messages": [{"role": "user", "content": "hi"}], "top_k": 40, "min_p": 0.05, "presence_penalty": 0.5,
                     "frequency_penalty": -1.5, "repetition_penalty": 1.3, "logit_bias": {"7": -100, "3": 2.5, "256": 100}})"),
      Endpoint::chat, byte_model());
  CHECK(r.sampling.top_k == 40);
  CHECK(r.sampling.min_p == 0.05f);
  CHECK(r.sampling.presence_penalty == 0.5f);
  CHECK(r.sampling.frequency_penalty == -1.5f);
  CHECK(r.sampling.repetition_penalty == 1.3f);
  CHECK(r.sampling.logit_bias == std::vector<std::pair<int, float>>{{3, 2.5f}, {7, -100.0f}, {256, 100.0f}});
  const GenerationRequest plain = parse_generation_request(
      parse_body(R"({"prompt": "x", "top_k": -1, "min_p": null, "logit_bias": {}})"), Endpoint::completion, byte_model());
  CHECK(plain.sampling == engine::SamplingParams{});  // top_k -1 is off, as vLLM's
  CHECK_FALSE(plain.sampling.changes_logits());
}

TEST_CASE("api request: a sampling parameter out of range is a 400 naming it") {
  struct Case {
    std::string field, value;
  };
  const std::vector<Case> cases = {
      {"top_k", "-2"},          {"top_k", "1.5"},           {"top_k", "\"5\""},        {"top_k", "4294967296"},
      {"min_p", "1.01"},        {"min_p", "-0.1"},          {"min_p", "\"0.1\""},      {"presence_penalty", "2.01"},
      {"presence_penalty", "-3"}, {"frequency_penalty", "2.5"}, {"frequency_penalty", "-2.01"}, {"repetition_penalty", "0"},
      {"repetition_penalty", "-1"}, {"repetition_penalty", "101"}, {"logit_bias", "[1, 2]"},    {"logit_bias", "{\"257\": 1}"},
      {"logit_bias", "{\"-1\": 1}"}, {"logit_bias", "{\"abc\": 1}"}, {"logit_bias", "{\"1x\": 1}"}, {"logit_bias", "{\"1\": 100.5}"},
      {"logit_bias", "{\"1\": \"5\"}"},
  };
  for (const Endpoint endpoint : {Endpoint::chat, Endpoint::completion}) {
    for (const Case& c : cases) {
      const std::string prompt = endpoint == Endpoint::chat ? R"("messages": [{"role": "user", "content": "x"}])" : R"("prompt": "x")";
      const std::string body = "{" + prompt + ", \"" + c.field + "\": " + c.value + "}";
      INFO(body);
      const ApiError e = refusal(body, endpoint);
      CHECK(e.status() == 400);
      CHECK(e.param() == c.field);
      CHECK(std::string(e.what()).find(c.field) != std::string::npos);
      CHECK(e.body()["error"]["param"] == c.field);
    }
  }
  // The bounds themselves are in range.
  CHECK(refusal(R"({"prompt": "x", "min_p": 1, "presence_penalty": -2, "frequency_penalty": 2, "repetition_penalty": 100,
                   "logit_bias": {"0": -100, "256": 100}, "top_k": 0})", Endpoint::completion).status() == 0);
}

TEST_CASE("api request: tools, tool calls and tool results reach the template as it reads them") {
  PromptModel m = byte_model(256);
  nlohmann::ordered_json seen_messages, seen_tools, seen_kwargs;
  m.chat = [&](const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools, const nlohmann::ordered_json& kwargs) {
    seen_messages = messages;
    seen_tools = tools;
    seen_kwargs = kwargs;
    return std::vector<int>{1, 2, 3};
  };
  const GenerationRequest r = parse_generation_request(parse_body(R"({
    "messages": [
      {"role": "developer", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Weather in "}, {"type": "text", "text": "Paris?"}]},
      {"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 2}"}},
        {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": "not json"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object",
              "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}],
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "parallel_tool_calls": false, "n": 3,
    "chat_template_kwargs": {"enable_thinking": false}})"),
                                                       Endpoint::chat, m);
  CHECK(r.prompt == std::vector<int>{1, 2, 3});
  CHECK(r.n == 3);
  CHECK(r.tool_choice.mode == ToolChoice::Mode::function);
  CHECK(r.tool_choice.function == "get_weather");
  CHECK_FALSE(r.parallel_tool_calls);
  REQUIRE(seen_messages.size() == 4);
  CHECK(seen_messages[0]["role"] == "system");
  CHECK(seen_messages[1]["content"] == "Weather in Paris?");
  CHECK(seen_messages[2]["content"] == "");
  CHECK(seen_messages[2]["tool_calls"][0]["function"]["arguments"] == nlohmann::ordered_json{{"city", "Paris"}, {"days", 2}});
  CHECK(seen_messages[2]["tool_calls"][0]["function"]["arguments"].begin().key() == "city");  // the client's order
  CHECK(seen_messages[2]["tool_calls"][1]["function"]["arguments"] == "not json");
  CHECK(seen_messages[3]["tool_call_id"] == "call_1");
  REQUIRE(seen_tools.size() == 1);
  CHECK(seen_tools[0]["function"]["parameters"].begin().key() == "type");
  CHECK(seen_kwargs == nlohmann::ordered_json{{"enable_thinking", false}});
  // Without tools, tool_choice "auto" is none; a schema'd response_format is read.
  const GenerationRequest plain = parse_generation_request(
      parse_body(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "auto",
                     "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}}}})"),
      Endpoint::chat, m);
  CHECK(plain.tool_choice.mode == ToolChoice::Mode::none);
  CHECK(plain.format.kind == OutputFormat::Kind::json_schema);
  CHECK(plain.format.schema == nlohmann::json{{"type", "integer"}});
}

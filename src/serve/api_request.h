// tpcli::serve — an OpenAI request body, checked field by field, as what the engine runs.
//
// The rules are OpenAI's own: an argument the API does not know is refused ("Unrecognized request
// argument supplied"); an argument it knows that this server does not implement is accepted only
// at its default value (the deprecated functions, echo, ...), else refused naming it; tools and
// response_format are checked here and compiled where the model is (serve/http_server.cpp); the sampling parameters
// beyond temperature and top_p (top_k, min_p, the penalties, logit_bias: engine/sampling_params.h)
// are read by the engine's parser, the one `infer --batch` uses; every error is
// a 400 with the field in "param". Bodies are bounded while they are parsed: nesting deeper than
// MAX_JSON_DEPTH or more than MAX_JSON_VALUES values is refused as soon as the parser meets it,
// so a body's tree costs at most a bounded multiple of its size. Lists are bounded too: 4 stop
// strings (OpenAI's rule), a token-id prompt shorter than the context, 300 logit_bias entries.
// An error message never echoes the body.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/sampling_params.h"
#include "text/chat_template.h"

namespace tpcli::serve {

// An answer in OpenAI's error shape: {"error": {"message", "type", "param", "code"}}.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = {}, std::string code = {}, std::string type = {});
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }
  const std::string& type() const { return type_; }
  nlohmann::json body() const;

 private:
  int status_;
  std::string param_, code_, type_;
};

constexpr int MAX_JSON_DEPTH = 32;
// Every value, object and array counts one: a token-id prompt of 65,000 ids fits, and the
// costliest body (empty objects, ~100 bytes each) stays under ~7 MB.
constexpr size_t MAX_JSON_VALUES = 1u << 16;
constexpr size_t MAX_TOOLS = 128;  // OpenAI's bound
constexpr int MAX_CHOICES = 16;    // n

// The body as a JSON object, or a 400 (empty, too deep, too many values, not JSON, not an object).
// Objects keep the client's key order (tools and schemas reach the template and the grammar as sent).
nlohmann::ordered_json parse_body(std::string_view body);

// What a request needs of the model it names.
struct PromptModel {
  std::string name;  // "model" must be this one when given
  int context = 0;   // positions a sequence may reach (prompt + generated)
  int vocab = 0;
  std::function<std::vector<int>(std::string_view text)> encode;                       // a completion prompt
  // The messages (OpenAI's, as the template reads them: tool_calls' arguments as objects), the
  // tools (an OpenAI tool list, or null) and the request's chat_template_kwargs (an object), rendered
  // through the chat template and encoded.
  std::function<std::vector<int>(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                 const nlohmann::ordered_json& template_kwargs)>
      chat;
};

enum class Endpoint { chat, completion };

// tool_choice: "none", "auto", "required", or {"type": "function", "function": {"name": ...}}.
struct ToolChoice {
  enum class Mode { none, automatic, required, function } mode = Mode::automatic;
  std::string function;  // with Mode::function
};

// What the answer's text must follow (response_format, or the `grammar` extension).
struct OutputFormat {
  enum class Kind { text, json_object, json_schema, grammar } kind = Kind::text;
  nlohmann::ordered_json schema;  // with json_schema: the schema
  std::string grammar;    // with grammar: GBNF (llama.cpp's dialect and its request field `grammar`)
};

struct GenerationRequest {
  Endpoint endpoint = Endpoint::chat;
  std::vector<int> prompt;
  int max_tokens = 16;
  float temperature = 1.0f;
  float top_p = 1.0f;
  std::optional<uint64_t> seed;
  engine::SamplingParams sampling;  // top_k, min_p, penalties, logit_bias
  std::vector<std::string> stop;  // at most 4, none empty
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage
  bool logprobs = false;
  int top_logprobs = 0;
  bool ignore_eos = false;        // vLLM's and llama-server's extension: run to max_tokens
  nlohmann::ordered_json tools;   // chat: the OpenAI tool list, or null
  ToolChoice tool_choice;         // Mode::none when there are no tools
  bool parallel_tool_calls = true;
  OutputFormat format;
  int n = 1;                      // answers to the one prompt
};

// A /v1/chat/completions or /v1/completions body; ApiError(400) names the first bad field.
GenerationRequest parse_generation_request(const nlohmann::ordered_json& body, Endpoint endpoint, const PromptModel& model);

}  // namespace tpcli::serve

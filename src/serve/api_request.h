// tpcli::serve — an OpenAI request body, checked field by field, as what the engine runs.
//
// The rules are OpenAI's own: an argument the API does not know is refused ("Unrecognized request
// argument supplied"); an argument it knows that this server does not implement is accepted only
// at its default value (n = 1, no tools, ...), else refused naming it; the sampling parameters
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

// The body as a JSON object, or a 400 (empty, too deep, too many values, not JSON, not an object).
nlohmann::json parse_body(std::string_view body);

// What a request needs of the model it names.
struct PromptModel {
  std::string name;  // "model" must be this one when given
  int context = 0;   // positions a sequence may reach (prompt + generated)
  int vocab = 0;
  std::function<std::vector<int>(std::string_view text)> encode;                       // a completion prompt
  std::function<std::vector<int>(std::span<const text::ChatMessage> messages)> chat;  // rendered, encoded
};

enum class Endpoint { chat, completion };

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
};

// A /v1/chat/completions or /v1/completions body; ApiError(400) names the first bad field.
GenerationRequest parse_generation_request(const nlohmann::json& body, Endpoint endpoint, const PromptModel& model);

}  // namespace tpcli::serve

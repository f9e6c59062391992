// libFuzzer target: an OpenAI request body as `tpcli serve` reads it: parse_body (bounded
// nesting, then nlohmann), then parse_generation_request for /v1/chat/completions and
// /v1/completions over a small in-memory model (one token per byte). The only way to refuse is an
// ApiError with a 4xx status whose message is short and whose body dumps; anything else
// escaping, or an accepted request outside the model's context, is a finding.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "serve/api_request.h"
#include "support/byte_prompt_model.h"
#include "serve/openai_shapes.h"

using namespace tpcli;
using namespace tpcli::serve;

namespace {

constexpr int CONTEXT = 64;

const PromptModel& byte_model() {
  static const PromptModel model = tpcli::testing::byte_prompt_model(CONTEXT);
  return model;
}

[[noreturn]] void finding(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_api_request: %s: %s\n", what, detail.substr(0, 300).c_str());
  std::abort();
}

// A refusal is a 4xx with a short message (a name it echoes is cut to 64 bytes, and may hold any
// character the JSON escaped), and its JSON body dumps.
void check_refusal(const ApiError& e) {
  const std::string message = e.what();
  if (e.status() < 400 || e.status() >= 500) finding("a refusal that is not a 4xx", std::to_string(e.status()) + " " + message);
  if (message.empty() || message.size() > 400) finding("a refusal's message is empty or long", message);
  if (dump(e.body()).size() > 1024) finding("a refusal's body is over 1 KB", message);
}

void check_accepted(const GenerationRequest& r) {
  const size_t prompt = r.prompt.size();
  if (prompt == 0 || r.max_tokens < 1 || prompt + static_cast<size_t>(r.max_tokens) > CONTEXT)
    finding("an accepted request outside the context", std::to_string(prompt) + " + " + std::to_string(r.max_tokens));
  if (r.stop.size() > 4 || !(r.temperature >= 0 && r.temperature <= 2) || !(r.top_p >= 0 && r.top_p <= 1) ||
      r.top_logprobs < 0 || r.top_logprobs > 20)
    finding("an accepted request with a value out of range", "");
  for (const int id : r.prompt)
    if (id < 0 || id >= byte_model().vocab) finding("a prompt token outside the vocabulary", std::to_string(id));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  nlohmann::json parsed;
  try {
    parsed = parse_body(body);
  } catch (const ApiError& e) {
    check_refusal(e);
    return 0;
  }
  for (const Endpoint endpoint : {Endpoint::chat, Endpoint::completion}) {
    try {
      check_accepted(parse_generation_request(parsed, endpoint, byte_model()));
    } catch (const ApiError& e) {
      check_refusal(e);
    }
  }
  return 0;
}

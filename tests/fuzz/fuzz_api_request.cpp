// libFuzzer target: an OpenAI request body as `tpcli serve` reads it: parse_body (bounded
// nesting, then nlohmann), then parse_generation_request for /v1/chat/completions and
// /v1/completions over a small in-memory model (one token per byte). The only way to refuse is an
// ApiError with a 4xx status whose message is short and whose body dumps; anything else
// escaping, or an accepted request outside the model's context, is a finding. So is an input whose
// parse takes more memory than a bounded multiple of its size (a counting operator new): a body's
// cost must be bounded while it is parsed, never after. At start, the case that found it: 1 MB of
// {"prompt":"x","foo":[{},{},...]}, ~30 MB of tree unbounded, must stay under MAX_PARSE_BYTES.
#include <malloc.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <string_view>

#include "serve/api_request.h"
#include "support/byte_prompt_model.h"
#include "serve/openai_shapes.h"

using namespace tpcli;
using namespace tpcli::serve;

// Every operator new's bytes, live and at their peak (malloc_usable_size: what delete frees).
namespace {
std::atomic<size_t> live_bytes{0}, peak_bytes{0};

void* counted(size_t size) {
  void* p = std::malloc(size ? size : 1);
  if (!p) throw std::bad_alloc();
  const size_t now = live_bytes += malloc_usable_size(p);
  for (size_t peak = peak_bytes; now > peak && !peak_bytes.compare_exchange_weak(peak, now);) {}
  return p;
}
void uncounted(void* p) {
  if (!p) return;
  live_bytes -= malloc_usable_size(p);
  std::free(p);
}
}  // namespace

void* operator new(size_t size) { return counted(size); }
void* operator new[](size_t size) { return counted(size); }
void operator delete(void* p) noexcept { uncounted(p); }
void operator delete[](void* p) noexcept { uncounted(p); }
void operator delete(void* p, size_t) noexcept { uncounted(p); }
void operator delete[](void* p, size_t) noexcept { uncounted(p); }
// libFuzzer allocates with the nothrow forms and frees with plain delete: they must pair with ours.
void* operator new(size_t size, const std::nothrow_t&) noexcept {
  try {
    return counted(size);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void* operator new[](size_t size, const std::nothrow_t& tag) noexcept { return operator new(size, tag); }
void operator delete(void* p, const std::nothrow_t&) noexcept { uncounted(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { uncounted(p); }

namespace {

constexpr int CONTEXT = 64;
// What one input may cost beyond what was live before it: a multiple of its size (an empty
// object in an array, ~100 bytes of tree from 3 of text, is the costliest JSON), and a bound
// whatever its size (MAX_JSON_VALUES values).
constexpr size_t BYTES_PER_INPUT_BYTE = 64;
constexpr size_t MAX_PARSE_BYTES = 24u << 20;

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

// parse_body, then each endpoint's rules: refusals and accepted requests as they must be.
void parse_and_check(std::string_view body) {
  nlohmann::ordered_json parsed;
  try {
    parsed = parse_body(body);
  } catch (const ApiError& e) {
    check_refusal(e);
    return;
  }
  for (const Endpoint endpoint : {Endpoint::chat, Endpoint::completion}) {
    try {
      check_accepted(parse_generation_request(parsed, endpoint, byte_model()));
    } catch (const ApiError& e) {
      check_refusal(e);
    }
  }
}

// Runs one input, a finding when it took more than its bound at its peak.
void within_memory_bound(std::string_view body) {
  static_cast<void>(byte_model());  // built once, before any input is counted
  const size_t before = live_bytes;
  peak_bytes = before;
  parse_and_check(body);
  const size_t used = peak_bytes - before;
  if (used > std::min(MAX_PARSE_BYTES, (64u << 10) + BYTES_PER_INPUT_BYTE * body.size()))
    finding("an input's parse took too much memory",
            std::to_string(used) + " bytes at its peak for " + std::to_string(body.size()) + " of input");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::string many = "{\"prompt\":\"x\",\"foo\":[{}";
  while (many.size() < (1u << 20)) many += ",{}";
  within_memory_bound(many + "]}");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  within_memory_bound(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}

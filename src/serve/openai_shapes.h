// tpcli::serve — OpenAI's response objects: whole completions, stream chunks, log-probabilities,
// usage; and the Prometheus text of /metrics.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/api_request.h"
#include "serve/engine_service.h"

namespace tpcli::serve {

struct CompletionIdentity {
  std::string id;     // "chatcmpl-..." / "cmpl-..."
  int64_t created = 0;
  std::string model;
  Endpoint endpoint = Endpoint::chat;
};

// One token's log-probability entry, in the endpoint's form (its text is the caller's).
struct LogprobEntry {
  std::string text;
  float logprob = 0;
  std::vector<std::pair<std::string, float>> alternatives;
};

// Usage over an answer's choices: the prompt once, the completions summed.
nlohmann::json usage_json(const std::vector<Finish>& choices);
// Chat: {"content": [...]}; completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}.
nlohmann::json logprobs_json(Endpoint endpoint, const std::vector<LogprobEntry>& entries, size_t text_offset);

// One choice of a whole answer.
struct ChoiceReply {
  std::string text;                                     // chat: the content (null when empty beside tool calls)
  std::string reasoning;                                // chat: message.reasoning_content, when not empty
  nlohmann::json tool_calls = nlohmann::json::array();  // OpenAI's [{"id", "type", "function": {"name", "arguments"}}]
  std::string finish_reason;                            // "stop", "length", "tool_calls"
  nlohmann::json logprobs;                              // null unless asked
};
nlohmann::json completion_json(const CompletionIdentity& who, const std::vector<ChoiceReply>& choices, const nlohmann::json& usage);

// One choice's part of a stream chunk.
struct ChunkDelta {
  int index = 0;
  bool first = false;                         // chat: the role too
  std::string content;
  std::string reasoning;                      // chat: delta.reasoning_content, when not empty
  nlohmann::json tool_calls;                  // OpenAI's delta list [{"index", "id"?, "type"?, "function": {...}}], or null
  std::optional<std::string> finish_reason;   // in a choice's last chunk only
  nlohmann::json logprobs;
};
nlohmann::json chunk_json(const CompletionIdentity& who, const ChunkDelta& delta, bool with_usage_field);
nlohmann::json usage_chunk_json(const CompletionIdentity& who, const nlohmann::json& usage);

// "data: {...}\n\n"; JSON with invalid UTF-8 replaced.
std::string sse_event(const nlohmann::json& j);
std::string dump(const nlohmann::json& j);

// /metrics: requests by status, token counters, queue and KV gauges, latency histograms.
std::string prometheus_text(const ServiceSnapshot& s, const std::map<int, uint64_t>& requests_by_status);

}  // namespace tpcli::serve

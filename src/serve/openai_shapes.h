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

nlohmann::json usage_json(const Finish& f);
// Chat: {"content": [...]}; completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}.
nlohmann::json logprobs_json(Endpoint endpoint, const std::vector<LogprobEntry>& entries, size_t text_offset);

// A whole answer.
nlohmann::json completion_json(const CompletionIdentity& who, const std::string& text, engine::FinishReason finish_reason,
                               const Finish& usage, const nlohmann::json& logprobs);
// A stream chunk: `delta` text (the role too when `first`), a finish_reason in the last one only.
nlohmann::json chunk_json(const CompletionIdentity& who, const std::string& delta, bool first, std::optional<engine::FinishReason> finish_reason,
                          const nlohmann::json& logprobs, bool with_usage_field);
nlohmann::json usage_chunk_json(const CompletionIdentity& who, const Finish& usage);

// "data: {...}\n\n"; JSON with invalid UTF-8 replaced.
std::string sse_event(const nlohmann::json& j);
std::string dump(const nlohmann::json& j);

// /metrics: requests by status, token counters, queue and KV gauges, latency histograms.
std::string prometheus_text(const ServiceSnapshot& s, const std::map<int, uint64_t>& requests_by_status);

}  // namespace tpcli::serve

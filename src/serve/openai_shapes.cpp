// tpcli::serve — OpenAI's response objects and the metrics text (see openai_shapes.h).
#include "serve/openai_shapes.h"

#include <sstream>

namespace tpcli::serve {

using nlohmann::json;

namespace {

const char* object_name(Endpoint e, bool chunk) {
  if (e == Endpoint::completion) return "text_completion";
  return chunk ? "chat.completion.chunk" : "chat.completion";
}

json head(const CompletionIdentity& who, bool chunk) {
  return {{"id", who.id}, {"object", object_name(who.endpoint, chunk)}, {"created", who.created}, {"model", who.model}, {"system_fingerprint", "tpcli"}};
}

json bytes_of(const std::string& s) {
  json b = json::array();
  for (const char c : s) b.push_back(static_cast<unsigned char>(c));
  return b;
}

}  // namespace

json usage_json(const std::vector<Finish>& choices) {
  const int prompt = choices.empty() ? 0 : choices[0].prompt_tokens, cached = choices.empty() ? 0 : choices[0].cached_tokens;
  int completion = 0;
  for (const Finish& f : choices) completion += f.completion_tokens;
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

json logprobs_json(Endpoint endpoint, const std::vector<LogprobEntry>& entries, size_t text_offset) {
  if (endpoint == Endpoint::chat) {
    json content = json::array();
    for (const LogprobEntry& e : entries) {
      json top = json::array();
      for (const auto& [text, lp] : e.alternatives) top.push_back({{"token", text}, {"logprob", lp}, {"bytes", bytes_of(text)}});
      content.push_back({{"token", e.text}, {"logprob", e.logprob}, {"bytes", bytes_of(e.text)}, {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), logprobs = json::array(), tops = json::array(), offsets = json::array();
  for (const LogprobEntry& e : entries) {
    tokens.push_back(e.text);
    logprobs.push_back(e.logprob);
    json top = json::object();
    for (const auto& [text, lp] : e.alternatives) top[text] = lp;
    tops.push_back(top);
    offsets.push_back(text_offset);
    text_offset += e.text.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", logprobs}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json completion_json(const CompletionIdentity& who, const std::vector<ChoiceReply>& choices, const json& usage) {
  json out = head(who, false);
  out["choices"] = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceReply& c = choices[i];
    json choice = {{"index", i}, {"finish_reason", c.finish_reason}, {"logprobs", c.logprobs}};
    if (who.endpoint == Endpoint::chat) {
      const bool calls = !c.tool_calls.empty();
      choice["message"] = {{"role", "assistant"}, {"content", calls && c.text.empty() ? json(nullptr) : json(c.text)}, {"refusal", nullptr}};
      if (!c.reasoning.empty()) choice["message"]["reasoning_content"] = c.reasoning;  // vLLM's and llama.cpp's field
      if (calls) choice["message"]["tool_calls"] = c.tool_calls;
    } else {
      choice["text"] = c.text;
    }
    out["choices"].push_back(std::move(choice));
  }
  out["usage"] = usage;
  return out;
}

json chunk_json(const CompletionIdentity& who, const ChunkDelta& d, bool with_usage_field) {
  json choice = {{"index", d.index}, {"logprobs", d.logprobs}, {"finish_reason", d.finish_reason ? json(*d.finish_reason) : json(nullptr)}};
  if (who.endpoint == Endpoint::chat) {
    choice["delta"] = json::object();
    if (d.first) choice["delta"]["role"] = "assistant";
    if (d.first || !d.content.empty()) choice["delta"]["content"] = d.content;
    if (!d.reasoning.empty()) choice["delta"]["reasoning_content"] = d.reasoning;
    if (d.tool_calls.is_array() && !d.tool_calls.empty()) choice["delta"]["tool_calls"] = d.tool_calls;
  } else {
    choice["text"] = d.content;
  }
  json out = head(who, true);
  out["choices"] = json::array({choice});
  if (with_usage_field) out["usage"] = nullptr;  // OpenAI: null on every chunk but the last when usage is asked for
  return out;
}

json usage_chunk_json(const CompletionIdentity& who, const json& usage) {
  json out = head(who, true);
  out["choices"] = json::array();
  out["usage"] = usage;
  return out;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse_event(const json& j) { return "data: " + dump(j) + "\n\n"; }

namespace {

void metric(std::ostringstream& out, const char* name, const char* type, const char* help, double value) {
  out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n' << name << ' ' << value << '\n';
}

void histogram(std::ostringstream& out, const char* name, const char* help, const Histogram& h) {
  out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " histogram\n";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    cumulative += h.counts[i];
    out << name << "_bucket{le=\"" << h.bounds[i] << "\"} " << cumulative << '\n';
  }
  out << name << "_bucket{le=\"+Inf\"} " << h.total << '\n' << name << "_sum " << h.sum << '\n' << name << "_count " << h.total << '\n';
}

}  // namespace

std::string prometheus_text(const ServiceSnapshot& s, const std::map<int, uint64_t>& requests_by_status) {
  std::ostringstream out;
  out << "# HELP tpcli_requests_total HTTP requests answered, by status code.\n# TYPE tpcli_requests_total counter\n";
  for (const auto& [status, n] : requests_by_status) out << "tpcli_requests_total{status=\"" << status << "\"} " << n << '\n';
  metric(out, "tpcli_prompt_tokens_total", "counter", "Prompt tokens of the requests the engine took.", static_cast<double>(s.prompt_tokens));
  metric(out, "tpcli_generation_tokens_total", "counter", "Tokens generated.", static_cast<double>(s.generation_tokens));
  metric(out, "tpcli_prefix_cache_tokens_total", "counter", "Prompt tokens whose keys and values came from the prefix cache.",
         static_cast<double>(s.cached_tokens));
  metric(out, "tpcli_failed_requests_total", "counter", "Requests the engine ended with an error (non-finite logits); the others went on.",
         static_cast<double>(s.failed_requests));
  metric(out, "tpcli_preemptions_total", "counter", "Sequences preempted for KV blocks.", static_cast<double>(s.preemptions));
  metric(out, "tpcli_running_sequences", "gauge", "Sequences in the running batch.", s.running);
  metric(out, "tpcli_waiting_sequences", "gauge", "Requests waiting for the batch (queued or preempted).", s.waiting + s.queued);
  metric(out, "tpcli_kv_blocks_used", "gauge", "KV pool blocks in use (per device).", s.kv_blocks - s.kv_blocks_free);
  metric(out, "tpcli_kv_blocks_free", "gauge", "KV pool blocks free (per device).", s.kv_blocks_free);
  histogram(out, "tpcli_time_to_first_token_seconds", "From a request's arrival to its first token.", s.time_to_first_token);
  histogram(out, "tpcli_inter_token_latency_seconds", "Between a request's successive tokens.", s.inter_token_latency);
  return out.str();
}

}  // namespace tpcli::serve

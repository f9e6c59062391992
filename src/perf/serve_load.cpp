#include "perf/serve_load.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace tpcli::perf {

namespace {

// The payload of one event's text (without its blank line): its data lines, joined.
std::optional<std::string> event_data(std::string_view event) {
  std::optional<std::string> data;
  size_t at = 0;
  while (at <= event.size()) {
    size_t end = event.find('\n', at);
    if (end == std::string_view::npos) end = event.size();
    std::string_view line = event.substr(at, end - at);
    if (line.substr(0, 5) == "data:") {
      line.remove_prefix(5);
      if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
      data = data ? *data + "\n" + std::string(line) : std::string(line);
    }
    at = end + 1;
  }
  return data;
}

// The generated text of a completion chunk ("text") or a chat chunk ("delta": {"content"}).
bool carries_text(const nlohmann::json& choice) {
  if (auto text = choice.find("text"); text != choice.end() && text->is_string()) return !text->get_ref<const std::string&>().empty();
  auto delta = choice.find("delta");
  if (delta == choice.end() || !delta->is_object()) return false;
  auto content = delta->find("content");
  return content != delta->end() && content->is_string() && !content->get_ref<const std::string&>().empty();
}

}  // namespace

std::vector<std::string> SseSplitter::feed(std::string_view chunk) {
  // "\r\n" line ends become "\n" (JSON payloads carry no raw '\r'), so a chunk cut between '\r'
  // and '\n' needs no special case.
  for (char c : chunk)
    if (c != '\r') buffer_.push_back(c);
  std::vector<std::string> payloads;
  size_t start = 0, blank;
  while ((blank = buffer_.find("\n\n", start)) != std::string::npos) {
    if (auto data = event_data(std::string_view(buffer_).substr(start, blank - start))) payloads.push_back(std::move(*data));
    start = blank + 2;
  }
  buffer_.erase(0, start);
  return payloads;
}

StreamEvent parse_stream_event(const std::string& payload) {
  StreamEvent event;
  if (payload == "[DONE]") {
    event.done = true;
    return event;
  }
  const nlohmann::json chunk = nlohmann::json::parse(payload, nullptr, /*allow_exceptions=*/false);
  if (chunk.is_discarded() || !chunk.is_object())
    throw std::runtime_error("stream event is not a JSON object: " + payload.substr(0, 200));
  if (auto error = chunk.find("error"); error != chunk.end()) {
    event.error_message = error->is_object() && error->contains("message") ? error->at("message").dump() : error->dump();
    return event;
  }
  if (auto choices = chunk.find("choices"); choices != chunk.end() && choices->is_array())
    for (const auto& choice : *choices) event.has_text = event.has_text || carries_text(choice);
  if (auto usage = chunk.find("usage"); usage != chunk.end() && usage->is_object()) {
    auto tokens = usage->find("completion_tokens");
    if (tokens != usage->end() && tokens->is_number_integer()) event.completion_tokens = tokens->get<int>();
  }
  return event;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(v.size() - 1);
  const size_t below = static_cast<size_t>(std::floor(rank));
  const size_t above = std::min(below + 1, v.size() - 1);
  return v[below] + (rank - static_cast<double>(below)) * (v[above] - v[below]);
}

LatencySummary summarize(const std::vector<double>& v) {
  if (v.empty()) return {};
  return {std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size()), percentile(v, 50), percentile(v, 99)};
}

}  // namespace tpcli::perf

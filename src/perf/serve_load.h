// tpcli::perf — the client side of `tpcli bench serve`, kept apart from the HTTP so it can be tested:
// server-sent events cut back out of the chunks a socket happens to deliver, one streamed completion
// chunk read into what the benchmark times, and latencies summarised as vLLM's benchmark_serving
// does (mean, and percentiles interpolated like numpy.percentile).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tpcli::perf {

// Reassembles server-sent events from arbitrary chunks: an event ends at a blank line ("\n\n" or
// "\r\n\r\n"), and its `data:` lines (joined by '\n', one leading space dropped) are its payload.
// A chunk may end anywhere, even inside "\r\n", so the unfinished tail waits for the next one.
class SseSplitter {
 public:
  // The payloads of the events that `chunk` completes, in order (events without data are skipped).
  std::vector<std::string> feed(std::string_view chunk);
  // Bytes held for an event not finished yet.
  size_t pending() const { return buffer_.size(); }

 private:
  std::string buffer_;
};

// What one streamed chunk of /v1/completions or /v1/chat/completions says.
struct StreamEvent {
  bool done = false;                          // the `[DONE]` sentinel
  bool has_text = false;                      // carries generated text: counts as a token arriving
  std::optional<int> completion_tokens;       // from a usage object, when the chunk has one
  std::optional<std::string> error_message;   // an {"error": …} chunk
};

// Reads one event payload; throws std::runtime_error naming the payload when it is not JSON.
StreamEvent parse_stream_event(const std::string& payload);

// numpy.percentile's default (linear interpolation between closest ranks) of `v`, p in [0, 100];
// what benchmark_serving prints, so the two tools' p99 mean the same. 0 for an empty `v`.
double percentile(std::vector<double> v, double p);

struct LatencySummary {
  double mean = 0, p50 = 0, p99 = 0;
};

LatencySummary summarize(const std::vector<double>& v);

}  // namespace tpcli::perf

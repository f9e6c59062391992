// perf/serve_load.h: `tpcli bench serve`'s event splitting must not depend on where the socket cut the
// stream, and its percentiles must be numpy's (what vLLM's benchmark_serving prints).
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include "perf/serve_load.h"

using namespace tpcli;

namespace {

// A stream as llama-server and tpcli serve send it: three chunks, usage, [DONE]; with "\r\n" line ends on request.
std::string sample_stream(bool crlf) {
  const std::vector<std::string> events = {
      R"({"choices":[{"index":0,"text":"Once"}]})", R"({"choices":[{"index":0,"text":" upon"}]})",
      R"({"choices":[{"index":0,"text":"","finish_reason":"length"}]})",
      R"({"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6}})", "[DONE]"};
  const std::string end = crlf ? "\r\n" : "\n";
  std::string stream = ": a comment line" + end + end;
  for (const auto& e : events) stream += "data: " + e + end + end;
  return stream;
}

std::vector<std::string> split_in_pieces(const std::string& stream, const std::vector<size_t>& cuts) {
  perf::SseSplitter splitter;
  std::vector<std::string> payloads;
  size_t at = 0;
  for (size_t cut : cuts) {
    for (auto& p : splitter.feed(std::string_view(stream).substr(at, cut - at))) payloads.push_back(p);
    at = cut;
  }
  for (auto& p : splitter.feed(std::string_view(stream).substr(at))) payloads.push_back(p);
  CHECK(splitter.pending() == 0);
  return payloads;
}

}  // namespace

TEST_CASE("serve_load: SSE events come out whole wherever the chunks are cut") {
  for (bool crlf : {false, true}) {
    const std::string stream = sample_stream(crlf);
    const std::vector<std::string> whole = split_in_pieces(stream, {});
    REQUIRE(whole.size() == 5);
    CHECK(whole.front() == R"({"choices":[{"index":0,"text":"Once"}]})");
    CHECK(whole.back() == "[DONE]");
    // every single cut point (inside "data:", inside "\r\n", between the two blank-line bytes), then random cut sets
    for (size_t cut = 1; cut < stream.size(); ++cut) CHECK(split_in_pieces(stream, {cut}) == whole);
    std::mt19937 rng(7);
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<size_t> cuts;
      for (size_t at = 0; (at += 1 + rng() % 9) < stream.size();) cuts.push_back(at);
      CHECK(split_in_pieces(stream, cuts) == whole);
    }
  }
}

TEST_CASE("serve_load: multi-line data joins with a newline, and an unfinished event waits") {
  perf::SseSplitter splitter;
  CHECK(splitter.feed("event: x\ndata: a\ndata:b\n").empty());
  CHECK(splitter.pending() > 0);
  CHECK(splitter.feed("\n") == std::vector<std::string>{"a\nb"});
}

TEST_CASE("serve_load: stream events of completions and chat chunks") {
  CHECK(perf::parse_stream_event("[DONE]").done);
  CHECK(perf::parse_stream_event(R"({"choices":[{"text":"x"}]})").has_text);
  CHECK_FALSE(perf::parse_stream_event(R"({"choices":[{"text":"","finish_reason":"length"}]})").has_text);
  CHECK(perf::parse_stream_event(R"({"choices":[{"delta":{"content":"y"}}]})").has_text);
  CHECK_FALSE(perf::parse_stream_event(R"({"choices":[{"delta":{"role":"assistant","content":""}}]})").has_text);
  const perf::StreamEvent usage = perf::parse_stream_event(R"({"choices":[],"usage":{"completion_tokens":128}})");
  CHECK_FALSE(usage.has_text);
  CHECK(usage.completion_tokens == 128);
  CHECK(perf::parse_stream_event(R"({"error":{"message":"context full"}})").error_message.has_value());
  CHECK_THROWS_WITH(perf::parse_stream_event("{not json"), Catch::Contains("not a JSON object"));
}

TEST_CASE("serve_load: percentiles interpolate as numpy.percentile does") {
  // numpy.percentile([1, 2, 3, 4], [0, 50, 99, 100]) = [1, 2.5, 3.97, 4]
  CHECK(perf::percentile({4, 1, 3, 2}, 0) == 1);
  CHECK(perf::percentile({4, 1, 3, 2}, 50) == 2.5);
  CHECK(perf::percentile({4, 1, 3, 2}, 99) == Approx(3.97));
  CHECK(perf::percentile({4, 1, 3, 2}, 100) == 4);
  CHECK(perf::percentile({5}, 99) == 5);
  CHECK(perf::percentile({}, 50) == 0);
  const perf::LatencySummary s = perf::summarize({10, 20, 30, 40, 100});
  CHECK(s.mean == 40);
  CHECK(s.p50 == 30);
  CHECK(s.p99 == Approx(97.6));  // numpy: 40 + 0.96 * 60
}

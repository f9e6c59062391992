// Reasoning split off answers (text/reasoning.h): answers written here by hand as Qwen3, QwQ, the
// R1 distills and Seed-OSS write them split into the reasoning and reply written next to them;
// streamed in pieces of every size they split as whole; a tool call written inside the reasoning is
// not a call; the published templates' markers and generation prompts are read off their sources.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/shared_data.h"
#include "text/chat_template.h"
#include "text/reasoning.h"
#include "text/tool_calls.h"

using nlohmann::ordered_json;
using tpcli::text::ReasoningDelta;
using tpcli::text::ReasoningMarkers;
using tpcli::text::ReasoningStream;
using tpcli::text::split_reasoning;

namespace {

const ReasoningMarkers THINK{"<think>", "</think>"};
const ReasoningMarkers SEED{"<seed:think>", "</seed:think>"};

struct Case {
  const ReasoningMarkers& markers;
  bool starts_inside;  // the prompt opened the reasoning
  std::string answer;
  std::string reasoning, reply;
};

std::vector<Case> cases() {
  return {
      // Qwen3 / GLM: the model opens the reasoning itself.
      {THINK, false, "<think>\nThe user wants 2+2.\nThat is 4.\n</think>\n\nThe answer is 4.", "The user wants 2+2.\nThat is 4.", "The answer is 4."},
      {THINK, false, "  <think>x</think>y", "x", "y"},
      {THINK, false, "<think>\n\n</think>\n\nNo thinking needed.", "", "No thinking needed."},
      {THINK, false, "<think>Still thinking when max_tokens came", "Still thinking when max_tokens came", ""},
      {THINK, false, "<think>a</think>b </think> c", "a", "b </think> c"},  // only the first closer ends it
      // No reasoning: the answer as written, byte for byte.
      {THINK, false, "  Hello <think>not reasoning</think> there\n", "", "  Hello <think>not reasoning</think> there\n"},
      {THINK, false, "Plain answer.", "", "Plain answer."},
      {THINK, false, "</think>no opener", "", "</think>no opener"},
      {THINK, false, "<thi", "", "<thi"},
      {THINK, false, " \n", "", " \n"},
      {THINK, false, "", "", ""},
      // QwQ / R1 distills / DeepSeek-V3.1 thinking: the prompt opened it.
      {THINK, true, "Okay, 2+2.\n</think>\n\n4", "Okay, 2+2.", "4"},
      {THINK, true, "<think>\nAn opener again.</think>Reply.", "An opener again.", "Reply."},
      {THINK, true, "Never closed, all reasoning.", "Never closed, all reasoning.", ""},
      {THINK, true, "</think>Straight to the reply.", "", "Straight to the reply."},
      {THINK, true, "", "", ""},
      // Seed-OSS
      {SEED, false, "<seed:think>Budget is fine.</seed:think>Done. <think>kept</think>", "Budget is fine.", "Done. <think>kept</think>"},
      {SEED, true, "é👋 thought</seed:think>\nréponse 👋", "é👋 thought", "réponse 👋"},
  };
}

std::string label(const Case& c) { return c.markers.open + (c.starts_inside ? " (opened by the prompt): " : ": ") + ordered_json(c.answer).dump(); }

// The stream fed `text` in pieces of `size` bytes, deltas joined.
ReasoningDelta streamed(const Case& c, size_t size) {
  ReasoningStream stream(c.markers, c.starts_inside);
  ReasoningDelta joined;
  const auto add = [&](const ReasoningDelta& d) {
    joined.reasoning += d.reasoning;
    joined.reply += d.reply;
  };
  for (size_t at = 0; at < c.answer.size(); at += size) add(stream.feed(std::string_view(c.answer).substr(at, size)));
  add(stream.finish());
  return joined;
}

const char* const TEMPLATES = "reference/chat-templates/templates";

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("reasoning: each answer splits into the reasoning and reply written next to it") {
  for (const Case& c : cases()) {
    INFO(label(c));
    const ReasoningDelta got = split_reasoning(c.markers, c.answer, c.starts_inside);
    CHECK(got.reasoning == c.reasoning);
    CHECK(got.reply == c.reply);
  }
}

TEST_CASE("reasoning: every answer streams, in pieces of every size, to the split of the whole") {
  for (const Case& c : cases())
    for (size_t size = 1; size <= c.answer.size() + 1; ++size) {
      INFO(label(c) << " in pieces of " << size);
      const ReasoningDelta got = streamed(c, size);
      CHECK(got.reasoning == c.reasoning);
      CHECK(got.reply == c.reply);
    }
}

TEST_CASE("reasoning: a stream releases reasoning as it comes, holding back only a possible marker or trailing whitespace") {
  ReasoningStream stream(THINK, false);
  CHECK(stream.feed("<thi").empty());  // may still open the reasoning
  CHECK(stream.feed("nk>\nLet me").reasoning == "Let me");
  ReasoningDelta d = stream.feed(" think.\n</th");
  CHECK(d.reasoning == " think.");  // the newline and "</th" held
  CHECK(d.reply.empty());
  d = stream.feed("ink>\n\nHi");
  CHECK(d.reasoning.empty());
  CHECK(d.reply == "Hi");
  CHECK(stream.finish().empty());

  ReasoningStream plain(THINK, false);
  CHECK(plain.feed("Hel").reply == "Hel");  // cannot be "<think>": released at once
  CHECK(plain.feed("lo <think>").reply == "lo <think>");
}

TEST_CASE("reasoning: a tool call written inside the reasoning is not a call, one after it is") {
  const std::string call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  const std::string answer = "<think>Maybe " + call + " would do? No, ask first.</think>\n\n" + call + "\nChecking.";
  const ReasoningDelta split = split_reasoning(THINK, answer, false);
  CHECK(split.reasoning == "Maybe " + call + " would do? No, ask first.");
  const tpcli::text::AssistantReply reply = tpcli::text::parse_tool_calls(tpcli::text::ToolCallFormat::hermes, split.reply);
  REQUIRE(reply.tool_calls.size() == 1);
  CHECK(reply.tool_calls[0].name == "get_weather");
  CHECK(reply.content == "Checking.");
  const ReasoningDelta only_inside = split_reasoning(THINK, "<think>" + call + "</think>No call.", false);
  CHECK(tpcli::text::parse_tool_calls(tpcli::text::ToolCallFormat::hermes, only_inside.reply).tool_calls.empty());
}

TEST_CASE("reasoning: parser names and prompts that open the reasoning") {
  for (const char* name : {"deepseek_r1", "qwen3", "glm45", "deepseek"}) {
    INFO(name);
    REQUIRE(tpcli::text::reasoning_markers_named(name));
    CHECK(tpcli::text::reasoning_markers_named(name)->open == "<think>");
    CHECK(tpcli::text::reasoning_markers_named(name)->close == "</think>");
  }
  CHECK(tpcli::text::reasoning_markers_named("seed_oss")->close == "</seed:think>");
  CHECK_FALSE(tpcli::text::reasoning_markers_named("none"));  // the CLI's word for no parser, not a parser
  CHECK_FALSE(tpcli::text::reasoning_markers_named("nope"));
  CHECK(tpcli::text::reasoning_parser_names().find("qwen3") != std::string::npos);
  CHECK(tpcli::text::prompt_opens_reasoning(THINK, "<|im_start|>assistant\n<think>\n"));
  CHECK(tpcli::text::prompt_opens_reasoning(THINK, "<｜Assistant｜><think>"));
  CHECK_FALSE(tpcli::text::prompt_opens_reasoning(THINK, "<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  CHECK_FALSE(tpcli::text::prompt_opens_reasoning(THINK, "<|im_start|>assistant\n"));
  CHECK_FALSE(tpcli::text::prompt_opens_reasoning(THINK, "<think>x</think><|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"));
}

TEST_CASE("reasoning: each published template's markers, and whether its generation prompt opens the reasoning") {
  TPCLI_REQUIRE_SHARED(TEMPLATES);
  // Read off each template by hand: the reasoning markers it writes or strips from history.
  const std::map<std::string, const ReasoningMarkers*> with_markers = {
      {"Qwen-Qwen3-4B", &THINK}, {"Qwen-QwQ-32B", &THINK}, {"deepseek-ai-DeepSeek-V3.1", &THINK}, {"GLM-4.6", &THINK},
      {"HuggingFaceTB-SmolLM3-3B", &THINK}, {"ByteDance-Seed-OSS", &SEED}};
  size_t seen = 0;
  for (const auto& entry : std::filesystem::directory_iterator(tpcli::testing::shared_path(TEMPLATES))) {
    if (entry.path().extension() != ".jinja") continue;
    const std::string name = entry.path().stem().string();
    INFO(name);
    const auto markers = tpcli::text::reasoning_markers_of_template(read_text(entry.path().string()));
    const auto want = with_markers.find(name);
    REQUIRE(markers.has_value() == (want != with_markers.end()));
    if (markers) CHECK(markers->close == want->second->close);
    ++seen;
  }
  CHECK(seen >= with_markers.size());

  // The generation prompt: QwQ's and DeepSeek-V3.1's (thinking) open the reasoning; Qwen3's leaves
  // it to the model, or closes an empty one (enable_thinking false).
  const ordered_json user = ordered_json::parse(R"([{"role": "user", "content": "2+2?"}])");
  const auto opens = [&](const std::string& name, const ordered_json& kwargs) {
    tpcli::text::ChatTemplate chat = tpcli::text::chat_template_from_source(read_text(tpcli::testing::shared_path(TEMPLATES) + "/" + name + ".jinja"), name);
    chat.extra = kwargs;
    REQUIRE(chat.reasoning);
    return tpcli::text::prompt_opens_reasoning(*chat.reasoning, tpcli::text::render_chat_json(chat, user, nullptr, {"", ""}, true));
  };
  CHECK(opens("Qwen-QwQ-32B", ordered_json::object()));
  CHECK(opens("deepseek-ai-DeepSeek-V3.1", {{"thinking", true}}));
  CHECK_FALSE(opens("deepseek-ai-DeepSeek-V3.1", {{"thinking", false}}));
  CHECK_FALSE(opens("Qwen-Qwen3-4B", ordered_json::object()));
  CHECK_FALSE(opens("Qwen-Qwen3-4B", {{"enable_thinking", false}}));
}

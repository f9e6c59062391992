// tpcli::text — a reasoning model's answer split into its reasoning and its reply, as vLLM's
// --reasoning-parser and llama.cpp's reasoning_format split them: Qwen3, QwQ, the DeepSeek-R1
// distills, DeepSeek-V3.1, GLM-4.5/4.6 and SmolLM3 write "<think>...</think>" before the reply,
// Seed-OSS "<seed:think>...</seed:think>".
//
// The reasoning opens only at the very start of the answer (after whitespace). Some templates open
// it in the generation prompt (QwQ, the R1 distills, DeepSeek-V3.1 thinking): the answer then starts
// inside the reasoning and holds only the closing marker; prompt_opens_reasoning tells, from the
// prompt's end. Reasoning that never closes (max_tokens) stays reasoning; an answer that does not
// open with the marker is all reply, byte for byte. The reasoning is trimmed, and so is the start of
// the reply after it (as the templates strip both when they render history).
//
//   text::ReasoningStream stream(markers, text::prompt_opens_reasoning(markers, prompt));
//   for (piece : detokenized) send(stream.feed(piece));   // reasoning and reply, as soon as final
//   send(stream.finish());
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace tpcli::text {

struct ReasoningMarkers {
  std::string open, close;  // "<think>", "</think>"
};

// The --reasoning-parser names: vLLM's (deepseek_r1, qwen3, glm45, seed_oss, ...) and llama.cpp's
// (deepseek); each names the markers its models write.
std::optional<ReasoningMarkers> reasoning_markers_named(std::string_view name);
std::string reasoning_parser_names();  // every name, for messages
// The markers a chat template's source writes or strips from history; nullopt when it mentions none.
std::optional<ReasoningMarkers> reasoning_markers_of_template(std::string_view jinja_source);
// Whether `prompt` (its end is enough) leaves the answer inside the reasoning: it ends, but for
// whitespace, with the opening marker.
bool prompt_opens_reasoning(const ReasoningMarkers& markers, std::string_view prompt);

struct ReasoningDelta {
  std::string reasoning;
  std::string reply;
  bool empty() const { return reasoning.empty() && reply.empty(); }
};

// Streaming: each feed returns what is final so far, holding back only text that may still be (part
// of) a marker, or whitespace that may turn out to trail the reasoning; finish() flushes. The
// deltas joined equal split_reasoning(whole text), however the text was split.
class ReasoningStream {
 public:
  ReasoningStream(ReasoningMarkers markers, bool starts_inside);

  ReasoningDelta feed(std::string_view text);
  ReasoningDelta finish();

 private:
  enum class Phase {
    opening,          // nothing decided yet: the answer may still open with the marker
    reasoning,        // inside the reasoning
    reply_start,      // the reasoning closed: the reply's opening whitespace is dropped
    reply,            // the rest is reply, as written
  };
  void advance(bool text_ended, ReasoningDelta& out);
  void add_reasoning(std::string_view text, ReasoningDelta& out);

  ReasoningMarkers markers_;
  bool starts_inside_;
  Phase phase_ = Phase::opening;
  std::string pending_;       // text not yet decided
  std::string held_space_;    // reasoning whitespace, written only if more reasoning follows
  bool reasoning_written_ = false;
};

ReasoningDelta split_reasoning(const ReasoningMarkers& markers, std::string_view text, bool starts_inside);

}  // namespace tpcli::text

// tpcli::text — reasoning split off an answer (see reasoning.h).
#include "text/reasoning.h"

#include <algorithm>
#include <array>

namespace tpcli::text {

namespace {

struct ReasoningParser {
  std::string_view name;  // the --reasoning-parser name
  std::string_view open, close;
};

constexpr std::string_view THINK_OPEN = "<think>", THINK_CLOSE = "</think>";
constexpr std::string_view SEED_OPEN = "<seed:think>", SEED_CLOSE = "</seed:think>";

constexpr std::array<ReasoningParser, 7> PARSERS = {{
    {"deepseek_r1", THINK_OPEN, THINK_CLOSE},
    {"qwen3", THINK_OPEN, THINK_CLOSE},
    {"glm45", THINK_OPEN, THINK_CLOSE},
    {"deepseek_v3", THINK_OPEN, THINK_CLOSE},
    {"deepseek", THINK_OPEN, THINK_CLOSE},  // llama.cpp's reasoning_format
    {"think", THINK_OPEN, THINK_CLOSE},
    {"seed_oss", SEED_OPEN, SEED_CLOSE},
}};

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

size_t skip_space(std::string_view text) {
  size_t at = 0;
  while (at < text.size() && is_space(text[at])) ++at;
  return at;
}

// Bytes at the end of `text` that may begin `marker` once more text arrives.
size_t possible_marker_tail(std::string_view text, std::string_view marker) {
  for (size_t k = std::min(marker.size() - 1, text.size()); k > 0; --k)
    if (text.substr(text.size() - k) == marker.substr(0, k)) return k;
  return 0;
}

}  // namespace

std::optional<ReasoningMarkers> reasoning_markers_named(std::string_view name) {
  for (const ReasoningParser& p : PARSERS)
    if (p.name == name) return ReasoningMarkers{std::string(p.open), std::string(p.close)};
  return std::nullopt;
}

std::string reasoning_parser_names() {
  std::string names;
  for (const ReasoningParser& p : PARSERS) names += std::string(p.name) + ", ";
  return names + "none";
}

std::optional<ReasoningMarkers> reasoning_markers_of_template(std::string_view source) {
  const auto mentions = [&](std::string_view marker) { return source.find(marker) != std::string_view::npos; };
  if (mentions(SEED_OPEN)) return ReasoningMarkers{std::string(SEED_OPEN), std::string(SEED_CLOSE)};
  if (mentions(THINK_OPEN) || mentions(THINK_CLOSE)) return ReasoningMarkers{std::string(THINK_OPEN), std::string(THINK_CLOSE)};
  return std::nullopt;
}

bool prompt_opens_reasoning(const ReasoningMarkers& markers, std::string_view prompt) {
  size_t end = prompt.size();
  while (end > 0 && is_space(prompt[end - 1])) --end;
  return prompt.substr(0, end).ends_with(markers.open);
}

ReasoningStream::ReasoningStream(ReasoningMarkers markers, bool starts_inside) : markers_(std::move(markers)), starts_inside_(starts_inside) {}

ReasoningDelta ReasoningStream::feed(std::string_view text) {
  ReasoningDelta out;
  pending_ += text;
  advance(false, out);
  return out;
}

ReasoningDelta ReasoningStream::finish() {
  ReasoningDelta out;
  advance(true, out);
  return out;
}

// Reasoning trimmed: its opening whitespace dropped, whitespace held until more reasoning follows.
void ReasoningStream::add_reasoning(std::string_view text, ReasoningDelta& out) {
  for (const char c : text) {
    if (is_space(c)) {
      if (reasoning_written_) held_space_ += c;
      continue;
    }
    out.reasoning += held_space_;
    held_space_.clear();
    out.reasoning += c;
    reasoning_written_ = true;
  }
}

void ReasoningStream::advance(bool text_ended, ReasoningDelta& out) {
  for (;;) {
    switch (phase_) {
      case Phase::opening: {
        const size_t first = skip_space(pending_);
        const std::string_view rest = std::string_view(pending_).substr(first);
        if (rest.starts_with(markers_.open)) {
          pending_.erase(0, first + markers_.open.size());
          phase_ = Phase::reasoning;
          continue;
        }
        if (!text_ended && std::string_view(markers_.open).starts_with(rest)) return;  // may still open
        phase_ = starts_inside_ ? Phase::reasoning : Phase::reply;
        continue;
      }
      case Phase::reasoning: {
        const size_t close = pending_.find(markers_.close);
        if (close != std::string::npos) {
          add_reasoning(std::string_view(pending_).substr(0, close), out);
          pending_.erase(0, close + markers_.close.size());
          held_space_.clear();
          phase_ = Phase::reply_start;
          continue;
        }
        const size_t keep = text_ended ? 0 : possible_marker_tail(pending_, markers_.close);
        add_reasoning(std::string_view(pending_).substr(0, pending_.size() - keep), out);
        pending_.erase(0, pending_.size() - keep);
        return;
      }
      case Phase::reply_start:
        pending_.erase(0, skip_space(pending_));
        if (pending_.empty()) return;
        phase_ = Phase::reply;
        continue;
      case Phase::reply:
        out.reply += pending_;
        pending_.clear();
        return;
    }
  }
}

ReasoningDelta split_reasoning(const ReasoningMarkers& markers, std::string_view text, bool starts_inside) {
  ReasoningStream stream(markers, starts_inside);
  ReasoningDelta whole = stream.feed(text);
  const ReasoningDelta rest = stream.finish();
  whole.reasoning += rest.reasoning;
  whole.reply += rest.reply;
  return whole;
}

}  // namespace tpcli::text

// tpcli::text — generated tokens as text (see text_stream.h).
#include "text/text_stream.h"

#include <algorithm>
#include <string_view>

namespace tpcli::text {

namespace {

constexpr size_t PROMPT_WINDOW = 5;  // prompt tokens decoded before the first generated one
constexpr std::string_view REPLACEMENT_CHARACTER = "\xEF\xBF\xBD";  // U+FFFD, what lossy decoders emit
// Tokens held back for an unfinished character at most. A character is at most 4 bytes (4 byte
// tokens); past this the bytes will never make one, and holding on would make every token's
// decode longer than the last (inside the engine's step, for every sequence beside it).
constexpr size_t MAX_HELD_TOKENS = 8;

// Bytes at the end of `s` that start a UTF-8 sequence not yet complete.
size_t unfinished_utf8(const std::string& s) {
  for (size_t back = 1; back <= std::min<size_t>(3, s.size()); ++back) {
    const auto c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t length = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return length > back ? back : 0;
  }
  return 0;
}

// The longest end of `text` (from `from` on) that is the start of some stop string.
size_t partial_stop(const std::string& text, size_t from, const std::vector<std::string>& stop) {
  size_t longest = 0;
  for (const std::string& s : stop)
    for (size_t n = std::min(s.size() - 1, text.size() - from); n > longest; --n)
      if (text.compare(text.size() - n, n, s, 0, n) == 0) {
        longest = n;
        break;
      }
  return longest;
}

}  // namespace

TextStream::TextStream(const TokenizerInterface& tokenizer, std::span<const int> prompt, std::vector<std::string> stop)
    : tokenizer_(tokenizer), stop_(std::move(stop)) {
  for (const std::string& s : stop_) longest_stop_ = std::max(longest_stop_, s.size());
  const size_t tail = std::min(prompt.size(), PROMPT_WINDOW);
  ids_.assign(prompt.end() - static_cast<std::ptrdiff_t>(tail), prompt.end());
  read_ = ids_.size();
}

std::string TextStream::decode(size_t from, size_t to) const {
  return tokenizer_.decode_ids(std::span<const int>(ids_).subspan(from, to - from), false);
}

std::string TextStream::add(int token) {
  if (stopped_) return {};
  ids_.push_back(token);
  const std::string before = decode(prefix_, read_), after = decode(prefix_, ids_.size());
  const bool grew = after.size() > before.size() && after.compare(0, before.size(), before) == 0;
  // Decoders that turn bytes into text end an unfinished character in U+FFFD (Hugging Face) or in
  // its first bytes (llama2.c): either way the next token may still complete it.
  const bool unfinished = unfinished_utf8(after) > 0 || std::string_view(after).ends_with(REPLACEMENT_CHARACTER);
  if (!grew || (unfinished && ids_.size() - read_ <= MAX_HELD_TOKENS)) return {};
  text_ += after.substr(before.size());
  prefix_ = read_;
  read_ = ids_.size();
  return release();
}

std::string TextStream::flush() {
  if (!stopped_ && read_ < ids_.size()) {
    const std::string before = decode(prefix_, read_), after = decode(prefix_, ids_.size());
    if (after.size() > before.size()) text_ += after.substr(before.size());
    read_ = ids_.size();
  }
  const std::string held = release();
  const std::string rest = text_.substr(sent_);
  sent_ = text_.size();
  return held + rest;
}

// The text now final: up to a stop string met (which ends the stream), else all but an end that
// may begin one.
std::string TextStream::release() {
  const size_t search_from = sent_ >= longest_stop_ ? sent_ - longest_stop_ + 1 : 0;
  size_t at = std::string::npos;
  for (const std::string& s : stop_) at = std::min(at, text_.find(s, search_from));
  if (at != std::string::npos) {
    text_.resize(at);
    stopped_ = true;
  }
  const size_t end = stopped_ ? text_.size() : text_.size() - partial_stop(text_, sent_, stop_);
  std::string out = end > sent_ ? text_.substr(sent_, end - sent_) : std::string();
  sent_ = std::max(sent_, end);
  return out;
}

}  // namespace tpcli::text

// tpcli::text — the few UTF-8 operations tokenizers need.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tpcli::text::utf8 {

// Bytes in the character starting with lead byte `b` (1 for a continuation or invalid byte).
int sequence_length(unsigned char b);
// The code point at `text[at]` and its length in bytes; an invalid sequence is {0xFFFD, n} with n
// the bytes of its maximal invalid prefix (as WHATWG and Rust's from_utf8_lossy count them).
struct CodePoint {
  char32_t value;
  int length;
  bool valid;
};
CodePoint decode(std::string_view text, size_t at);
void append(std::string& out, char32_t code_point);
// `bytes` with every invalid sequence replaced by U+FFFD (Rust's String::from_utf8_lossy).
std::string lossy(std::string_view bytes);
bool is_valid(std::string_view bytes);
// `text` with every occurrence of `from` (non-empty) replaced by `to`, left to right.
std::string replace_all(std::string_view text, std::string_view from, std::string_view to);
// The number of trailing bytes that begin a character `text` does not complete (0..3).
size_t incomplete_tail(std::string_view text);

}  // namespace tpcli::text::utf8

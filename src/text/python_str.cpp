#include "text/python_str.h"

#include "text/utf8.h"

namespace tpcli::text {

std::u32string utf8_decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t at = 0; at < s.size();) {
    const utf8::CodePoint c = utf8::decode(s, at);
    out.push_back(c.value);  // U+FFFD for an invalid sequence
    at += static_cast<size_t>(c.length);
  }
  return out;
}

void utf8_append(std::string& out, char32_t c) { utf8::append(out, c); }

std::string utf8_encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) utf8_append(out, c);
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

bool is_python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_python_printable(char32_t c) {
  if (c == ' ') return true;
  if (c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD) return false;
  if (is_python_space(c)) return false;
  if ((c >= 0x200B && c <= 0x200F) || (c >= 0x202A && c <= 0x202E) || (c >= 0x2060 && c <= 0x206F)) return false;
  if (c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFB) || (c >= 0xD800 && c <= 0xF8FF)) return false;
  if (c == 0xFFFE || c == 0xFFFF || c > 0x10FFFF || (c >= 0xE0000 && c <= 0xE007F) || c >= 0xF0000) return false;
  return true;
}

}  // namespace tpcli::text

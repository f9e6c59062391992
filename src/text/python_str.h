// tpcli::text — UTF-8 as Python's str sees it: a sequence of code points (len, slices, indexing and
// padding count code points, not bytes), over text/utf8.h: an invalid sequence decodes to one U+FFFD.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tpcli::text {

std::u32string utf8_decode(std::string_view s);
void utf8_append(std::string& out, char32_t c);
std::string utf8_encode(std::u32string_view s);
size_t utf8_length(std::string_view s);
// Python's str.isspace() for one code point.
bool is_python_space(char32_t c);
// Python's str.isprintable() for one code point (repr escapes the others), close enough for text.
bool is_python_printable(char32_t c);

}  // namespace tpcli::text

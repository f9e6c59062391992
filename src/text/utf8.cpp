#include "text/utf8.h"

namespace tpcli::text::utf8 {

int sequence_length(unsigned char b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 1;
}

namespace {

// The allowed range of the second byte after lead byte `lead` (Unicode Table 3-7).
bool second_byte_ok(unsigned char lead, unsigned char b) {
  if (lead == 0xE0) return b >= 0xA0 && b <= 0xBF;
  if (lead == 0xED) return b >= 0x80 && b <= 0x9F;
  if (lead == 0xF0) return b >= 0x90 && b <= 0xBF;
  if (lead == 0xF4) return b >= 0x80 && b <= 0x8F;
  return b >= 0x80 && b <= 0xBF;
}

}  // namespace

CodePoint decode(std::string_view text, size_t at) {
  const auto lead = static_cast<unsigned char>(text[at]);
  if (lead < 0x80) return {lead, 1, true};
  const int length = sequence_length(lead);
  if (length == 1) return {0xFFFD, 1, false};
  char32_t value = lead & (0xFF >> (length + 1));
  for (int k = 1; k < length; ++k) {
    if (at + k >= text.size()) return {0xFFFD, k, false};
    const auto b = static_cast<unsigned char>(text[at + k]);
    const bool ok = k == 1 ? second_byte_ok(lead, b) : (b & 0xC0) == 0x80;
    if (!ok) return {0xFFFD, k, false};
    value = (value << 6) | (b & 0x3F);
  }
  return {value, length, true};
}

void append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

std::string lossy(std::string_view bytes) {
  if (is_valid(bytes)) return std::string(bytes);
  std::string out;
  out.reserve(bytes.size() + 8);
  for (size_t at = 0; at < bytes.size();) {
    const CodePoint cp = decode(bytes, at);
    if (cp.valid) {
      out.append(bytes.substr(at, static_cast<size_t>(cp.length)));
    } else {
      append(out, 0xFFFD);
    }
    at += static_cast<size_t>(cp.length);
  }
  return out;
}

bool is_valid(std::string_view bytes) {
  for (size_t at = 0; at < bytes.size();) {
    if (static_cast<unsigned char>(bytes[at]) < 0x80) {
      ++at;
      continue;
    }
    const CodePoint cp = decode(bytes, at);
    if (!cp.valid) return false;
    at += static_cast<size_t>(cp.length);
  }
  return true;
}

std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(text.size());
  size_t last = 0;
  for (size_t at = text.find(from); !from.empty() && at != std::string_view::npos; at = text.find(from, last)) {
    out.append(text.substr(last, at - last));
    out.append(to);
    last = at + from.size();
  }
  out.append(text.substr(last));
  return out;
}

size_t incomplete_tail(std::string_view text) {
  // Look back at most 3 bytes for a lead byte whose sequence runs past the end.
  for (size_t back = 1; back <= 3 && back <= text.size(); ++back) {
    const auto b = static_cast<unsigned char>(text[text.size() - back]);
    if ((b & 0xC0) == 0x80) continue;  // continuation: keep looking for its lead
    const int length = sequence_length(b);
    return length > static_cast<int>(back) ? back : 0;
  }
  return 0;
}

}  // namespace tpcli::text::utf8

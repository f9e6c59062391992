#include "files/json_file.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <stdexcept>

#include "files/regular_file.h"

namespace tpcli::files {

namespace {

struct TooDeep {
  size_t byte;
  std::string top_key;  // "" when the top level is not an object or the key is not plain text
};

// A top-level key fit for a one-line message: short printable ASCII, else nothing.
std::string printable_key(std::string_view raw) {
  const bool plain = raw.size() <= 64 && std::all_of(raw.begin(), raw.end(), [](char c) { return c >= ' ' && c <= '~'; });
  return plain ? std::string(raw) : std::string();
}

// Where `text` first opens a bracket past `limit` levels, outside strings. One pass over the bytes
// and no allocation: it runs before the parser, so a hostile file never becomes a deep value.
std::optional<TooDeep> first_too_deep(std::string_view text, int limit) {
  int depth = 0;
  bool in_string = false;
  size_t string_begin = 0;
  std::string_view last_top_string, top_key;
  for (size_t at = 0; at < text.size(); ++at) {
    const char c = text[at];
    if (in_string) {
      if (c == '\\') {
        ++at;  // the escaped character cannot end the string
      } else if (c == '"') {
        in_string = false;
        if (depth == 1) last_top_string = text.substr(string_begin, at - string_begin);
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
      string_begin = at + 1;
    } else if (c == ':' && depth == 1) {
      top_key = last_top_string;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return TooDeep{at, printable_key(top_key)};
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::nullopt;
}

}  // namespace

std::string quoted_value(std::string_view text) {
  constexpr size_t MAX_SHOWN = 100;
  const bool cut = text.size() > MAX_SHOWN;
  const nlohmann::json value = std::string(text.substr(0, MAX_SHOWN));
  // replace: a cut through a UTF-8 sequence shows as U+FFFD instead of throwing
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + (cut ? "..." : "");
}

nlohmann::json parse_json_text(std::string_view text, const std::string& path) {
  if (const auto deep = first_too_deep(text, MAX_JSON_DEPTH))
    throw std::runtime_error(path + ": " + (deep->top_key.empty() ? "" : deep->top_key + ": ") + "JSON nested deeper than " +
                             std::to_string(MAX_JSON_DEPTH) + " levels at byte " + std::to_string(deep->byte));
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    std::string what = e.what();  // "[json.exception.parse_error.101] parse error at line 1, column 5: ..."
    std::replace(what.begin(), what.end(), '\n', ' ');
    throw std::runtime_error(path + ": not valid JSON at byte " + std::to_string(e.byte) + ": " + what);
  } catch (const nlohmann::json::exception& e) {  // a number too large, ...: not a parse_error
    throw std::runtime_error(path + ": not valid JSON: " + e.what());
  }
}

nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  return parse_json_text(read_text_file(path, what), path);
}

}  // namespace tpcli::files

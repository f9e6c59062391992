#include "text/hf_pipeline.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "files/json_file.h"
#include "text/utf8.h"

namespace tpcli::text::hf {

using files::quoted_value;

using nlohmann::json;

namespace {

// GPT-2's pre-tokenizer pattern (ByteLevel with use_regex = true).
constexpr const char* GPT2_PATTERN = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Sequences nested deeper are refused: real tokenizers nest 2 or 3, and each level recurses.
constexpr int MAX_SEQUENCE_DEPTH = 64;

// Where a stage sits in the file: a chain of links on the builders' stack, so building a stage
// copies no string; the text ("PATH: decoder.decoders[0].pattern") is made only for an error or a
// regex's own error message.
class Location {
 public:
  explicit Location(std::string_view root) : name_(root) {}
  Location child(std::string_view key) const { return Location(this, key, NO_INDEX, sequence_depth_); }
  Location sequence_item(std::string_view key, size_t index) const {
    return Location(this, key, index, sequence_depth_ + 1);
  }
  int sequence_depth() const { return sequence_depth_; }
  std::string text() const;
  [[noreturn]] void fail(const std::string& what) const { throw std::runtime_error(text() + ": " + what); }

 private:
  static constexpr size_t NO_INDEX = static_cast<size_t>(-1);
  static constexpr size_t SHOWN_LINKS = 8;  // a longer path keeps its first and last links
  Location(const Location* parent, std::string_view name, size_t index, int sequence_depth)
      : parent_(parent), name_(name), index_(index), sequence_depth_(sequence_depth) {}

  const Location* parent_ = nullptr;
  std::string_view name_;  // the root's text, or a key
  size_t index_ = NO_INDEX;
  int sequence_depth_ = 0;
};

std::string Location::text() const {
  std::vector<const Location*> links;  // root first
  for (const Location* at = this; at; at = at->parent_) links.insert(links.begin(), at);
  std::string out(links.front()->name_);
  const size_t keys = links.size() - 1, head = SHOWN_LINKS / 2, tail = SHOWN_LINKS - head;
  for (size_t k = 1; k < links.size(); ++k) {
    if (keys > SHOWN_LINKS && k == head + 1) {
      out += "(" + std::to_string(keys - SHOWN_LINKS) + " more levels)";
      k = links.size() - tail - 1;
      continue;
    }
    out += "." + std::string(links[k]->name_);
    if (links[k]->index_ != NO_INDEX) out += "[" + std::to_string(links[k]->index_) + "]";
  }
  return out;
}

[[noreturn]] void unsupported(const Location& at, const std::string& what) { at.fail(what + " is not supported"); }

std::string string_field(const json& spec, const char* key, const Location& at) {
  auto it = spec.find(key);
  if (it == spec.end() || !it->is_string()) at.child(key).fail("expected a string");
  return it->get<std::string>();
}

std::string type_of(const json& spec, const Location& at) {
  if (!spec.is_object()) at.fail("expected an object");
  return string_field(spec, "type", at);
}

void replace_all(std::string& text, std::string_view from, std::string_view to) { text = utf8::replace_all(text, from, to); }

// ---- regexes ----

// A compiled PCRE2 pattern (UTF, Unicode classes, JIT when available), shared by copies.
class Regex {
 public:
  Regex(const std::string& pattern, const Location& at) : where_(at.text()) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
    if (!code) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      throw std::runtime_error(where_ + ": regex does not compile at offset " + std::to_string(offset) + ": " +
                               reinterpret_cast<const char*>(message));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional speed-up: the interpreter is the fallback
    code_.reset(code, pcre2_code_free);
  }

  // [begin, end) of every non-overlapping match, left to right (empty matches skipped).
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const {
    std::vector<std::pair<size_t, size_t>> matches;
    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
        pcre2_match_data_create_from_pattern(code_.get(), nullptr), pcre2_match_data_free);
    size_t start = 0;
    while (start <= text.size()) {
      const int rc = pcre2_match(code_.get(), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start,
                                 PCRE2_NO_UTF_CHECK, data.get(), nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) throw_match_error(rc);
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
      if (ovector[1] > ovector[0]) {
        matches.emplace_back(ovector[0], ovector[1]);
        start = ovector[1];
      } else {  // empty match: step one character on
        if (ovector[0] >= text.size()) break;
        start = ovector[0] + static_cast<size_t>(utf8::decode(text, ovector[0]).length);
      }
    }
    return matches;
  }

 private:
  // A match that gives up (a pattern that backtracks without end hits PCRE2's match limit):
  // the key and PCRE2's own words, since the input text alone cannot say what went wrong.
  [[noreturn]] void throw_match_error(int rc) const {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(rc, message, sizeof(message));
    throw std::runtime_error(where_ + ": regex failed on the input: " + reinterpret_cast<const char*>(message) +
                             " (PCRE2 error " + std::to_string(rc) + ")");
  }

  std::string where_;  // file and key, for errors at match time
  std::shared_ptr<pcre2_code> code_;
};

// The "pattern" of Split and Replace: {"String": s} (literal) or {"Regex": r}.
Regex pattern_regex(const json& spec, const Location& at) {
  const Location pattern = at.child("pattern");
  auto it = spec.find("pattern");
  if (it == spec.end() || !it->is_object()) pattern.fail("expected an object");
  if (it->contains("Regex")) return Regex(it->at("Regex").get<std::string>(), pattern.child("Regex"));
  if (it->contains("String")) {
    // A literal: quote it for PCRE2 (\Q...\E, with any \E inside split out).
    std::string literal = it->at("String").get<std::string>();
    replace_all(literal, "\\E", "\\E\\\\E\\Q");
    return Regex("\\Q" + literal + "\\E", pattern.child("String"));
  }
  pattern.fail("expected \"String\" or \"Regex\"");
}

// ---- normalizers ----

std::string utf8proc_transform(const std::string& text, utf8proc_option_t options) {
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                          static_cast<utf8proc_ssize_t>(text.size()), &mapped, options);
  if (n < 0) throw std::runtime_error(std::string("unicode normalization failed: ") + utf8proc_errmsg(n));
  std::string out(reinterpret_cast<const char*>(mapped), static_cast<size_t>(n));
  std::free(mapped);
  return out;
}

bool is_unicode_space(char32_t c) {
  const auto category = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return (c >= 0x09 && c <= 0x0D) || c == 0x85 || category == UTF8PROC_CATEGORY_ZS ||
         category == UTF8PROC_CATEGORY_ZL || category == UTF8PROC_CATEGORY_ZP;
}

std::string strip_spaces(const std::string& text, bool left, bool right) {
  size_t begin = 0, end = text.size();
  while (left && begin < end) {
    const auto cp = utf8::decode(text, begin);
    if (!is_unicode_space(cp.value)) break;
    begin += static_cast<size_t>(cp.length);
  }
  while (right && end > begin) {
    size_t lead = end - 1;
    while (lead > begin && (static_cast<unsigned char>(text[lead]) & 0xC0) == 0x80) --lead;
    if (!is_unicode_space(utf8::decode(text, lead).value)) break;
    end = lead;
  }
  return text.substr(begin, end - begin);
}

std::string lowercase(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t at = 0; at < text.size();) {
    const auto cp = utf8::decode(text, at);
    utf8::append(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp.value))));
    at += static_cast<size_t>(cp.length);
  }
  return out;
}

// Replaces every match of `regex` in `text` by `content`.
std::string replace_matches(const Regex& regex, const std::string& text, const std::string& content) {
  std::string out;
  size_t last = 0;
  for (auto [begin, end] : regex.find_all(text)) {
    out.append(text, last, begin - last);
    out += content;
    last = end;
  }
  out.append(text, last);
  return out;
}

// ---- pre-tokenizers ----

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

SplitBehavior split_behavior(const std::string& name, const Location& at) {
  if (name == "Removed") return SplitBehavior::Removed;
  if (name == "Isolated") return SplitBehavior::Isolated;
  if (name == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (name == "Contiguous") return SplitBehavior::Contiguous;
  unsupported(at.child("behavior"), quoted_value(name));
}

// Splits `piece` at the matches of `regex` as the tokenizers library's split(pattern, behavior) does.
void split_piece(const Piece& piece, const Regex& regex, SplitBehavior behavior, bool invert, std::vector<Piece>& out) {
  struct Span {
    size_t begin, end;
    bool match;
  };
  std::vector<Span> spans;  // covers the piece, in order
  size_t last = 0;
  for (auto [begin, end] : regex.find_all(piece.text)) {
    if (begin > last) spans.push_back({last, begin, invert});
    spans.push_back({begin, end, !invert});
    last = end;
  }
  if (last < piece.text.size()) spans.push_back({last, piece.text.size(), invert});

  // As the tokenizers library merges: a delimiter joins its neighbour only when that neighbour is
  // not a delimiter itself; Contiguous joins runs of delimiters.
  std::vector<Span> merged;
  for (size_t i = 0; i < spans.size(); ++i) {
    const Span& s = spans[i];
    const bool previous_match = i > 0 && spans[i - 1].match;
    if (behavior == SplitBehavior::Removed && s.match) continue;
    if (behavior == SplitBehavior::MergedWithPrevious && s.match && !previous_match && !merged.empty()) {
      merged.back().end = s.end;
    } else if (behavior == SplitBehavior::MergedWithNext && !s.match && previous_match && !merged.empty()) {
      merged.back().end = s.end;
      merged.back().match = false;
    } else if (behavior == SplitBehavior::Contiguous && s.match && previous_match && !merged.empty()) {
      merged.back().end = s.end;
    } else {
      merged.push_back(s);
    }
  }
  for (const Span& s : merged)
    out.push_back({piece.text.substr(s.begin, s.end - s.begin), piece.at_start && s.begin == 0});
}

PreTokenizer make_split(const json& spec, const Location& at) {
  const Regex regex = pattern_regex(spec, at);
  const SplitBehavior behavior = split_behavior(string_field(spec, "behavior", at), at);
  const bool invert = spec.value("invert", false);
  return [regex, behavior, invert](std::vector<Piece> pieces) {
    std::vector<Piece> out;
    for (const Piece& p : pieces) split_piece(p, regex, behavior, invert, out);
    return out;
  };
}

std::string to_byte_level(std::string_view bytes) {
  const auto& table = byte_to_unicode();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char b : bytes) out += table[static_cast<unsigned char>(b)];
  return out;
}

PreTokenizer make_byte_level(const json& spec, const Location& at) {
  const bool add_prefix_space = spec.value("add_prefix_space", false);
  std::optional<Regex> gpt2;
  if (spec.value("use_regex", true)) gpt2.emplace(GPT2_PATTERN, at);
  return [add_prefix_space, gpt2](std::vector<Piece> pieces) {
    std::vector<Piece> split;
    for (Piece& p : pieces) {
      if (add_prefix_space && !p.text.starts_with(' ')) p.text.insert(0, 1, ' ');
      if (gpt2) {
        split_piece(p, *gpt2, SplitBehavior::Isolated, false, split);
      } else {
        split.push_back(std::move(p));
      }
    }
    for (Piece& p : split) p.text = to_byte_level(p.text);
    return split;
  };
}

enum class PrependScheme { Always, First, Never };

PrependScheme prepend_scheme(const json& spec, const Location& at) {
  if (spec.contains("prepend_scheme")) {
    const std::string scheme = string_field(spec, "prepend_scheme", at);
    if (scheme == "always") return PrependScheme::Always;
    if (scheme == "first") return PrependScheme::First;
    if (scheme == "never") return PrependScheme::Never;
    unsupported(at.child("prepend_scheme"), quoted_value(scheme));
  }
  return spec.value("add_prefix_space", true) ? PrependScheme::Always : PrependScheme::Never;  // older files
}

PreTokenizer make_metaspace(const json& spec, const Location& at) {
  const std::string replacement = string_field(spec, "replacement", at);
  const PrependScheme scheme = prepend_scheme(spec, at);
  const bool split = spec.value("split", true);  // each piece then starts at a replacement character
  return [replacement, scheme, split](std::vector<Piece> pieces) {
    std::vector<Piece> out;
    for (Piece& p : pieces) {
      replace_all(p.text, " ", replacement);
      const bool prepend = scheme == PrependScheme::Always || (scheme == PrependScheme::First && p.at_start);
      if (prepend && !p.text.starts_with(replacement)) p.text.insert(0, replacement);
      if (!split) {
        out.push_back(std::move(p));
        continue;
      }
      size_t last = 0;  // split just before every replacement character but the first
      for (size_t at = p.text.find(replacement, 1); at != std::string::npos; at = p.text.find(replacement, at + 1)) {
        out.push_back({p.text.substr(last, at - last), p.at_start && last == 0});
        last = at;
      }
      out.push_back({p.text.substr(last), p.at_start && last == 0});
    }
    return out;
  };
}

PreTokenizer make_digits(const json& spec, const Location& at) {
  const Regex digits(spec.value("individual_digits", false) ? "[0-9]" : "[0-9]+", at);
  return [digits](std::vector<Piece> pieces) {
    std::vector<Piece> out;
    for (const Piece& p : pieces) split_piece(p, digits, SplitBehavior::Isolated, false, out);
    return out;
  };
}

// ---- decoders ----

std::vector<std::string> byte_level_decode(const std::vector<std::string>& tokens) {
  std::string bytes;
  for (const std::string& token : tokens) {
    std::string token_bytes;
    bool mapped = true;
    for (size_t at = 0; at < token.size() && mapped;) {
      const auto cp = utf8::decode(token, at);
      const int b = unicode_to_byte(cp.value);
      mapped = b >= 0;
      token_bytes += static_cast<char>(b);
      at += static_cast<size_t>(cp.length);
    }
    bytes += mapped ? token_bytes : token;  // a token outside the map (an added token) stays as it is
  }
  return {utf8::lossy(bytes)};
}

// "<0xNN>" -> NN, else -1.
int byte_token_value(const std::string& token) {
  if (token.size() != 6 || !token.starts_with("<0x") || token[5] != '>') return -1;
  int value = 0;
  for (int k = 3; k < 5; ++k) {
    const char c = token[static_cast<size_t>(k)];
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

// Runs of <0xNN> tokens become their bytes' text; a run that is not UTF-8 becomes one U+FFFD per byte.
std::vector<std::string> byte_fallback_decode(const std::vector<std::string>& tokens) {
  std::vector<std::string> out;
  std::string run;
  size_t run_tokens = 0;
  auto flush = [&] {
    if (run_tokens == 0) return;
    if (utf8::is_valid(run)) {
      out.push_back(run);
    } else {
      for (size_t k = 0; k < run_tokens; ++k) out.push_back("\xEF\xBF\xBD");
    }
    run.clear();
    run_tokens = 0;
  };
  for (const std::string& token : tokens) {
    const int value = byte_token_value(token);
    if (value >= 0) {
      run += static_cast<char>(value);
      ++run_tokens;
    } else {
      flush();
      out.push_back(token);
    }
  }
  flush();
  return out;
}

Decoder make_strip_decoder(const json& spec, const Location& at) {
  const std::string content = string_field(spec, "content", at);
  const size_t start = spec.value("start", size_t{0}), stop = spec.value("stop", size_t{0});
  return [content, start, stop](std::vector<std::string> tokens) {
    for (std::string& t : tokens) {
      for (size_t k = 0; k < start && t.starts_with(content); ++k) t.erase(0, content.size());
      for (size_t k = 0; k < stop && t.ends_with(content); ++k) t.erase(t.size() - content.size());
    }
    return tokens;
  };
}

Decoder make_metaspace_decoder(const json& spec, const Location& at) {
  const std::string replacement = string_field(spec, "replacement", at);
  const bool strip_first = prepend_scheme(spec, at) != PrependScheme::Never;
  return [replacement, strip_first](std::vector<std::string> tokens) {
    // As the tokenizers library: every replacement character of the first token is dropped.
    for (size_t i = 0; i < tokens.size(); ++i) replace_all(tokens[i], replacement, i == 0 && strip_first ? "" : " ");
    return tokens;
  };
}

// The stages of a Sequence, each built by `make` (which recurses here for a nested Sequence).
template <typename Stage>
std::vector<Stage> sequence_of(const json& spec, const char* key, const Location& at,
                               Stage (*make)(const json&, const Location&)) {
  if (at.sequence_depth() >= MAX_SEQUENCE_DEPTH)
    at.fail("Sequence nested more than " + std::to_string(MAX_SEQUENCE_DEPTH) + " levels deep (real tokenizers nest 2 or 3)");
  auto it = spec.find(key);
  if (it == spec.end() || !it->is_array()) at.child(key).fail("expected an array");
  std::vector<Stage> stages;
  for (size_t i = 0; i < it->size(); ++i) stages.push_back(make((*it)[i], at.sequence_item(key, i)));
  return stages;
}

Normalizer normalizer_at(const json& spec, const Location& at) {
  if (spec.is_null()) return [](std::string text) { return text; };
  const std::string type = type_of(spec, at);
  if (type == "Sequence") {
    auto stages = sequence_of(spec, "normalizers", at, &normalizer_at);
    return [stages](std::string text) {
      for (const auto& stage : stages) text = stage(std::move(text));
      return text;
    };
  }
  if (type == "NFC") return [](std::string t) { return utf8proc_transform(t, utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE)); };
  if (type == "NFD") return [](std::string t) { return utf8proc_transform(t, utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE)); };
  if (type == "NFKC")
    return [](std::string t) { return utf8proc_transform(t, utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT)); };
  if (type == "NFKD")
    return [](std::string t) { return utf8proc_transform(t, utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT)); };
  if (type == "Lowercase") return [](std::string t) { return lowercase(t); };
  if (type == "Prepend") {
    const std::string prefix = string_field(spec, "prepend", at);
    return [prefix](std::string t) { return t.empty() ? t : prefix + t; };
  }
  if (type == "Replace") {
    const Regex regex = pattern_regex(spec, at);
    const std::string content = string_field(spec, "content", at);
    return [regex, content](std::string t) { return replace_matches(regex, t, content); };
  }
  if (type == "Strip") {
    const bool left = spec.value("strip_left", true), right = spec.value("strip_right", true);
    return [left, right](std::string t) { return strip_spaces(t, left, right); };
  }
  unsupported(at, "normalizer type " + quoted_value(type));
}

PreTokenizer pre_tokenizer_at(const json& spec, const Location& at) {
  if (spec.is_null()) return [](std::vector<Piece> pieces) { return pieces; };
  const std::string type = type_of(spec, at);
  if (type == "Sequence") {
    auto stages = sequence_of(spec, "pretokenizers", at, &pre_tokenizer_at);
    return [stages](std::vector<Piece> pieces) {
      for (const auto& stage : stages) pieces = stage(std::move(pieces));
      return pieces;
    };
  }
  if (type == "Split") return make_split(spec, at);
  if (type == "ByteLevel") return make_byte_level(spec, at);
  if (type == "Metaspace") return make_metaspace(spec, at);
  if (type == "Digits") return make_digits(spec, at);
  unsupported(at, "pre-tokenizer type " + quoted_value(type));
}

Decoder decoder_at(const json& spec, const Location& at) {
  if (spec.is_null()) {  // the library joins the tokens with spaces
    return [](std::vector<std::string> tokens) {
      std::string text;
      for (size_t i = 0; i < tokens.size(); ++i) text += (i ? " " : "") + tokens[i];
      return std::vector<std::string>{text};
    };
  }
  const std::string type = type_of(spec, at);
  if (type == "Sequence") {
    auto stages = sequence_of(spec, "decoders", at, &decoder_at);
    return [stages](std::vector<std::string> tokens) {
      for (const auto& stage : stages) tokens = stage(std::move(tokens));
      return tokens;
    };
  }
  if (type == "ByteLevel") return [](std::vector<std::string> tokens) { return byte_level_decode(tokens); };
  if (type == "ByteFallback") return [](std::vector<std::string> tokens) { return byte_fallback_decode(tokens); };
  if (type == "Fuse") {
    return [](std::vector<std::string> tokens) {
      std::string text;
      for (const auto& t : tokens) text += t;
      return std::vector<std::string>{text};
    };
  }
  if (type == "Replace") {
    const Regex regex = pattern_regex(spec, at);
    const std::string content = string_field(spec, "content", at);
    return [regex, content](std::vector<std::string> tokens) {
      for (auto& t : tokens) t = replace_matches(regex, t, content);
      return tokens;
    };
  }
  if (type == "Strip") return make_strip_decoder(spec, at);
  if (type == "Metaspace") return make_metaspace_decoder(spec, at);
  unsupported(at, "decoder type " + quoted_value(type));
}

}  // namespace

Normalizer make_normalizer(const json& spec, const std::string& where) { return normalizer_at(spec, Location(where)); }
PreTokenizer make_pre_tokenizer(const json& spec, const std::string& where) { return pre_tokenizer_at(spec, Location(where)); }
Decoder make_decoder(const json& spec, const std::string& where) { return decoder_at(spec, Location(where)); }

const std::vector<std::string>& byte_to_unicode() {
  static const std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    int shifted = 0;
    for (int b = 0; b < 256; ++b) {
      const bool prints = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      utf8::append(t[static_cast<size_t>(b)], prints ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + shifted++));
    }
    return t;
  }();
  return table;
}

int unicode_to_byte(char32_t code_point) {
  static const std::vector<int> inverse = [] {
    std::vector<int> inv(512, -1);  // every mapped code point is below U+0200
    const auto& table = byte_to_unicode();
    for (int b = 0; b < 256; ++b) inv[utf8::decode(table[static_cast<size_t>(b)], 0).value] = b;
    return inv;
  }();
  return code_point < inverse.size() ? inverse[code_point] : -1;
}

}  // namespace tpcli::text::hf

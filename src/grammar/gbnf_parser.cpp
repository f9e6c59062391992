#include "grammar/gbnf_parser.h"

#include <algorithm>
#include <unordered_map>

#include "grammar/grammar_error.h"

namespace tpcli::grammar {

std::string gbnf_location(int line, int column, const std::string& what) {
  return "grammar line " + std::to_string(line) + ", column " + std::to_string(column) + ": " + what;
}

namespace {

constexpr uint32_t MAX_CODEPOINT = 0x10FFFF;

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Sorted, merged, with the complement taken over the valid code points when `negated`.
std::vector<CodepointRange> normalize_ranges(std::vector<CodepointRange> ranges, bool negated) {
  std::sort(ranges.begin(), ranges.end(), [](auto a, auto b) { return a.first < b.first; });
  std::vector<CodepointRange> merged;
  for (const auto& r : ranges) {
    if (!merged.empty() && r.first <= merged.back().last + 1)
      merged.back().last = std::max(merged.back().last, r.last);
    else
      merged.push_back(r);
  }
  if (!negated) return merged;
  std::vector<CodepointRange> complement;
  uint32_t next = 0;
  for (const auto& r : merged) {
    if (r.first > next) complement.push_back({next, r.first - 1});
    next = r.last + 1;
  }
  if (next <= MAX_CODEPOINT) complement.push_back({next, MAX_CODEPOINT});
  return complement;
}

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < text.size(); ++i)
      if (text[i] == '\n') line_starts_.push_back(i + 1);
  }

  GbnfGrammar parse() {
    skip_space();
    while (pos_ < text_.size()) {
      parse_rule();
      skip_space();
    }
    for (const GbnfRule& rule : grammar_.rules)
      if (!rule.defined) fail_at(rule.line, rule.column, "undefined rule '" + rule.name + "'");
    const auto root = names_.find("root");
    if (root == names_.end() || !grammar_.rules[static_cast<size_t>(root->second)].defined)
      throw GrammarError(gbnf_location(1, 1, "the grammar has no 'root' rule (the start rule)"));
    grammar_.root = root->second;
    return std::move(grammar_);
  }

 private:
  std::pair<int, int> line_column(size_t offset) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t line = static_cast<size_t>(it - line_starts_.begin());
    return {static_cast<int>(line), static_cast<int>(offset - line_starts_[line - 1] + 1)};
  }
  [[noreturn]] void fail_at(int line, int column, const std::string& what) const {
    throw GrammarError(gbnf_location(line, column, what));
  }
  [[noreturn]] void fail(const std::string& what, size_t offset) const {
    const auto [line, column] = line_column(offset);
    fail_at(line, column, what);
  }
  [[noreturn]] void fail(const std::string& what) const { fail(what, pos_); }

  bool at_end() const { return pos_ >= text_.size(); }
  char peek(size_t ahead = 0) const { return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0'; }

  // Spaces, tabs, newlines and comments.
  void skip_space() {
    while (!at_end()) {
      const char c = peek();
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        ++pos_;
      } else if (c == '#') {
        while (!at_end() && peek() != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (!at_end() && is_name_char(peek())) ++pos_;
    if (pos_ == start) fail("expected a rule name");
    return std::string(text_.substr(start, pos_ - start));
  }

  // Whether a `name ::=` starts at the current position (the end of the rule being parsed).
  bool at_rule_start() const {
    size_t p = pos_;
    while (p < text_.size() && is_name_char(text_[p])) ++p;
    if (p == pos_) return false;
    while (p < text_.size() && (text_[p] == ' ' || text_[p] == '\t')) ++p;
    return text_.substr(p, 3) == "::=";
  }

  int rule_index(const std::string& name, size_t offset) {
    const auto [it, inserted] = names_.emplace(name, static_cast<int>(grammar_.rules.size()));
    if (inserted) {
      GbnfRule rule;
      rule.name = name;
      std::tie(rule.line, rule.column) = line_column(offset);
      grammar_.rules.push_back(std::move(rule));
    }
    return it->second;
  }

  void parse_rule() {
    const size_t start = pos_;
    const std::string name = parse_name();
    while (peek() == ' ' || peek() == '\t') ++pos_;
    if (text_.substr(pos_, 3) != "::=") fail("expected '::=' after rule name '" + name + "'");
    pos_ += 3;
    const int index = rule_index(name, start);
    GbnfRule& rule = grammar_.rules[static_cast<size_t>(index)];
    if (rule.defined) fail("rule '" + name + "' is defined twice", start);
    rule.defined = true;
    std::tie(rule.line, rule.column) = line_column(start);
    GbnfAlternatives alternatives = parse_alternatives(0);
    grammar_.rules[static_cast<size_t>(index)].alternatives = std::move(alternatives);
    if (!at_end() && !at_rule_start()) fail("unexpected '" + std::string(1, peek()) + "'");
  }

  // Until the end of the text, a ')' (nested) or the next rule.
  GbnfAlternatives parse_alternatives(int depth) {
    if (depth > MAX_NESTING) fail("groups nested deeper than " + std::to_string(MAX_NESTING));
    GbnfAlternatives alternatives;
    alternatives.push_back(parse_sequence(depth));
    while (peek() == '|') {
      ++pos_;
      alternatives.push_back(parse_sequence(depth));
    }
    return alternatives;
  }

  GbnfSequence parse_sequence(int depth) {
    GbnfSequence sequence;
    for (;;) {
      skip_space();
      if (at_end() || peek() == '|' || peek() == ')' || at_rule_start()) break;
      GbnfNode item = parse_item(depth);
      skip_space_same_item();
      parse_repetition(item);
      sequence.push_back(std::move(item));
    }
    return sequence;
  }

  void skip_space_same_item() {
    while (peek() == ' ' || peek() == '\t') ++pos_;
  }

  GbnfNode parse_item(int depth) {
    GbnfNode node;
    std::tie(node.line, node.column) = line_column(pos_);
    const char c = peek();
    if (c == '"') {
      ++pos_;
      node.kind = GbnfNode::Kind::literal;
      while (peek() != '"') {
        if (at_end()) fail("unterminated literal", offset_of(node));
        append_utf8(node.bytes, parse_char(/*in_class=*/false));
      }
      ++pos_;
    } else if (c == '[') {
      ++pos_;
      node.kind = GbnfNode::Kind::char_class;
      const bool negated = peek() == '^';
      if (negated) ++pos_;
      std::vector<CodepointRange> ranges;
      while (peek() != ']') {
        if (at_end()) fail("unterminated character class", offset_of(node));
        const uint32_t first = parse_char(/*in_class=*/true);
        uint32_t last = first;
        if (peek() == '-' && peek(1) != ']' && pos_ + 1 < text_.size()) {
          ++pos_;
          const size_t at = pos_;
          last = parse_char(/*in_class=*/true);
          if (last < first) fail("character range is backwards", at);
        }
        ranges.push_back({first, last});
      }
      ++pos_;
      node.ranges = normalize_ranges(std::move(ranges), negated);
    } else if (c == '.') {
      ++pos_;
      node.kind = GbnfNode::Kind::char_class;
      node.ranges = normalize_ranges({}, /*negated=*/true);
    } else if (c == '(') {
      ++pos_;
      node.kind = GbnfNode::Kind::group;
      node.alternatives = parse_alternatives(depth + 1);
      skip_space();
      if (peek() != ')') fail("expected ')' to close the group", offset_of(node));
      ++pos_;
    } else if (is_name_char(c)) {
      const size_t start = pos_;
      node.kind = GbnfNode::Kind::rule_ref;
      node.rule = rule_index(parse_name(), start);
    } else {
      fail(std::string("unexpected '") + c + "'");
    }
    return node;
  }

  size_t offset_of(const GbnfNode& node) const {
    return line_starts_[static_cast<size_t>(node.line - 1)] + static_cast<size_t>(node.column - 1);
  }

  uint32_t parse_hex(int digits) {
    uint32_t value = 0;
    for (int i = 0; i < digits; ++i) {
      const char c = peek();
      int d = -1;
      if (c >= '0' && c <= '9') d = c - '0';
      if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
      if (d < 0) fail("expected " + std::to_string(digits) + " hex digits in the escape");
      value = value * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    return value;
  }

  // One code point of a literal or class: an escape or one UTF-8 character of the text.
  uint32_t parse_char(bool in_class) {
    const size_t start = pos_;
    const auto c = static_cast<unsigned char>(peek());
    if (c == '\\') {
      ++pos_;
      const char e = peek();
      ++pos_;
      switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '"': case '\'': case '\\': case '[': case ']': case '-': case '/': case '^': return static_cast<uint32_t>(e);
        case 'x': return parse_hex(2);
        case 'u': return checked_codepoint(parse_hex(4), start);
        case 'U': return checked_codepoint(parse_hex(8), start);
        default:
          fail(std::string("bad escape '\\") + (e ? std::string(1, e) : std::string()) + "'", start);
      }
    }
    if (c == '\n' && !in_class) fail("newline inside a literal (write \\n)");
    if (c < 0x80) {
      ++pos_;
      return c;
    }
    const int length = c >= 0xF0 && c < 0xF8 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (length == 0 || pos_ + static_cast<size_t>(length) > text_.size()) fail("invalid UTF-8 in the grammar text");
    uint32_t cp = c & (0x7F >> length);
    for (int i = 1; i < length; ++i) {
      const auto b = static_cast<unsigned char>(text_[pos_ + static_cast<size_t>(i)]);
      if ((b & 0xC0) != 0x80) fail("invalid UTF-8 in the grammar text");
      cp = (cp << 6) | (b & 0x3F);
    }
    pos_ += static_cast<size_t>(length);
    return checked_codepoint(cp, start);
  }

  uint32_t checked_codepoint(uint32_t cp, size_t at) const {
    if (cp > MAX_CODEPOINT || (cp >= 0xD800 && cp <= 0xDFFF)) fail("code point out of range (no UTF-8 encoding)", at);
    return cp;
  }

  int parse_count() {
    const size_t start = pos_;
    long value = 0;
    while (peek() >= '0' && peek() <= '9') {
      value = value * 10 + (peek() - '0');
      if (value > MAX_REPETITION) fail("repetition count above " + std::to_string(MAX_REPETITION), start);
      ++pos_;
    }
    if (pos_ == start) fail("expected a number in the repetition");
    return static_cast<int>(value);
  }

  void parse_repetition(GbnfNode& item) {
    const char c = peek();
    int min = 1, max = 1;
    if (c == '*') {
      min = 0, max = -1;
    } else if (c == '+') {
      min = 1, max = -1;
    } else if (c == '?') {
      min = 0, max = 1;
    } else if (c == '{') {
      const size_t start = pos_;
      ++pos_;
      skip_space_same_item();
      min = max = parse_count();
      skip_space_same_item();
      if (peek() == ',') {
        ++pos_;
        skip_space_same_item();
        max = peek() == '}' ? -1 : parse_count();
        skip_space_same_item();
      }
      if (peek() != '}') fail("expected '}' to close the repetition", start);
      if (max != -1 && max < min) fail("repetition {m,n} with n < m", start);
    } else {
      return;
    }
    ++pos_;
    if (item.min_repeat != 1 || item.max_repeat != 1) fail("two repetitions in a row (use a group)");
    item.min_repeat = min, item.max_repeat = max;
    skip_space_same_item();
    if (peek() == '*' || peek() == '+' || peek() == '?' || peek() == '{') fail("two repetitions in a row (use a group)");
  }

  std::string_view text_;
  size_t pos_ = 0;
  std::vector<size_t> line_starts_;
  GbnfGrammar grammar_;
  std::unordered_map<std::string, int> names_;
};

}  // namespace

GbnfGrammar parse_gbnf(std::string_view text) {
  if (text.size() > MAX_GBNF_BYTES) throw GrammarError(gbnf_location(1, 1, "grammar text above 4 MiB"));
  return Parser(text).parse();
}

}  // namespace tpcli::grammar

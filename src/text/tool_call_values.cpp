#include "text/tool_call_values.h"

#include <cctype>
#include <cstdlib>

#include "text/utf8.h"

namespace tpcli::text::tool_values {

using nlohmann::ordered_json;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

size_t skip_space(std::string_view text, size_t at) {
  while (at < text.size() && is_space(text[at])) ++at;
  return at;
}

std::string_view trim(std::string_view text) {
  const size_t from = skip_space(text, 0);
  size_t to = text.size();
  while (to > from && is_space(text[to - 1])) --to;
  return text.substr(from, to - from);
}

namespace {

bool is_word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '+' ||
         c == '-';
}

// The length of the string literal opening at text[0] (quote included), or incomplete.
ValueScan scan_string(std::string_view text) {
  const char quote = text[0];
  for (size_t i = 1; i < text.size(); ++i) {
    if (text[i] == '\\') {
      ++i;
    } else if (text[i] == quote) {
      return {ScanStatus::complete, i + 1};
    }
  }
  return {ScanStatus::incomplete};
}

ValueScan scan_brackets(std::string_view text) {
  std::string open;  // the closers still expected, innermost last
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '"' || c == '\'') {
      const ValueScan s = scan_string(text.substr(i));
      if (s.status != ScanStatus::complete) return s;
      i += s.length - 1;
    } else if (c == '{' || c == '[' || c == '(') {
      open.push_back(c == '{' ? '}' : c == '[' ? ']' : ')');
    } else if (c == '}' || c == ']' || c == ')') {
      if (open.empty() || open.back() != c) return {ScanStatus::invalid};
      open.pop_back();
      if (open.empty()) return {ScanStatus::complete, i + 1};
    }
  }
  return {ScanStatus::incomplete};
}

}  // namespace

ValueScan scan_value(std::string_view text, bool text_ended) {
  if (text.empty()) return {text_ended ? ScanStatus::invalid : ScanStatus::incomplete};
  const char c = text[0];
  if (c == '{' || c == '[' || c == '(') {
    const ValueScan s = scan_brackets(text);
    return s.status == ScanStatus::incomplete && text_ended ? ValueScan{ScanStatus::invalid} : s;
  }
  if (c == '"' || c == '\'') {
    const ValueScan s = scan_string(text);
    return s.status == ScanStatus::incomplete && text_ended ? ValueScan{ScanStatus::invalid} : s;
  }
  if (!is_word_char(c)) return {ScanStatus::invalid};
  size_t i = 0;
  while (i < text.size() && is_word_char(text[i])) ++i;
  if (i == text.size() && !text_ended) return {ScanStatus::incomplete};
  return {ScanStatus::complete, i};
}

std::optional<ordered_json> parse_json(std::string_view text) {
  ordered_json value = ordered_json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return std::nullopt;
  return value;
}

namespace {

// A recursive-descent reader of Python literals (and JSON, which is almost one).
class LiteralReader {
 public:
  explicit LiteralReader(std::string_view text) : text_(text) {}

  std::optional<ordered_json> whole_value() {
    auto value = read_value();
    if (!value || skip() != text_.size()) return std::nullopt;
    return value;
  }

  std::optional<std::vector<PythonCall>> whole_call_list() {
    if (!eat('[')) return std::nullopt;
    std::vector<PythonCall> calls;
    while (!eat(']')) {
      if (!calls.empty() && !eat(',')) return std::nullopt;
      if (!calls.empty() && eat(']')) break;  // a trailing comma
      auto call = read_call();
      if (!call) return std::nullopt;
      calls.push_back(std::move(*call));
    }
    if (calls.empty() || skip() != text_.size()) return std::nullopt;
    return calls;
  }

 private:
  size_t skip() { return at_ = skip_space(text_, at_); }
  bool eat(char c) {
    if (skip() < text_.size() && text_[at_] == c) return ++at_, true;
    return false;
  }

  std::string read_name() {
    skip();
    const size_t from = at_;
    while (at_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[at_])) || text_[at_] == '_' ||
                                  text_[at_] == '.' || text_[at_] == '-' || static_cast<unsigned char>(text_[at_]) >= 0x80))
      ++at_;
    return std::string(text_.substr(from, at_ - from));
  }

  std::optional<PythonCall> read_call() {
    PythonCall call{read_name(), ordered_json::object()};
    if (call.name.empty() || !eat('(')) return std::nullopt;
    while (!eat(')')) {
      if (!call.arguments.empty() && !eat(',')) return std::nullopt;
      if (!call.arguments.empty() && eat(')')) break;
      const std::string keyword = read_name();
      if (keyword.empty() || !eat('=')) return std::nullopt;  // positional arguments name nothing
      auto value = read_value();
      if (!value) return std::nullopt;
      call.arguments[keyword] = std::move(*value);
    }
    return call;
  }

  std::optional<ordered_json> read_value() {
    if (skip() >= text_.size()) return std::nullopt;
    const char c = text_[at_];
    if (c == '"' || c == '\'') return read_strings();
    if (c == '[' || c == '(') return read_sequence(c == '[' ? ']' : ')');
    if (c == '{') return read_dict();
    return read_word();
  }

  std::optional<ordered_json> read_sequence(char closer) {
    ++at_;
    ordered_json list = ordered_json::array();
    while (!eat(closer)) {
      if (!list.empty() && !eat(',')) return std::nullopt;
      if (!list.empty() && eat(closer)) break;
      auto value = read_value();
      if (!value) return std::nullopt;
      list.push_back(std::move(*value));
    }
    return list;
  }

  std::optional<ordered_json> read_dict() {
    ++at_;
    ordered_json dict = ordered_json::object();
    while (!eat('}')) {
      if (!dict.empty() && !eat(',')) return std::nullopt;
      if (!dict.empty() && eat('}')) break;
      auto key = read_value();
      if (!key || !eat(':')) return std::nullopt;
      auto value = read_value();
      if (!value) return std::nullopt;
      const std::string key_text = key->is_string() ? key->get<std::string>() : key->dump();
      dict[key_text] = std::move(*value);
    }
    return dict;
  }

  // Python joins adjacent string literals ("a" "b" is "ab").
  std::optional<ordered_json> read_strings() {
    std::string joined;
    do {
      auto part = read_string();
      if (!part) return std::nullopt;
      joined += *part;
    } while (skip() < text_.size() && (text_[at_] == '"' || text_[at_] == '\''));
    return ordered_json(std::move(joined));
  }

  std::optional<std::string> read_string() {
    const char quote = text_[at_++];
    std::string out;
    while (at_ < text_.size() && text_[at_] != quote) {
      if (text_[at_] != '\\') {
        out += text_[at_++];
        continue;
      }
      if (++at_ >= text_.size()) return std::nullopt;
      const char e = text_[at_++];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case '0': out += '\0'; break;
        case '\\': case '\'': case '"': case '/': out += e; break;
        case 'x': case 'u': case 'U': {
          const size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (at_ + digits > text_.size()) return std::nullopt;
          char32_t code = 0;
          for (size_t k = 0; k < digits; ++k) {
            const char h = text_[at_ + k];
            const int v = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
            if (v < 0) return std::nullopt;
            code = code * 16 + static_cast<char32_t>(v);
          }
          at_ += digits;
          // A JSON-style surrogate pair \ud83d\udc4b is one character.
          if (code >= 0xD800 && code < 0xDC00 && text_.substr(at_, 2) == "\\u" && at_ + 6 <= text_.size()) {
            const auto low = std::strtoul(std::string(text_.substr(at_ + 2, 4)).c_str(), nullptr, 16);
            if (low >= 0xDC00 && low < 0xE000) {
              code = 0x10000 + ((code - 0xD800) << 10) + (static_cast<char32_t>(low) - 0xDC00);
              at_ += 6;
            }
          }
          utf8::append(out, code);
          break;
        }
        default: out += '\\', out += e;  // Python keeps an unknown escape as written
      }
    }
    if (at_ >= text_.size()) return std::nullopt;
    ++at_;
    return out;
  }

  std::optional<ordered_json> read_word() {
    const size_t from = at_;
    while (at_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[at_])) || text_[at_] == '_' ||
                                  text_[at_] == '.' || text_[at_] == '+' || text_[at_] == '-'))
      ++at_;
    // An exponent's sign: 1e-07.
    std::string word(text_.substr(from, at_ - from));
    if (word.empty()) return std::nullopt;
    if (word == "True" || word == "true") return ordered_json(true);
    if (word == "False" || word == "false") return ordered_json(false);
    if (word == "None" || word == "null") return ordered_json(nullptr);
    if (word.front() == '+') word.erase(0, 1);
    if (auto number = parse_json(word); number && number->is_number()) return number;
    char* end = nullptr;
    const double value = std::strtod(word.c_str(), &end);  // Python's "1." and ".5"
    if (word.empty() || end != word.c_str() + word.size() || !(std::isdigit(static_cast<unsigned char>(word.back())) || word.back() == '.'))
      return std::nullopt;
    return ordered_json(value);
  }

  std::string_view text_;
  size_t at_ = 0;
};

}  // namespace

std::optional<ordered_json> parse_literal(std::string_view text) {
  if (auto json = parse_json(text)) return json;
  return LiteralReader(text).whole_value();
}

std::optional<std::vector<PythonCall>> parse_python_calls(std::string_view text) {
  return LiteralReader(text).whole_call_list();
}

std::optional<std::string> arguments_text(const ordered_json* arguments) {
  if (arguments == nullptr || arguments->is_null()) return "{}";
  // Invalid UTF-8 in a value becomes U+FFFD rather than an exception.
  const auto compact = [](const ordered_json& object) { return object.dump(-1, ' ', false, ordered_json::error_handler_t::replace); };
  if (arguments->is_object()) return compact(*arguments);
  if (arguments->is_string()) {
    const auto inner = parse_literal(arguments->get<std::string>());
    if (inner && inner->is_object()) return compact(*inner);
  }
  return std::nullopt;
}

}  // namespace tpcli::text::tool_values

#include "text/jinja_lexer.h"

#include <cctype>

#include "text/jinja_value.h"
#include "text/python_str.h"

namespace tpcli::text {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

// jinja2 joins source.splitlines() with "\n" and drops the final newline (keep_trailing_newline off).
std::string normalise_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

std::string rstrip(std::string_view s) {
  size_t end = s.size();
  while (end > 0 && is_space(s[end - 1])) --end;
  return std::string(s.substr(0, end));
}

void append_code_point(std::string& out, unsigned long c) { utf8_append(out, static_cast<char32_t>(c)); }

// A Python string literal's body with its escapes resolved (jinja2 decodes with unicode-escape).
size_t unescape_one(std::string_view body, size_t i, std::string& out) {
  const char c = body[i];
  auto hex = [&](size_t digits) {
    if (i + digits >= body.size()) throw TemplateError("truncated \\x/\\u escape in a string literal");
    const std::string h(body.substr(i + 1, digits));
    for (char d : h)
      if (!std::isxdigit(static_cast<unsigned char>(d))) throw TemplateError("bad \\x/\\u escape in a string literal");
    append_code_point(out, std::stoul(h, nullptr, 16));
    return i + 1 + digits;
  };
  switch (c) {
    case 'n': out.push_back('\n'); return i + 1;
    case 't': out.push_back('\t'); return i + 1;
    case 'r': out.push_back('\r'); return i + 1;
    case 'b': out.push_back('\b'); return i + 1;
    case 'f': out.push_back('\f'); return i + 1;
    case 'v': out.push_back('\v'); return i + 1;
    case 'a': out.push_back('\a'); return i + 1;
    case '\\': out.push_back('\\'); return i + 1;
    case '\'': out.push_back('\''); return i + 1;
    case '"': out.push_back('"'); return i + 1;
    case '\n': return i + 1;
    case 'x': return hex(2);
    case 'u': return hex(4);
    case 'U': return hex(8);
    default: break;
  }
  if (c >= '0' && c <= '7') {
    unsigned long v = 0;
    size_t j = i;
    for (; j < body.size() && j < i + 3 && body[j] >= '0' && body[j] <= '7'; ++j) v = v * 8 + (body[j] - '0');
    append_code_point(out, v);
    return j;
  }
  out.push_back('\\');
  out.push_back(c);
  return i + 1;
}

std::string unescape(std::string_view body) {
  std::string out;
  for (size_t i = 0; i < body.size();) {
    if (body[i] != '\\' || i + 1 >= body.size()) {
      out.push_back(body[i++]);
      continue;
    }
    i = unescape_one(body, i + 1, out);
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) : src_(normalise_newlines(source)) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      const size_t start = next_tag(pos_);
      if (start == std::string::npos) {
        emit(TokenType::Data, src_.substr(pos_));
        pos_ = src_.size();
        break;
      }
      lex_tag(start);
    }
    tokens_.push_back({TokenType::End, "", line_});
    return std::move(tokens_);
  }

 private:
  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;

  [[noreturn]] void fail(const std::string& what) const {
    throw TemplateError("template line " + std::to_string(line_) + ": " + what);
  }

  void emit(TokenType type, std::string text) {
    if (type == TokenType::Data && text.empty()) return;
    tokens_.push_back({type, text, line_});
    for (char c : text) line_ += c == '\n';
  }

  size_t next_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos && i + 1 < src_.size(); i = src_.find('{', i + 1)) {
      const char c = src_[i + 1];
      if (c == '{' || c == '%' || c == '#') return i;
    }
    return std::string::npos;
  }

  // The text before a tag, stripped as `{%-` or lstrip_blocks ask.
  std::string leading_text(size_t start, char kind, char sign) const {
    std::string text = src_.substr(pos_, start - pos_);
    if (sign == '-') return rstrip(text);
    if (sign == '+' || kind == '{') return text;
    const size_t line_start = text.rfind('\n') + 1;  // npos + 1 == 0
    if (line_start == 0 && !line_starting_) return text;
    for (size_t i = line_start; i < text.size(); ++i)
      if (!is_space(text[i])) return text;
    return text.substr(0, line_start);
  }

  // After a closing delimiter: `-` eats all whitespace, `+` nothing, else trim_blocks' one newline.
  void after_tag_end(char sign, bool trims) {
    if (sign == '-') {
      while (pos_ < src_.size() && is_space(src_[pos_])) line_ += src_[pos_++] == '\n';
    } else if (sign != '+' && trims && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_, ++line_;
    }
    line_starting_ = pos_ > 0 && src_[pos_ - 1] == '\n';
  }

  void lex_tag(size_t start) {
    const char kind = src_[start + 1];
    const char after = start + 2 < src_.size() ? src_[start + 2] : '\0';
    const char sign = after == '-' || after == '+' ? after : '\0';
    emit(TokenType::Data, leading_text(start, kind, sign));
    pos_ = start + 2 + (sign ? 1 : 0);
    if (kind == '#') return lex_comment();
    if (kind == '%' && try_raw()) return;
    emit(kind == '{' ? TokenType::VarBegin : TokenType::BlockBegin, "");
    lex_code(kind == '{' ? '}' : '%');
  }

  void lex_comment() {
    const size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) fail("unterminated comment");
    const char sign = end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : '\0';
    for (size_t i = pos_; i < end; ++i) line_ += src_[i] == '\n';
    pos_ = end + 2;
    after_tag_end(sign, true);
  }

  // {% raw %}...{% endraw %}: the body is data, untouched.
  bool try_raw() {
    size_t i = pos_;
    while (i < src_.size() && is_space(src_[i])) ++i;
    if (src_.compare(i, 3, "raw") != 0 || (i + 3 < src_.size() && is_name_char(src_[i + 3]))) return false;
    i += 3;
    while (i < src_.size() && is_space(src_[i])) ++i;
    char sign = '\0';
    if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) sign = src_[i++];
    if (src_.compare(i, 2, "%}") != 0) fail("expected '%}' after 'raw'");
    pos_ = i + 2;
    after_tag_end(sign, true);
    size_t search = pos_;
    for (;;) {
      const size_t tag = src_.find("{%", search);
      if (tag == std::string::npos) fail("missing {% endraw %}");
      size_t j = tag + 2;
      const char open_sign = j < src_.size() && (src_[j] == '-' || src_[j] == '+') ? src_[j] : '\0';
      if (open_sign) ++j;
      while (j < src_.size() && is_space(src_[j])) ++j;
      if (src_.compare(j, 6, "endraw") != 0) {
        search = tag + 2;
        continue;
      }
      j += 6;
      while (j < src_.size() && is_space(src_[j])) ++j;
      char close_sign = '\0';
      if (j < src_.size() && (src_[j] == '-' || src_[j] == '+')) close_sign = src_[j++];
      if (src_.compare(j, 2, "%}") != 0) fail("expected '%}' after 'endraw'");
      emit(TokenType::Data, leading_text(tag, '%', open_sign));
      pos_ = j + 2;
      after_tag_end(close_sign, true);
      return true;
    }
  }

  // Tokens of an expression or statement up to its closing `}}` / `%}`.
  // Inside open brackets `}}` / `%}` close a bracket, not the tag (jinja2's balancing stack).
  void lex_code(char closer) {
    int open_brackets = 0;
    for (;;) {
      while (pos_ < src_.size() && is_space(src_[pos_])) line_ += src_[pos_++] == '\n';
      if (pos_ >= src_.size()) fail(std::string("unexpected end of template, expected '") + closer + "}'");
      if (open_brackets == 0 && closes(closer)) return;
      lex_code_token();
      const Token& t = tokens_.back();
      if (t.type != TokenType::Operator) continue;
      if (t.text == "(" || t.text == "[" || t.text == "{") ++open_brackets;
      else if ((t.text == ")" || t.text == "]" || t.text == "}") && open_brackets > 0) --open_brackets;
    }
  }

  bool closes(char closer) {
    char sign = '\0';
    size_t i = pos_;
    if ((src_[i] == '-' || src_[i] == '+') && i + 1 < src_.size()) sign = src_[i++];
    if (sign == '+' && closer == '}') return false;
    if (i + 1 >= src_.size() || src_[i] != closer || src_[i + 1] != '}') return false;
    pos_ = i + 2;
    emit(closer == '}' ? TokenType::VarEnd : TokenType::BlockEnd, "");
    after_tag_end(sign, closer == '%');
    return true;
  }

  void lex_code_token() {
    const char c = src_[pos_];
    if (is_name_start(c)) {
      const size_t start = pos_;
      while (pos_ < src_.size() && is_name_char(src_[pos_])) ++pos_;
      return emit(TokenType::Name, src_.substr(start, pos_ - start));
    }
    if (c == '\'' || c == '"') return lex_string(c);
    if (is_digit(c)) return lex_number();
    static const char* const two_char[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* op : two_char)
      if (src_.compare(pos_, 2, op) == 0) {
        pos_ += 2;
        return emit(TokenType::Operator, op);
      }
    if (std::string_view("+-*/%~()[]{}<>=.:|,;").find(c) != std::string_view::npos) {
      ++pos_;
      return emit(TokenType::Operator, std::string(1, c));
    }
    fail(std::string("unexpected character '") + c + "'");
  }

  void lex_string(char quote) {
    size_t i = pos_ + 1;
    while (i < src_.size() && src_[i] != quote) i += src_[i] == '\\' ? 2 : 1;
    if (i >= src_.size()) fail("unterminated string");
    const std::string body = src_.substr(pos_ + 1, i - pos_ - 1);
    tokens_.push_back({TokenType::String, unescape(body), line_});
    for (char ch : body) line_ += ch == '\n';
    pos_ = i + 1;
  }

  void lex_number() {
    const size_t start = pos_;
    auto digits = [&] {
      while (pos_ < src_.size() && (is_digit(src_[pos_]) || src_[pos_] == '_')) ++pos_;
    };
    digits();
    bool is_float = false;
    const bool after_dot = start > 0 && src_[start - 1] == '.';  // x.0.1 is two subscripts
    if (!after_dot && pos_ + 1 < src_.size() && src_[pos_] == '.' && is_digit(src_[pos_ + 1])) {
      ++pos_, digits(), is_float = true;
    }
    if (!after_dot && pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t j = pos_ + 1;
      if (j < src_.size() && (src_[j] == '+' || src_[j] == '-')) ++j;
      if (j < src_.size() && is_digit(src_[j])) pos_ = j, digits(), is_float = true;
    }
    std::string text;
    for (size_t i = start; i < pos_; ++i)
      if (src_[i] != '_') text.push_back(src_[i]);
    emit(is_float ? TokenType::Float : TokenType::Integer, text);
  }
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) { return Lexer(source).run(); }

}  // namespace tpcli::text

#include "text/jinja_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <unordered_map>
#include <unordered_set>

#include <utf8proc.h>

#include "text/python_str.h"

namespace tpcli::text {

void throw_undefined(const Value& undefined) { throw TemplateError(undefined.undefined_hint()); }

namespace {

void check_size(size_t bytes) {
  if (bytes > MAX_VALUE_BYTES)
    throw TemplateError("a value would grow past " + std::to_string(MAX_VALUE_BYTES >> 20) + " MiB (template limit)");
}

void check_items(size_t n) {
  if (n > MAX_ITEMS) throw TemplateError("a list would grow past " + std::to_string(MAX_ITEMS) + " items (template limit)");
}

[[noreturn]] void unsupported(std::string_view op, const Value& a, const Value& b) {
  throw TemplateError("unsupported operand type(s) for " + std::string(op) + ": '" + a.type_name() + "' and '" +
                      b.type_name() + "'");
}

bool both_numbers(const Value& a, const Value& b) { return a.is_number() && b.is_number(); }
bool any_float(const Value& a, const Value& b) { return a.is_float() || b.is_float(); }

// Python ints are unbounded; ours fall back to floats past int64.
Value int_result(int64_t a, int64_t b, char op) {
  int64_t r = 0;
  bool overflow = false;
  switch (op) {
    case '+': overflow = __builtin_add_overflow(a, b, &r); break;
    case '-': overflow = __builtin_sub_overflow(a, b, &r); break;
    case '*': overflow = __builtin_mul_overflow(a, b, &r); break;
  }
  if (!overflow) return Value(r);
  const double x = static_cast<double>(a), y = static_cast<double>(b);
  return Value(op == '+' ? x + y : op == '-' ? x - y : x * y);
}

Value repeat(const Value& sequence, int64_t times) {
  times = std::max<int64_t>(times, 0);
  if (sequence.is_string()) {
    check_size(sequence.as_string().size() * static_cast<size_t>(times));
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += sequence.as_string();
    return Value(std::move(out));
  }
  const auto& items = sequence.as_list()->items;
  check_items(items.size() * static_cast<size_t>(times));
  std::vector<Value> out;
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), items.begin(), items.end());
  return sequence.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

Value add(const Value& a, const Value& b) {
  if (both_numbers(a, b)) return any_float(a, b) ? Value(a.to_double() + b.to_double()) : int_result(a.to_int(), b.to_int(), '+');
  if (a.is_string() && b.is_string()) {
    check_size(a.as_string().size() + b.as_string().size());
    if (a.is_safe() || b.is_safe())
      return Value::markup((a.is_safe() ? a.as_string() : html_escape(a.as_string())) +
                           (b.is_safe() ? b.as_string() : html_escape(b.as_string())));
    return Value(a.as_string() + b.as_string());
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    check_items(a.as_list()->items.size() + b.as_list()->items.size());
    std::vector<Value> items = a.as_list()->items;
    items.insert(items.end(), b.as_list()->items.begin(), b.as_list()->items.end());
    return a.is_tuple() ? Value::tuple(std::move(items)) : Value::list(std::move(items));
  }
  if (a.is_string() || a.is_list())
    throw TemplateError("can only concatenate " + a.type_name() + " (not \"" + b.type_name() + "\") to " + a.type_name());
  unsupported("+", a, b);
}

Value multiply(const Value& a, const Value& b) {
  if (both_numbers(a, b)) return any_float(a, b) ? Value(a.to_double() * b.to_double()) : int_result(a.to_int(), b.to_int(), '*');
  if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) return repeat(a, b.to_int());
  if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) return repeat(b, a.to_int());
  unsupported("*", a, b);
}

double checked_divisor(const Value& b) {
  if (b.to_double() == 0) throw TemplateError(b.is_float() ? "float division by zero" : "division by zero");
  return b.to_double();
}

Value floor_divide(const Value& a, const Value& b) {
  if (!both_numbers(a, b)) unsupported("//", a, b);
  if (any_float(a, b)) return Value(std::floor(a.to_double() / checked_divisor(b)));
  const int64_t x = a.to_int(), y = b.to_int();
  if (y == 0) throw TemplateError("integer division or modulo by zero");
  if (x == INT64_MIN && y == -1) return Value(-static_cast<double>(x));
  int64_t q = x / y;
  if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
  return Value(q);
}

Value modulo(const Value& a, const Value& b) {
  if (a.is_string()) return Value(percent_format(a.as_string(), b));
  if (!both_numbers(a, b)) unsupported("%", a, b);
  if (any_float(a, b)) {
    const double y = checked_divisor(b);
    double r = std::fmod(a.to_double(), y);
    if (r != 0 && ((r < 0) != (y < 0))) r += y;
    return Value(r);
  }
  const int64_t x = a.to_int(), y = b.to_int();
  if (y == 0) throw TemplateError("integer division or modulo by zero");
  if (y == -1) return Value(int64_t{0});
  int64_t r = x % y;
  if (r != 0 && ((r < 0) != (y < 0))) r += y;
  return Value(r);
}

Value power(const Value& a, const Value& b) {
  if (!both_numbers(a, b)) unsupported("** or pow()", a, b);
  if (!any_float(a, b) && b.to_int() >= 0) {
    int64_t result = 1, base = a.to_int();
    for (int64_t e = b.to_int(); e > 0; --e) {
      if (__builtin_mul_overflow(result, base, &result)) return Value(std::pow(a.to_double(), b.to_double()));
      if (result == 0 || result == 1) break;
    }
    return Value(result);
  }
  if (a.to_double() == 0 && b.to_double() < 0) throw TemplateError("0.0 cannot be raised to a negative power");
  return Value(std::pow(a.to_double(), b.to_double()));
}

}  // namespace

Value binary_op(std::string_view op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string s = to_str(a);
    s += to_str(b);
    check_size(s.size());
    return Value(std::move(s));
  }
  if (a.is_undefined()) throw_undefined(a);
  if (b.is_undefined()) throw_undefined(b);
  if (op == "+") return add(a, b);
  if (op == "*") return multiply(a, b);
  if (op == "%") return modulo(a, b);
  if (op == "//") return floor_divide(a, b);
  if (op == "**") return power(a, b);
  if (!both_numbers(a, b)) unsupported(op, a, b);
  if (op == "-") return any_float(a, b) ? Value(a.to_double() - b.to_double()) : int_result(a.to_int(), b.to_int(), '-');
  if (op == "/") return Value(a.to_double() / checked_divisor(b));
  throw TemplateError("unknown operator " + std::string(op));
}

Value negate(const Value& v) {
  if (v.is_undefined()) throw_undefined(v);
  if (v.is_float()) return Value(-v.to_double());
  if (v.is_int() || v.is_bool()) return int_result(0, v.to_int(), '-');
  throw TemplateError("bad operand type for unary -: '" + v.type_name() + "'");
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::String:
      if (!item.is_string())
        throw TemplateError("'in <string>' requires string as left operand, not " + item.type_name());
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Kind::List:
      for (const auto& v : iterate(container))
        if (equal(v, item)) return true;
      return false;
    case Kind::Dict:
      if ((item.is_list() && !item.is_tuple()) || item.is_dict()) throw TemplateError("unhashable type: '" + item.type_name() + "'");
      return container.as_dict()->find(item) != nullptr;
    case Kind::Undefined: return false;
    default: throw TemplateError("argument of type '" + container.type_name() + "' is not iterable");
  }
}

bool compare(std::string_view op, const Value& a, const Value& b) {
  if (op == "==") return equal(a, b);
  if (op == "!=") return !equal(a, b);
  if (a.is_undefined()) throw_undefined(a);
  if (b.is_undefined()) throw_undefined(b);
  if (op == "<") return less(a, b);
  if (op == ">") return less(b, a);
  if (op == "<=") return !less(b, a);
  if (op == ">=") return !less(a, b);
  throw TemplateError("unknown comparison " + std::string(op));
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined: return {};
    case Kind::List:
      if (v.is_generator()) return std::exchange(v.as_list()->items, {});  // used up, as in Python
      return v.as_list()->items;
    case Kind::Dict: {
      std::vector<Value> keys;
      for (const auto& [k, _] : v.as_dict()->items) keys.push_back(k);
      return keys;
    }
    case Kind::String: {
      std::vector<Value> chars;
      for (char32_t c : utf8_decode(v.as_string())) chars.emplace_back(utf8_encode(std::u32string(1, c)));
      return chars;
    }
    default: throw TemplateError("'" + v.type_name() + "' object is not iterable");
  }
}

int64_t length(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined: return 0;
    case Kind::String: return static_cast<int64_t>(utf8_length(v.as_string()));
    case Kind::List:
      if (v.is_generator()) break;
      return static_cast<int64_t>(v.as_list()->items.size());
    case Kind::Dict: return static_cast<int64_t>(v.as_dict()->items.size());
    default: break;
  }
  throw TemplateError("object of type '" + v.type_name() + "' has no len()");
}

// ---- case and whitespace ----

namespace {

// Unicode's simple case mappings (utf8proc): every script, one code point to one (Python's full
// mappings, ß -> SS, are not applied).
char32_t upper_of(char32_t c) { return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c))); }
char32_t lower_of(char32_t c) { return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))); }
char32_t title_of(char32_t c) { return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c))); }

// Python's "cased" characters: categories Lu, Ll and Lt.
bool is_cased(char32_t c) {
  const auto category = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return category == UTF8PROC_CATEGORY_LU || category == UTF8PROC_CATEGORY_LL || category == UTF8PROC_CATEGORY_LT;
}

// Python's str.isalpha() for one code point: any letter category (L*).
bool is_letter(char32_t c) {
  const auto category = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return category >= UTF8PROC_CATEGORY_LU && category <= UTF8PROC_CATEGORY_LO;
}

template <typename F>
std::string map_chars(std::string_view s, F f) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : utf8_decode(s)) utf8_append(out, f(c));
  return out;
}

}  // namespace

std::string python_upper(std::string_view s) { return map_chars(s, upper_of); }
std::string python_lower(std::string_view s) { return map_chars(s, lower_of); }

std::string python_capitalize(std::string_view s) {
  std::u32string u = utf8_decode(s);
  for (size_t i = 0; i < u.size(); ++i) u[i] = i == 0 ? title_of(u[i]) : lower_of(u[i]);
  return utf8_encode(u);
}

namespace {

// Python's str.title(): a letter after a non-letter starts a word.
std::string python_title(std::string_view s) {
  std::u32string u = utf8_decode(s);
  bool previous_cased = false;
  for (char32_t& c : u) {
    c = previous_cased ? lower_of(c) : title_of(c);
    previous_cased = is_cased(c);
  }
  return utf8_encode(u);
}

}  // namespace

std::string python_strip(std::string_view s, const Value& chars, bool left, bool right) {
  const std::u32string u = utf8_decode(s);
  const bool whitespace = chars.is_none() || chars.is_undefined();
  if (!whitespace && !chars.is_string()) throw TemplateError("strip arg must be None or str");
  const std::u32string set = whitespace ? U"" : utf8_decode(chars.as_string());
  auto strips = [&](char32_t c) { return whitespace ? is_python_space(c) : set.find(c) != std::u32string::npos; };
  size_t begin = 0, end = u.size();
  if (left)
    while (begin < end && strips(u[begin])) ++begin;
  if (right)
    while (end > begin && strips(u[end - 1])) --end;
  return utf8_encode(std::u32string_view(u).substr(begin, end - begin));
}

// ---- subscripts ----

namespace {

// Python's slice.indices(length) walked: the positions a[start:stop:step] takes.
std::vector<int64_t> slice_positions(int64_t n, const Value& start, const Value& stop, const Value& step) {
  auto as_index = [](const Value& v) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    if (!v.is_int() && !v.is_bool()) throw TemplateError("slice indices must be integers or None");
    return v.to_int();
  };
  const int64_t s = as_index(step).value_or(1);
  if (s == 0) throw TemplateError("slice step cannot be zero");
  auto clamp = [&](std::optional<int64_t> i, int64_t if_none) {
    if (!i) return if_none;
    int64_t v = *i < 0 ? *i + n : *i;
    if (s > 0) return std::clamp<int64_t>(v, 0, n);
    return std::clamp<int64_t>(v, -1, n - 1);
  };
  const int64_t first = clamp(as_index(start), s > 0 ? 0 : n - 1);
  const int64_t last = clamp(as_index(stop), s > 0 ? n : -1);
  std::vector<int64_t> positions;
  for (int64_t i = first; s > 0 ? i < last : i > last; i += s) positions.push_back(i);
  return positions;
}

Value index_sequence(const Value& object, const Value& key) {
  const int64_t n = length(object);
  int64_t i = key.to_int();
  if (i < 0) i += n;
  if (i < 0 || i >= n) return Value::undefined(object.type_name() + " object has no element " + std::to_string(key.to_int()));
  if (object.is_list()) return object.as_list()->items[static_cast<size_t>(i)];
  const std::u32string u = utf8_decode(object.as_string());
  return Value(utf8_encode(std::u32string(1, u[static_cast<size_t>(i)])));
}

}  // namespace

Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step) {
  if (object.is_undefined()) throw_undefined(object);
  if (object.is_string()) {
    const std::u32string u = utf8_decode(object.as_string());
    std::u32string out;
    for (int64_t i : slice_positions(static_cast<int64_t>(u.size()), start, stop, step)) out.push_back(u[i]);
    return Value(utf8_encode(out));
  }
  if (object.is_list()) {
    const auto& items = object.as_list()->items;
    std::vector<Value> out;
    for (int64_t i : slice_positions(static_cast<int64_t>(items.size()), start, stop, step)) out.push_back(items[i]);
    return object.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
  }
  // jinja2 compiles a slice to a plain Python subscript (not environment.getitem): it raises.
  if (object.is_dict()) throw TemplateError("unhashable type: 'slice'");
  throw TemplateError("'" + object.type_name() + "' object is not subscriptable");
}

Value get_item(const Value& object, const Value& key) {
  if (object.is_undefined()) throw_undefined(object);
  if (object.is_dict()) {
    if (const Value* v = object.as_dict()->find(key)) return *v;
  } else if ((object.is_list() || object.is_string()) && (key.is_int() || key.is_bool())) {
    return index_sequence(object, key);
  } else if (object.is_object() && key.is_string()) {
    if (const Value* v = object.as_object()->attributes.find(key.as_string())) return *v;
  }
  if (key.is_string()) {  // jinja2 tries the attribute next
    Value attribute = get_attribute(object, key.as_string());
    if (!attribute.is_undefined()) return attribute;
  }
  if (object.is_dict()) return Value::undefined("'dict object' has no attribute " + to_repr(key));
  return Value::undefined("'" + object.type_name() + " object' has no attribute " + to_repr(key));
}

Value call_value(const Value& callee, CallArgs& args) {
  if (callee.is_callable()) return callee.as_callable()->call(args);
  if (callee.is_object()) {
    if (const Value* call = callee.as_object()->attributes.find("__call__")) return call_value(*call, args);
  }
  if (callee.is_undefined()) throw_undefined(callee);
  throw TemplateError("'" + callee.type_name() + "' object is not callable");
}

// ---- methods ----

namespace {

using Method = Value (*)(const Value& self, CallArgs& args);


const std::string& string_arg(const CallArgs& args, size_t i, std::string_view method) {
  const Value& v = args.at(i);
  if (!v.is_string()) throw TemplateError(std::string(method) + "() argument must be str, not " + v.type_name());
  return v.as_string();
}

Value str_split(const std::string& s, const Value& sep, const Value& maxsplit_value) {
  int64_t maxsplit = maxsplit_value.is_int() ? maxsplit_value.as_int() : -1;
  std::vector<Value> parts;
  if (sep.is_none() || sep.is_undefined()) {
    const std::u32string u = utf8_decode(s);
    size_t i = 0;
    for (;;) {
      while (i < u.size() && is_python_space(u[i])) ++i;
      if (i >= u.size()) break;
      if (maxsplit == 0) {
        size_t end = u.size();
        while (end > i && is_python_space(u[end - 1])) --end;
        parts.emplace_back(utf8_encode(u.substr(i, end - i)));
        break;
      }
      size_t j = i;
      while (j < u.size() && !is_python_space(u[j])) ++j;
      parts.emplace_back(utf8_encode(u.substr(i, j - i)));
      --maxsplit;
      i = j;
    }
    return Value::list(std::move(parts));
  }
  if (!sep.is_string()) throw TemplateError("must be str or None, not " + sep.type_name());
  const std::string& d = sep.as_string();
  if (d.empty()) throw TemplateError("empty separator");
  size_t start = 0;
  for (size_t at; maxsplit != 0 && (at = s.find(d, start)) != std::string::npos; --maxsplit) {
    parts.emplace_back(s.substr(start, at - start));
    start = at + d.size();
  }
  parts.emplace_back(s.substr(start));
  return Value::list(std::move(parts));
}

Value str_rsplit(const std::string& s, const Value& sep, const Value& maxsplit_value) {
  if (!maxsplit_value.is_int() || maxsplit_value.as_int() < 0 || sep.is_none() || sep.is_undefined())
    return str_split(s, sep, maxsplit_value);
  if (!sep.is_string() || sep.as_string().empty()) throw TemplateError("empty separator");
  const std::string& d = sep.as_string();
  std::vector<Value> parts;
  size_t end = s.size();
  for (int64_t n = maxsplit_value.as_int(); n > 0; --n) {
    if (end < d.size()) break;
    const size_t at = s.rfind(d, end - d.size());
    if (at == std::string::npos) break;
    parts.emplace_back(s.substr(at + d.size(), end - at - d.size()));
    end = at;
  }
  parts.emplace_back(s.substr(0, end));
  std::reverse(parts.begin(), parts.end());
  return Value::list(std::move(parts));
}

}  // namespace

Value python_splitlines(const std::string& s, bool keepends) {
  const std::u32string u = utf8_decode(s);
  auto breaks = [](char32_t c) {
    return c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1C && c <= 0x1E) || c == 0x85 || c == 0x2028 ||
           c == 0x2029;
  };
  std::vector<Value> lines;
  size_t start = 0;
  for (size_t i = 0; i < u.size(); ++i) {
    if (!breaks(u[i])) continue;
    const size_t end = i;
    if (u[i] == '\r' && i + 1 < u.size() && u[i + 1] == '\n') ++i;
    lines.emplace_back(utf8_encode(u.substr(start, (keepends ? i + 1 : end) - start)));
    start = i + 1;
  }
  if (start < u.size()) lines.emplace_back(utf8_encode(u.substr(start)));
  return Value::list(std::move(lines));
}

namespace {

// startswith/endswith: a str or a tuple of them.
bool affix_matches(const std::string& s, const Value& affix, bool at_start) {
  if (affix.is_list()) {
    for (const auto& a : affix.as_list()->items)
      if (affix_matches(s, a, at_start)) return true;
    return false;
  }
  if (!affix.is_string())
    throw TemplateError(std::string(at_start ? "startswith" : "endswith") +
                        " first arg must be str or a tuple of str, not " + affix.type_name());
  const std::string& a = affix.as_string();
  if (a.size() > s.size()) return false;
  return at_start ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0;
}

Value str_replace(const std::string& s, const std::string& old, const std::string& replacement, int64_t count) {
  std::string out;
  if (old.empty()) {  // Python inserts the replacement between every character
    const std::u32string u = utf8_decode(s);
    for (size_t i = 0; i <= u.size(); ++i) {
      if (count < 0 || static_cast<int64_t>(i) < count) out += replacement;
      if (i < u.size()) utf8_append(out, u[i]);
      check_size(out.size());
    }
    return Value(std::move(out));
  }
  size_t start = 0;
  for (size_t at; count != 0 && (at = s.find(old, start)) != std::string::npos; --count) {
    out.append(s, start, at - start);
    out += replacement;
    check_size(out.size());
    start = at + old.size();
  }
  out.append(s, start);
  return Value(std::move(out));
}

int64_t code_point_index(const std::string& s, size_t byte_offset) {
  return static_cast<int64_t>(utf8_length(std::string_view(s).substr(0, byte_offset)));
}

Value str_find(const std::string& s, const std::string& needle, bool reverse) {
  const size_t at = reverse ? s.rfind(needle) : s.find(needle);
  return Value(at == std::string::npos ? int64_t{-1} : code_point_index(s, at));
}

std::string pad(const std::string& s, int64_t width, const Value& fill_value, char align) {
  const std::string fill = fill_value.is_string() ? fill_value.as_string() : " ";
  const int64_t n = static_cast<int64_t>(utf8_length(s));
  if (width <= n) return s;
  check_size(static_cast<size_t>(width) * fill.size());
  const int64_t total = width - n;
  int64_t left = align == '<' ? 0 : align == '>' ? total : total / 2 + (total & width & 1);
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (int64_t i = 0; i < total - left; ++i) out += fill;
  return out;
}

bool all_chars(const std::string& s, bool (*pred)(char32_t)) {
  const std::u32string u = utf8_decode(s);
  return !u.empty() && std::all_of(u.begin(), u.end(), pred);
}

Value str_find_or_index(const std::string& name, const std::string& s, CallArgs& args) {
  Value at = str_find(s, string_arg(args, 0, name), name[0] == 'r');
  if (name.find("index") != std::string::npos && at.as_int() < 0) throw TemplateError("substring not found");
  return at;
}

Value str_count(const std::string& name, const std::string& s, CallArgs& args) {
  const std::string& needle = string_arg(args, 0, name);
  if (needle.empty()) return Value(static_cast<int64_t>(utf8_length(s) + 1));
  int64_t n = 0;
  for (size_t at = s.find(needle); at != std::string::npos; at = s.find(needle, at + needle.size())) ++n;
  return Value(n);
}

Value str_join(const std::string&, const std::string& s, CallArgs& args) {
  std::string out;
  const auto items = iterate(args.at(0));
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].is_string())
      throw TemplateError("sequence item " + std::to_string(i) + ": expected str instance, " + items[i].type_name() + " found");
    if (i) out += s;
    out += items[i].as_string();
    check_size(out.size());
  }
  return Value(std::move(out));
}

Value str_pad(const std::string& name, const std::string& s, CallArgs& args) {
  const char align = name == "center" ? '^' : name == "ljust" ? '<' : '>';
  return Value(pad(s, args.at(0).is_int() ? args.at(0).as_int() : 0, args.at(1), align));
}

Value str_zfill(const std::string&, const std::string& s, CallArgs& args) {
  const int64_t width = args.at(0).is_int() ? args.at(0).as_int() : 0;
  const bool sign = !s.empty() && (s[0] == '-' || s[0] == '+');
  const std::string padded = pad(s.substr(sign), width - sign, Value("0"), '>');
  return Value((sign ? s.substr(0, 1) : "") + padded);
}

Value str_partition(const std::string& name, const std::string& s, CallArgs& args) {
  const std::string& sep = string_arg(args, 0, name);
  const size_t at = name[0] == 'r' ? s.rfind(sep) : s.find(sep);
  if (at == std::string::npos)
    return name[0] == 'r' ? Value::tuple({Value(""), Value(""), Value(s)}) : Value::tuple({Value(s), Value(""), Value("")});
  return Value::tuple({Value(s.substr(0, at)), Value(sep), Value(s.substr(at + sep.size()))});
}

Value str_remove_affix(const std::string& name, const std::string& s, CallArgs& args) {
  const std::string& affix = string_arg(args, 0, name);
  const bool prefix = name == "removeprefix";
  if (!affix_matches(s, Value(affix), prefix)) return Value(s);
  return Value(prefix ? s.substr(affix.size()) : s.substr(0, s.size() - affix.size()));
}

bool is_decimal_digit(char32_t c) { return c >= '0' && c <= '9'; }

using StringMethod = Value (*)(const std::string& name, const std::string& s, CallArgs& args);

// Python's str methods a template may call, by name.
const std::unordered_map<std::string, StringMethod>& string_methods() {
  using A = CallArgs;
  using S = const std::string&;
  static const std::unordered_map<std::string, StringMethod> table = {
      {"strip", [](S, S s, A& a) { return Value(python_strip(s, a.at(0, "chars"), true, true)); }},
      {"lstrip", [](S, S s, A& a) { return Value(python_strip(s, a.at(0, "chars"), true, false)); }},
      {"rstrip", [](S, S s, A& a) { return Value(python_strip(s, a.at(0, "chars"), false, true)); }},
      {"split", [](S, S s, A& a) { return str_split(s, a.at(0, "sep"), a.at(1, "maxsplit")); }},
      {"rsplit", [](S, S s, A& a) { return str_rsplit(s, a.at(0, "sep"), a.at(1, "maxsplit")); }},
      {"splitlines", [](S, S s, A& a) { return python_splitlines(s, truthy(a.at(0, "keepends"))); }},
      {"startswith", [](S, S s, A& a) { return Value(affix_matches(s, a.at(0), true)); }},
      {"endswith", [](S, S s, A& a) { return Value(affix_matches(s, a.at(0), false)); }},
      {"replace", [](S name, S s, A& a) {
         const Value& count = a.at(2, "count");
         return str_replace(s, string_arg(a, 0, name), string_arg(a, 1, name), count.is_int() ? count.as_int() : -1);
       }},
      {"upper", [](S, S s, A&) { return Value(python_upper(s)); }},
      {"lower", [](S, S s, A&) { return Value(python_lower(s)); }},
      {"casefold", [](S, S s, A&) { return Value(python_lower(s)); }},
      {"title", [](S, S s, A&) { return Value(python_title(s)); }},
      {"capitalize", [](S, S s, A&) { return Value(python_capitalize(s)); }},
      {"swapcase", [](S, S s, A&) {
         return Value(map_chars(s, [](char32_t c) { return upper_of(c) != c ? upper_of(c) : lower_of(c); }));
       }},
      {"find", str_find_or_index}, {"rfind", str_find_or_index}, {"index", str_find_or_index},
      {"rindex", str_find_or_index}, {"count", str_count}, {"join", str_join},
      {"format", [](S, S s, A& a) { return Value(brace_format(s, a)); }},
      {"center", str_pad}, {"ljust", str_pad}, {"rjust", str_pad}, {"zfill", str_zfill},
      {"partition", str_partition}, {"rpartition", str_partition},
      {"removeprefix", str_remove_affix}, {"removesuffix", str_remove_affix},
      {"isdigit", [](S, S s, A&) { return Value(all_chars(s, is_decimal_digit)); }},
      {"isnumeric", [](S, S s, A&) { return Value(all_chars(s, is_decimal_digit)); }},
      {"isdecimal", [](S, S s, A&) { return Value(all_chars(s, is_decimal_digit)); }},
      {"isalpha", [](S, S s, A&) { return Value(all_chars(s, is_letter)); }},
      {"isalnum", [](S, S s, A&) {
         return Value(all_chars(s, [](char32_t c) { return is_letter(c) || is_decimal_digit(c); }));
       }},
      {"isspace", [](S, S s, A&) { return Value(all_chars(s, is_python_space)); }},
      {"islower", [](S, S s, A&) { return Value(python_lower(s) == s && python_upper(s) != s); }},
      {"isupper", [](S, S s, A&) { return Value(python_upper(s) == s && python_lower(s) != s); }},
      {"istitle", [](S, S s, A&) { return Value(python_title(s) == s && python_lower(s) != s); }},
  };
  return table;
}

Value string_method(const std::string& name, const std::string& s, CallArgs& args) {
  const auto it = string_methods().find(name);
  if (it == string_methods().end()) throw TemplateError("'str object' has no attribute '" + name + "'");
  return it->second(name, s, args);
}

// The methods the immutable sandbox refuses (jinja2.sandbox's _mutable_spec).
bool is_mutating(const Value& object, const std::string& name) {
  static const std::unordered_set<std::string> list_mutators = {"append", "clear",  "pop",    "reverse",
                                                                "insert", "sort",   "extend", "remove"};
  static const std::unordered_set<std::string> dict_mutators = {"clear", "pop", "popitem", "setdefault", "update"};
  if (object.is_list() && !object.is_tuple()) return list_mutators.contains(name);
  if (object.is_dict()) return dict_mutators.contains(name);
  return false;
}

Value list_method(const std::string& name, const Value& self, CallArgs& args) {
  const auto& items = self.as_list()->items;
  if (name == "index") {
    for (size_t i = 0; i < items.size(); ++i)
      if (equal(items[i], args.at(0))) return Value(static_cast<int64_t>(i));
    throw TemplateError(to_repr(args.at(0)) + " is not in list");
  }
  if (name == "count") {
    int64_t n = 0;
    for (const auto& v : items) n += equal(v, args.at(0));
    return Value(n);
  }
  return Value::list(items);  // copy
}

Value dict_method(const std::string& name, const Value& self, CallArgs& args) {
  const DictData& d = *self.as_dict();
  if (name == "get") {
    if (const Value* v = d.find(args.at(0))) return *v;
    const Value& fallback = args.at(1, "default");
    return fallback.is_undefined() ? Value(None{}) : fallback;
  }
  std::vector<Value> out;
  for (const auto& [k, v] : d.items) {
    if (name == "items") out.push_back(Value::tuple({k, v}));
    else if (name == "keys") out.push_back(k);
    else if (name == "values") out.push_back(v);
  }
  if (name == "copy") {
    auto copy = std::make_shared<DictData>(d);
    return Value(copy);
  }
  return Value::list(std::move(out));
}

Value bound_method(const Value& self, const std::string& name) {
  return make_function(name, [self, name](CallArgs& args) -> Value {
    if (self.is_string()) return string_method(name, self.as_string(), args);
    if (self.is_list()) return list_method(name, self, args);
    return dict_method(name, self, args);
  });
}

Value unsafe_method(const Value& self, const std::string& name) {
  const std::string type = self.type_name();
  return make_function(name, [type, name](CallArgs&) -> Value {
    throw TemplateError("access to attribute '" + name + "' of '" + type + "' object is unsafe");
  });
}

}  // namespace

Value get_attribute(const Value& object, const std::string& name) {
  if (object.is_undefined()) throw_undefined(object);
  if (is_mutating(object, name)) return unsafe_method(object, name);
  if (object.is_string() && string_methods().contains(name)) return bound_method(object, name);
  if (object.is_list() && (name == "index" || name == "count" || (name == "copy" && !object.is_tuple())))
    return bound_method(object, name);
  if (object.is_dict()) {
    if (name == "get" || name == "items" || name == "keys" || name == "values" || name == "copy")
      return bound_method(object, name);
    if (const Value* v = object.as_dict()->find(name)) return *v;
    return Value::undefined("'dict object' has no attribute '" + name + "'");
  }
  if (object.is_object()) {
    if (const Value* v = object.as_object()->attributes.find(name)) return *v;
  }
  if (object.is_none()) return Value::undefined("'None' has no attribute '" + name + "'");
  return Value::undefined("'" + object.type_name() + " object' has no attribute '" + name + "'");
}

// ---- formatting ----

namespace {

struct Spec {
  char fill = ' ', align = '\0', sign = '-';
  bool alternate = false, zero = false, grouping = false;
  int width = -1, precision = -1;
  char type = '\0';
};

std::string group_thousands(const std::string& digits) {
  std::string out;
  const size_t n = digits.size();
  for (size_t i = 0; i < n; ++i) {
    if (i && (n - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

std::string printf_double(double d, int precision, char type) {
  char fmt[16], buf[512];
  std::snprintf(fmt, sizeof fmt, "%%.%d%c", std::min(precision, 100), type);
  std::snprintf(buf, sizeof buf, fmt, d);
  return buf;
}

// A number's text for format type `type` (without sign handling of the caller).
std::string format_number(const Value& v, const Spec& spec) {
  const char type = spec.type;
  if (type == 'd' || type == 'x' || type == 'X' || type == 'o' || type == 'b' || type == 'c' ||
      (type == '\0' && !v.is_float())) {
    if (v.is_float()) throw TemplateError(std::string("Unknown format code '") + type + "' for object of type 'float'");
    const int64_t i = v.to_int();
    const uint64_t magnitude = i < 0 ? 0 - static_cast<uint64_t>(i) : static_cast<uint64_t>(i);
    std::string digits;
    if (type == 'c') return utf8_encode(std::u32string(1, static_cast<char32_t>(i)));
    const int base = type == 'x' || type == 'X' ? 16 : type == 'o' ? 8 : type == 'b' ? 2 : 10;
    for (uint64_t m = magnitude; m > 0 || digits.empty(); m /= base) digits.insert(digits.begin(), "0123456789abcdef"[m % base]);
    if (type == 'X') digits = python_upper(digits);
    if (spec.grouping && base == 10) digits = group_thousands(digits);
    if (spec.alternate && base != 10) digits = std::string("0") + (type == 'b' ? 'b' : type == 'o' ? 'o' : type) + digits;
    return (i < 0 ? "-" : "") + digits;
  }
  const double d = v.to_double();
  if (type == '\0' && spec.precision < 0) return float_repr(d);
  if (type == '%') return printf_double(d * 100, spec.precision < 0 ? 6 : spec.precision, 'f') + "%";
  const char t = type == '\0' ? 'g' : type;
  std::string s = printf_double(d, spec.precision < 0 ? 6 : spec.precision, t);
  if (spec.grouping) {
    const bool negative = s[0] == '-';
    const size_t end = s.find_first_not_of("0123456789", negative);
    s = (negative ? "-" : "") + group_thousands(s.substr(negative, end - negative)) + s.substr(end);
  }
  return s;
}

std::string apply_sign_and_width(std::string body, const Spec& spec, bool numeric) {
  if (numeric && body[0] != '-') {
    if (spec.sign == '+') body = "+" + body;
    else if (spec.sign == ' ') body = " " + body;
  }
  if (spec.width < 0) return body;
  Spec s = spec;
  if (numeric && spec.zero && !spec.align) s.fill = '0', s.align = '=';
  const int64_t n = static_cast<int64_t>(utf8_length(body));
  if (n >= s.width) return body;
  const size_t missing = static_cast<size_t>(s.width - n);
  const char align = s.align ? s.align : numeric ? '>' : '<';
  if (align == '=') {
    const size_t sign_len = !body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' ');
    return body.substr(0, sign_len) + std::string(missing, s.fill) + body.substr(sign_len);
  }
  if (align == '<') return body + std::string(missing, s.fill);
  if (align == '>') return std::string(missing, s.fill) + body;
  return std::string(missing / 2, s.fill) + body + std::string(missing - missing / 2, s.fill);
}

Spec parse_spec(std::string_view text) {
  Spec spec;
  size_t i = 0;
  auto is_align = [](char c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (text.size() >= 2 && is_align(text[1])) spec.fill = text[0], spec.align = text[1], i = 2;
  else if (!text.empty() && is_align(text[0])) spec.align = text[0], i = 1;
  if (i < text.size() && (text[i] == '+' || text[i] == '-' || text[i] == ' ')) spec.sign = text[i++];
  if (i < text.size() && text[i] == '#') spec.alternate = true, ++i;
  if (i < text.size() && text[i] == '0') spec.zero = true, ++i;
  auto number = [&] {
    int v = 0;
    size_t start = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') v = std::min(v * 10 + (text[i++] - '0'), 100000);
    return i > start ? v : -1;
  };
  spec.width = number();
  if (i < text.size() && (text[i] == ',' || text[i] == '_')) spec.grouping = true, ++i;
  if (i < text.size() && text[i] == '.') ++i, spec.precision = number();
  if (i < text.size()) spec.type = text[i++];
  if (i != text.size()) throw TemplateError("Invalid format specifier '" + std::string(text) + "'");
  return spec;
}

std::string format_with_spec(const Value& v, std::string_view spec_text) {
  const Spec spec = parse_spec(spec_text);
  if (v.is_number() && !(v.is_bool() && spec.type == '\0') && spec.type != 's')
    return apply_sign_and_width(format_number(v, spec), spec, true);
  if (spec.type != '\0' && spec.type != 's')
    throw TemplateError(std::string("Unknown format code '") + spec.type + "' for object of type '" + v.type_name() + "'");
  std::string s = to_str(v);
  if (spec.precision >= 0) s = utf8_encode(utf8_decode(s).substr(0, static_cast<size_t>(spec.precision)));
  return apply_sign_and_width(s, spec, false);
}

// A printf conversion's flags, width and precision, as Python's % reads them.
struct PercentSpec {
  std::string flags;
  int width = -1, precision = -1;
  char conversion = 's';
};

std::string percent_one(const PercentSpec& p, const Value& v) {
  Spec spec;
  spec.width = p.width;
  spec.precision = p.precision;
  spec.alternate = p.flags.find('#') != std::string::npos;
  if (p.flags.find('+') != std::string::npos) spec.sign = '+';
  else if (p.flags.find(' ') != std::string::npos) spec.sign = ' ';
  const bool left = p.flags.find('-') != std::string::npos;
  if (left) spec.align = '<';
  spec.zero = !left && p.flags.find('0') != std::string::npos;
  const char c = p.conversion;
  if (c == 's' || c == 'r' || c == 'a') {
    std::string s = c == 's' ? to_str(v) : to_repr(v);
    if (p.precision >= 0) s = utf8_encode(utf8_decode(s).substr(0, static_cast<size_t>(p.precision)));
    if (!left) spec.align = '>';
    return apply_sign_and_width(s, spec, false);
  }
  if (!v.is_number()) throw TemplateError(std::string("%") + c + " format: a real number is required, not " + v.type_name());
  Value number = v;
  if (c == 'd' || c == 'i' || c == 'u' || c == 'x' || c == 'X' || c == 'o' || c == 'c') {
    if (v.is_float()) number = Value(static_cast<int64_t>(std::trunc(v.to_double())));
    spec.type = c == 'i' || c == 'u' ? 'd' : c;
  } else {
    number = Value(v.to_double());
    spec.type = c;
    if (spec.precision < 0) spec.precision = 6;
  }
  return apply_sign_and_width(format_number(number, spec), spec, true);
}

}  // namespace

std::string percent_format(std::string_view format, const Value& args) {
  std::vector<Value> positional;
  const bool mapping = args.is_dict() && format.find("%(") != std::string_view::npos;
  if (args.is_tuple()) positional = args.as_list()->items;
  else if (!mapping) positional.push_back(args);
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out.push_back(format[i]);
      continue;
    }
    if (++i >= format.size()) throw TemplateError("incomplete format");
    const Value* value = nullptr;
    if (format[i] == '(') {
      const size_t close = format.find(')', i);
      if (close == std::string_view::npos || !mapping) throw TemplateError("format requires a mapping");
      value = args.as_dict()->find(format.substr(i + 1, close - i - 1));
      if (!value) throw TemplateError("KeyError: '" + std::string(format.substr(i + 1, close - i - 1)) + "'");
      i = close + 1;
    }
    PercentSpec p;
    while (i < format.size() && std::string_view("-+ #0").find(format[i]) != std::string_view::npos) p.flags += format[i++];
    auto number = [&] {
      int v = -1;
      while (i < format.size() && format[i] >= '0' && format[i] <= '9') v = std::min((v < 0 ? 0 : v * 10) + (format[i++] - '0'), 100000);
      return v;
    };
    p.width = number();
    if (i < format.size() && format[i] == '.') ++i, p.precision = std::max(number(), 0);
    if (i >= format.size()) throw TemplateError("incomplete format");
    p.conversion = format[i];
    if (p.conversion == '%') {
      out.push_back('%');
      continue;
    }
    if (std::string_view("sradiuxXoceEfFgG").find(p.conversion) == std::string_view::npos)
      throw TemplateError(std::string("unsupported format character '") + p.conversion + "'");
    if (!value) {
      if (next >= positional.size()) throw TemplateError("not enough arguments for format string");
      value = &positional[next++];
    }
    out += percent_one(p, *value);
    check_size(out.size());
  }
  // Python checks for unused arguments only when they are a tuple or a single non-mapping value
  // (a list or dict counts as a mapping there).
  const bool checks_unused = !(args.is_list() && !args.is_tuple()) && !args.is_dict();
  if (checks_unused && next < positional.size()) throw TemplateError("not all arguments converted during string formatting");
  return out;
}

std::string brace_format(std::string_view format, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  char numbering = '\0';  // 'a' automatic ({}), 'm' manual ({0}): Python refuses to mix them
  for (size_t i = 0; i < format.size(); ++i) {
    const char c = format[i];
    if (c == '}') {
      if (i + 1 < format.size() && format[i + 1] == '}') ++i;
      else throw TemplateError("Single '}' encountered in format string");
      out.push_back('}');
      continue;
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < format.size() && format[i + 1] == '{') {
      out.push_back('{'), ++i;
      continue;
    }
    const size_t close = format.find('}', i);
    if (close == std::string_view::npos) throw TemplateError("Single '{' encountered in format string");
    std::string_view field = format.substr(i + 1, close - i - 1);
    i = close;
    std::string_view spec, conversion;
    if (const size_t colon = field.find(':'); colon != std::string_view::npos) spec = field.substr(colon + 1), field = field.substr(0, colon);
    if (const size_t bang = field.find('!'); bang != std::string_view::npos) conversion = field.substr(bang + 1), field = field.substr(0, bang);
    Value v;
    const bool automatic = field.empty();
    if (automatic ? numbering == 'm' : numbering == 'a')
      throw TemplateError("cannot switch between automatic and manual field numbering");
    if (std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) numbering = automatic ? 'a' : 'm';
    if (field.empty()) {
      if (auto_index >= args.positional.size()) throw TemplateError("Replacement index " + std::to_string(auto_index) + " out of range for positional args tuple");
      v = args.positional[auto_index++];
    } else if (std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
      const size_t index = std::stoul(std::string(field));
      if (index >= args.positional.size()) throw TemplateError("Replacement index " + std::string(field) + " out of range for positional args tuple");
      v = args.positional[index];
    } else {
      const Value* kw = args.keyword(field);
      if (!kw) throw TemplateError("KeyError: '" + std::string(field) + "'");
      v = *kw;
    }
    if (conversion == "r") v = Value(to_repr(v));
    else if (conversion == "s") v = Value(to_str(v));
    out += format_with_spec(v, spec);
    check_size(out.size());
  }
  return out;
}

}  // namespace tpcli::text

#include "text/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "text/jinja_ops.h"
#include "text/python_str.h"

namespace tpcli::text {

namespace {

// jinja2.sandbox.MAX_RANGE: range() refuses more items.
constexpr int64_t MAX_RANGE = 100000;

using Filter = Value (*)(const Value& subject, CallArgs& args);
using Test = bool (*)(const Value& subject, CallArgs& args);


int64_t int_arg(const CallArgs& args, size_t i, std::string_view name, int64_t fallback) {
  const Value& v = args.at(i, name);
  if (v.is_undefined() || v.is_none()) return fallback;
  if (!v.is_int() && !v.is_bool()) throw TemplateError(std::string(name) + " must be an integer, not " + v.type_name());
  return v.to_int();
}

bool bool_arg(const CallArgs& args, size_t i, std::string_view name, bool fallback) {
  const Value& v = args.at(i, name);
  return v.is_undefined() ? fallback : truthy(v);
}

// The rest of a call's arguments from position `from` on (for select("test", args...)).
CallArgs rest_args(const CallArgs& args, size_t from) {
  CallArgs rest;
  for (size_t i = from; i < args.positional.size(); ++i) rest.positional.push_back(args.positional[i]);
  rest.keywords = args.keywords;
  return rest;
}

// An item's attribute for attribute= arguments: "a.b" and "0" walk into nested values.
Value attribute_path(const Value& item, const Value& path) {
  if (!path.is_string()) return get_item(item, path);
  Value v = item;
  std::string_view rest = path.as_string();
  while (true) {
    const size_t dot = rest.find('.');
    const std::string part(rest.substr(0, dot));
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    v = numeric ? get_item(v, Value(static_cast<int64_t>(std::stoll(part)))) : get_item(v, Value(part));
    if (dot == std::string_view::npos) return v;
    if (v.is_undefined()) return v;
    rest = rest.substr(dot + 1);
  }
}

// case_sensitive=False: strings compare lowercased.
Value sort_key(const Value& v, bool case_sensitive) {
  return !case_sensitive && v.is_string() ? Value(python_lower(v.as_string())) : v;
}

std::string trim_python_space(const std::string& s) { return python_strip(s, Value(None{}), true, true); }

// ---- filters ----

Value filter_abs(const Value& v, CallArgs&) {
  if (v.is_float()) return Value(std::fabs(v.to_double()));
  if (v.is_int() || v.is_bool()) return v.to_int() < 0 ? negate(v) : Value(v.to_int());
  throw TemplateError("bad operand type for abs(): '" + v.type_name() + "'");
}

// Python's getattr only: a dict's keys are no attributes here (x.name would fall back to them).
Value filter_attr(const Value& v, CallArgs& args) {
  const std::string name = to_str(args.at(0, "name"));
  Value attribute = get_attribute(v, name);
  if (v.is_dict() && !attribute.is_callable()) return Value::undefined("'dict object' has no attribute '" + name + "'");
  return attribute;
}

Value filter_batch(const Value& v, CallArgs& args) {
  const int64_t size = int_arg(args, 0, "linecount", 1);
  if (size <= 0) throw TemplateError("batch size must be positive");
  const Value& fill = args.at(1, "fill_with");
  std::vector<Value> batches, current;
  for (const auto& item : iterate(v)) {
    current.push_back(item);
    if (static_cast<int64_t>(current.size()) == size) batches.push_back(Value::list(std::move(current))), current.clear();
  }
  if (!current.empty()) {
    if (!fill.is_undefined() && !fill.is_none())
      while (static_cast<int64_t>(current.size()) < size) current.push_back(fill);
    batches.push_back(Value::list(std::move(current)));
  }
  return Value::generator(std::move(batches));
}

Value filter_capitalize(const Value& v, CallArgs&) { return Value(python_capitalize(to_str(v))); }

Value filter_center(const Value& v, CallArgs& args) {
  CallArgs center_args;
  center_args.positional.push_back(Value(int_arg(args, 0, "width", 80)));
  return call_value(get_attribute(Value(to_str(v)), "center"), center_args);
}

Value filter_default(const Value& v, CallArgs& args) {
  const bool boolean = bool_arg(args, 1, "boolean", false);
  if (v.is_undefined() || (boolean && !truthy(v))) {
    const Value& fallback = args.at(0, "default_value");
    return fallback.is_undefined() ? Value("") : fallback;
  }
  return v;
}

Value filter_dictsort(const Value& v, CallArgs& args) {
  if (!v.is_dict()) throw TemplateError("You can only sort by either \"key\" or \"value\" of a mapping");
  const bool case_sensitive = bool_arg(args, 0, "case_sensitive", false);
  const std::string by = args.at(1, "by").is_string() ? args.at(1, "by").as_string() : "key";
  if (by != "key" && by != "value") throw TemplateError("You can only sort by either \"key\" or \"value\"");
  const bool reverse = bool_arg(args, 2, "reverse", false);
  std::vector<std::pair<Value, Value>> items = v.as_dict()->items;
  std::stable_sort(items.begin(), items.end(), [&](const auto& a, const auto& b) {
    const Value& x = by == "key" ? a.first : a.second;
    const Value& y = by == "key" ? b.first : b.second;
    return reverse ? less(sort_key(y, case_sensitive), sort_key(x, case_sensitive))
                   : less(sort_key(x, case_sensitive), sort_key(y, case_sensitive));
  });
  std::vector<Value> out;
  for (auto& [k, val] : items) out.push_back(Value::tuple({k, val}));
  return Value::list(std::move(out));
}

Value filter_escape(const Value& v, CallArgs&) { return v.is_safe() ? v : Value::markup(html_escape(to_str(v))); }
Value filter_forceescape(const Value& v, CallArgs&) { return Value::markup(html_escape(to_str(v))); }

Value filter_first(const Value& v, CallArgs&) {
  if (v.is_list()) {
    if (!v.as_list()->items.empty()) return v.as_list()->items.front();
  } else {
    auto items = iterate(v);
    if (!items.empty()) return items.front();
  }
  return Value::undefined("No first item, sequence was empty.");
}

Value filter_last(const Value& v, CallArgs&) {
  if (v.is_generator()) throw TemplateError("'generator' object is not reversible");
  auto items = iterate(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

// Python's float(str): surrounding whitespace, underscores between digits, inf/nan.
std::optional<double> parse_float(const std::string& text) {
  std::string s = trim_python_space(text);
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  const double d = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  const std::string lower = python_lower(s);
  if (lower.find("0x") != std::string::npos) return std::nullopt;  // strtod reads hex, Python does not
  return d;
}

std::optional<int64_t> parse_int(const std::string& text, int base) {
  std::string s = trim_python_space(text);
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  if (s.empty()) return std::nullopt;
  size_t start = (s[0] == '-' || s[0] == '+') ? 1 : 0;
  if (base == 16 && s.compare(start, 2, "0x") == 0) start += 2;
  if (start >= s.size()) return std::nullopt;
  for (size_t i = start; i < s.size(); ++i) {
    const char c = static_cast<char>(std::tolower(static_cast<unsigned char>(s[i])));
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'z' ? c - 'a' + 10 : 99;
    if (digit >= base) return std::nullopt;
  }
  errno = 0;
  const long long v = std::strtoll(s.c_str(), nullptr, base);
  if (errno == ERANGE) return std::nullopt;
  return v;
}

Value filter_float(const Value& v, CallArgs& args) {
  const Value& fallback = args.at(0, "default");
  if (v.is_undefined()) throw_undefined(v);
  if (v.is_number()) return Value(v.to_double());
  if (v.is_string())
    if (auto d = parse_float(v.as_string())) return Value(*d);
  return fallback.is_undefined() ? Value(0.0) : fallback;
}

Value filter_int(const Value& v, CallArgs& args) {
  const Value& fallback = args.at(0, "default");
  if (v.is_undefined()) throw_undefined(v);
  const int64_t base = int_arg(args, 1, "base", 10);
  if (v.is_int() || v.is_bool()) return Value(v.to_int());
  if (v.is_float() && std::isfinite(v.to_double())) return Value(static_cast<int64_t>(std::trunc(v.to_double())));
  if (v.is_string()) {
    if (auto i = parse_int(v.as_string(), static_cast<int>(base))) return Value(*i);
    if (auto d = parse_float(v.as_string()); d && std::isfinite(*d)) return Value(static_cast<int64_t>(std::trunc(*d)));
  }
  return fallback.is_undefined() ? Value(int64_t{0}) : fallback;
}

Value filter_format(const Value& v, CallArgs& args) {
  if (!args.positional.empty() && !args.keywords.empty())
    throw TemplateError("can't handle positional and keyword arguments at the same time");
  if (!args.keywords.empty()) {
    Value mapping = Value::dict();
    for (auto& [k, val] : args.keywords) mapping.as_dict()->set(Value(k), val);
    return Value(percent_format(to_str(v), mapping));
  }
  return Value(percent_format(to_str(v), Value::tuple(args.positional)));
}

Value filter_groupby(const Value& v, CallArgs& args) {
  const Value& attribute = args.at(0, "attribute");
  const Value& fallback = args.at(1, "default");
  const bool case_sensitive = bool_arg(args, 2, "case_sensitive", false);
  std::vector<std::pair<Value, Value>> keyed;
  for (const auto& item : iterate(v)) {
    Value key = attribute_path(item, attribute);
    if (key.is_undefined() && !fallback.is_undefined()) key = fallback;
    keyed.emplace_back(sort_key(key, case_sensitive), item);
  }
  std::stable_sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) { return less(a.first, b.first); });
  std::vector<Value> groups;
  for (size_t i = 0; i < keyed.size();) {
    std::vector<Value> members;
    size_t j = i;
    for (; j < keyed.size() && equal(keyed[j].first, keyed[i].first); ++j) members.push_back(keyed[j].second);
    groups.push_back(Value::tuple({keyed[i].first, Value::list(std::move(members))}));
    i = j;
  }
  return Value::list(std::move(groups));
}

Value filter_indent(const Value& v, CallArgs& args) {
  if (v.is_undefined()) throw_undefined(v);  // jinja2 appends "\n" to the value: only strings take it
  if (!v.is_string()) throw TemplateError("unsupported operand type(s) for +=: '" + v.type_name() + "' and 'str'");
  const Value& width = args.at(0, "width");
  const std::string indention =
      width.is_string() ? width.as_string() : std::string(static_cast<size_t>(std::max<int64_t>(0, int_arg(args, 0, "width", 4))), ' ');
  const bool first = bool_arg(args, 1, "first", false), blank = bool_arg(args, 2, "blank", false);
  const auto lines = python_splitlines(to_str(v) + "\n", false).as_list()->items;
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i].as_string();
    if (i > 0) out += "\n";
    if (i > 0 && (blank || !line.empty())) out += indention;
    out += line;
  }
  return Value(first ? indention + out : out);
}

Value filter_items(const Value& v, CallArgs&) {
  if (v.is_undefined()) return Value::generator({});
  if (!v.is_dict()) throw TemplateError("Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, val] : v.as_dict()->items) out.push_back(Value::tuple({k, val}));
  return Value::generator(std::move(out));
}

Value filter_join(const Value& v, CallArgs& args) {
  const Value& separator = args.at(0, "d");
  const Value& attribute = args.at(1, "attribute");
  const std::string sep = separator.is_undefined() ? "" : to_str(separator);
  std::string out;
  bool first = true;
  for (const auto& item : iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += to_str(attribute.is_undefined() ? item : attribute_path(item, attribute));
    if (out.size() > MAX_VALUE_BYTES) throw TemplateError("join: result past the template size limit");
  }
  return Value(std::move(out));
}

Value filter_length(const Value& v, CallArgs&) { return Value(length(v)); }
Value filter_list(const Value& v, CallArgs&) { return Value::list(iterate(v)); }
Value filter_lower(const Value& v, CallArgs&) { return Value(python_lower(to_str(v))); }
Value filter_upper(const Value& v, CallArgs&) { return Value(python_upper(to_str(v))); }

Value filter_map(const Value& v, CallArgs& args) {
  std::vector<Value> out;
  if (!truthy(v)) return Value::generator({});  // jinja2: `if value:` before iterating
  if (args.positional.empty()) {
    const Value& attribute = args.at(0, "attribute");
    const Value* fallback = args.keyword("default");
    for (const auto& item : iterate(v)) {
      Value mapped = attribute_path(item, attribute);
      out.push_back(mapped.is_undefined() && fallback ? *fallback : mapped);
    }
    return Value::generator(std::move(out));
  }
  const std::string name = to_str(args.positional[0]);
  CallArgs rest = rest_args(args, 1);
  for (const auto& item : iterate(v)) out.push_back(apply_filter(name, item, rest));
  return Value::generator(std::move(out));
}

Value extreme(const Value& v, CallArgs& args, bool want_max) {
  const bool case_sensitive = bool_arg(args, 0, "case_sensitive", false);
  const Value& attribute = args.at(1, "attribute");
  const Value* best = nullptr;
  Value best_key;
  const auto items = iterate(v);
  for (const auto& item : items) {
    Value key = sort_key(attribute.is_undefined() ? item : attribute_path(item, attribute), case_sensitive);
    if (!best || (want_max ? less(best_key, key) : less(key, best_key))) best = &item, best_key = key;
  }
  return best ? *best : Value::undefined(std::string("No aggregated item, sequence was empty."));
}

Value filter_max(const Value& v, CallArgs& args) { return extreme(v, args, true); }
Value filter_min(const Value& v, CallArgs& args) { return extreme(v, args, false); }
Value filter_pprint(const Value& v, CallArgs&) { return Value(to_repr(v)); }

// select / reject / selectattr / rejectattr.
Value select_items(const Value& v, CallArgs& args, bool by_attribute, bool keep) {
  std::vector<Value> out;
  const size_t test_at = by_attribute ? 1 : 0;
  const Value& attribute = by_attribute ? args.at(0) : Value();
  const bool has_test = args.positional.size() > test_at;
  const std::string test = has_test ? to_str(args.positional[test_at]) : "";
  CallArgs rest = rest_args(args, test_at + 1);
  if (!truthy(v)) return Value::generator({});  // jinja2: `if value:` before iterating
  for (const auto& item : iterate(v)) {
    const Value subject = by_attribute ? attribute_path(item, attribute) : item;
    const bool passes = has_test ? apply_test(test, subject, rest) : truthy(subject);
    if (passes == keep) out.push_back(item);
  }
  return Value::generator(std::move(out));
}

Value filter_select(const Value& v, CallArgs& args) { return select_items(v, args, false, true); }
Value filter_reject(const Value& v, CallArgs& args) { return select_items(v, args, false, false); }
Value filter_selectattr(const Value& v, CallArgs& args) { return select_items(v, args, true, true); }
Value filter_rejectattr(const Value& v, CallArgs& args) { return select_items(v, args, true, false); }

Value filter_replace(const Value& v, CallArgs& args) {
  CallArgs replace_args;
  replace_args.positional = {Value(to_str(args.at(0, "old"))), Value(to_str(args.at(1, "new")))};
  if (const Value& count = args.at(2, "count"); count.is_int()) replace_args.positional.push_back(count);
  return call_value(get_attribute(Value(to_str(v)), "replace"), replace_args);
}

Value filter_reverse(const Value& v, CallArgs&) {
  if (v.is_string()) {
    std::u32string u = utf8_decode(v.as_string());
    std::reverse(u.begin(), u.end());
    return Value(utf8_encode(u));
  }
  auto items = iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::generator(std::move(items));
}

// Python's round(x, n): correctly rounded, ties to even on the exact binary value.
double python_round(double x, int64_t digits) {
  if (!std::isfinite(x)) return x;
  if (digits > 300) return x;
  if (digits < -300) return 0.0 * x;
  char buf[512];
  if (digits >= 0) {
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(digits), x);
    return std::strtod(buf, nullptr);
  }
  const double scale = std::pow(10.0, static_cast<double>(-digits));
  return std::nearbyint(x / scale) * scale;
}

Value filter_round(const Value& v, CallArgs& args) {
  const int64_t precision = int_arg(args, 0, "precision", 0);
  const std::string method = args.at(1, "method").is_string() ? args.at(1, "method").as_string() : "common";
  if (!v.is_number()) throw TemplateError("type " + v.type_name() + " doesn't define __round__ method");
  const double x = v.to_double();
  if (method == "common") {
    if (!v.is_float()) return Value(v.to_int());
    return Value(python_round(x, precision));
  }
  if (method != "ceil" && method != "floor") throw TemplateError("method must be common, ceil or floor");
  const double scale = std::pow(10.0, static_cast<double>(precision));
  return Value((method == "ceil" ? std::ceil(x * scale) : std::floor(x * scale)) / scale);
}

Value filter_safe(const Value& v, CallArgs&) { return Value::markup(to_str(v)); }

Value filter_slice(const Value& v, CallArgs& args) {
  const int64_t slices = int_arg(args, 0, "slices", 1);
  if (slices <= 0) throw TemplateError("slice count must be positive");
  const Value& fill = args.at(1, "fill_with");
  const auto items = iterate(v);
  const int64_t n = static_cast<int64_t>(items.size());
  const int64_t per = n / slices, extra = n % slices;
  std::vector<Value> out;
  int64_t offset = 0;
  for (int64_t i = 0; i < slices; ++i) {
    const int64_t start = offset + i * per + std::min(i, extra);
    const int64_t end = start + per + (i < extra ? 1 : 0);
    std::vector<Value> part(items.begin() + start, items.begin() + end);
    if (!fill.is_undefined() && !fill.is_none() && i >= extra && extra > 0) part.push_back(fill);
    out.push_back(Value::list(std::move(part)));
  }
  return Value::generator(std::move(out));
}

Value filter_sort(const Value& v, CallArgs& args) {
  const bool reverse = bool_arg(args, 0, "reverse", false);
  const bool case_sensitive = bool_arg(args, 1, "case_sensitive", false);
  const Value& attribute = args.at(2, "attribute");
  std::vector<std::pair<Value, Value>> keyed;
  for (const auto& item : iterate(v))
    keyed.emplace_back(sort_key(attribute.is_undefined() ? item : attribute_path(item, attribute), case_sensitive), item);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    return reverse ? less(b.first, a.first) : less(a.first, b.first);
  });
  std::vector<Value> out;
  for (auto& [_, item] : keyed) out.push_back(item);
  return Value::list(std::move(out));
}

Value filter_string(const Value& v, CallArgs&) { return v.is_string() ? v : Value(to_str(v)); }

Value filter_striptags(const Value& v, CallArgs&) {
  std::string out;
  bool in_tag = false;
  for (char c : to_str(v)) {
    if (c == '<') in_tag = true;
    else if (c == '>' && in_tag) in_tag = false, out.push_back(' ');
    else if (!in_tag) out.push_back(c);
  }
  CallArgs no_args;
  std::string joined;
  for (const auto& word : call_value(get_attribute(Value(out), "split"), no_args).as_list()->items) {
    if (!joined.empty()) joined.push_back(' ');
    joined += word.as_string();
  }
  return Value(joined);
}

Value filter_sum(const Value& v, CallArgs& args) {
  const Value& attribute = args.at(0, "attribute");
  Value total = args.at(1, "start");
  if (total.is_undefined()) total = Value(int64_t{0});
  if (total.is_string()) throw TemplateError("sum() can't sum strings [use ''.join(seq) instead]");
  for (const auto& item : iterate(v)) total = binary_op("+", total, attribute.is_undefined() ? item : attribute_path(item, attribute));
  return total;
}

// jinja2's title: words start after whitespace or one of -([{<.
Value filter_title(const Value& v, CallArgs&) {
  std::u32string u = utf8_decode(to_str(v));
  bool word_start = true;
  for (char32_t& c : u) {
    const bool separator = is_python_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (separator) {
      word_start = true;
      continue;
    }
    const std::string one = utf8_encode(std::u32string(1, c));
    const std::string mapped = word_start ? python_upper(one) : python_lower(one);
    c = utf8_decode(mapped)[0];
    word_start = false;
  }
  return Value(utf8_encode(u));
}

// transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
Value filter_tojson(const Value& v, CallArgs& args) {
  JsonOptions options;
  options.ensure_ascii = bool_arg(args, 0, "ensure_ascii", false);
  const Value& indent = args.at(1, "indent");
  if (indent.is_string()) options.indent = indent.as_string();
  else if (indent.is_int() || indent.is_bool()) options.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(indent.to_int(), 0, 1000)), ' ');
  else if (!indent.is_undefined() && !indent.is_none()) throw TemplateError("tojson: indent must be an int or a str");
  if (options.indent) options.item_separator = ",";
  const Value& separators = args.at(2, "separators");
  if (separators.is_list() && separators.as_list()->items.size() == 2) {
    options.item_separator = to_str(separators.as_list()->items[0]);
    options.key_separator = to_str(separators.as_list()->items[1]);
  } else if (!separators.is_undefined() && !separators.is_none()) {
    throw TemplateError("tojson: separators must be a pair of strings");
  }
  options.sort_keys = bool_arg(args, 3, "sort_keys", false);
  return Value(to_json(v, options));
}

Value filter_trim(const Value& v, CallArgs& args) { return Value(python_strip(to_str(v), args.at(0, "chars"), true, true)); }

// jinja2 measures the value with len() and returns it unchanged when short enough (a list too).
Value filter_truncate(const Value& v, CallArgs& args) {
  const int64_t max_length = int_arg(args, 0, "length", 255);
  const bool killwords = bool_arg(args, 1, "killwords", false);
  const std::u32string end = args.at(2, "end").is_string() ? utf8_decode(args.at(2, "end").as_string()) : U"...";
  const int64_t leeway = int_arg(args, 3, "leeway", 5);
  if (max_length < static_cast<int64_t>(end.size())) throw TemplateError("expected length >= " + std::to_string(end.size()));
  if (length(v) <= max_length + leeway) return v;
  if (!v.is_string()) throw TemplateError("truncate needs a string, not " + v.type_name());
  const std::u32string s = utf8_decode(v.as_string());
  std::u32string kept = s.substr(0, static_cast<size_t>(max_length - static_cast<int64_t>(end.size())));
  if (!killwords) {
    const size_t space = kept.rfind(U' ');
    if (space != std::u32string::npos) kept = kept.substr(0, space);
  }
  return Value(utf8_encode(kept + end));
}

Value filter_unique(const Value& v, CallArgs& args) {
  const bool case_sensitive = bool_arg(args, 0, "case_sensitive", false);
  const Value& attribute = args.at(1, "attribute");
  std::vector<Value> seen, out;
  for (const auto& item : iterate(v)) {
    Value key = sort_key(attribute.is_undefined() ? item : attribute_path(item, attribute), case_sensitive);
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, key); })) continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return Value::generator(std::move(out));
}

Value filter_wordcount(const Value& v, CallArgs&) {
  int64_t words = 0;
  bool in_word = false;
  for (char32_t c : utf8_decode(to_str(v))) {
    const bool word_char = c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                           (c >= 0x80 && !is_python_space(c) && is_python_printable(c));
    words += word_char && !in_word;
    in_word = word_char;
  }
  return Value(words);
}

Value filter_urlencode(const Value& v, CallArgs&) {
  std::string out;
  for (unsigned char c : to_str(v)) {
    if (std::isalnum(c) || c == '_' || c == '.' || c == '-' || c == '~' || c == '/') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  return Value(out);
}

const std::unordered_map<std::string, Filter>& filters() {
  static const std::unordered_map<std::string, Filter> table = {
      {"abs", filter_abs},         {"attr", filter_attr},           {"batch", filter_batch},
      {"capitalize", filter_capitalize}, {"center", filter_center}, {"count", filter_length},
      {"d", filter_default},       {"default", filter_default},     {"dictsort", filter_dictsort},
      {"e", filter_escape},        {"escape", filter_escape},       {"forceescape", filter_forceescape},
      {"first", filter_first},     {"float", filter_float},         {"format", filter_format},
      {"groupby", filter_groupby}, {"indent", filter_indent},       {"int", filter_int},
      {"items", filter_items},     {"join", filter_join},           {"last", filter_last},
      {"length", filter_length},   {"list", filter_list},           {"lower", filter_lower},
      {"map", filter_map},         {"max", filter_max},             {"min", filter_min},
      {"pprint", filter_pprint},   {"reject", filter_reject},       {"rejectattr", filter_rejectattr},
      {"replace", filter_replace}, {"reverse", filter_reverse},     {"round", filter_round},
      {"safe", filter_safe},       {"select", filter_select},       {"selectattr", filter_selectattr},
      {"slice", filter_slice},     {"sort", filter_sort},           {"string", filter_string},
      {"striptags", filter_striptags}, {"sum", filter_sum},         {"title", filter_title},
      {"tojson", filter_tojson},   {"trim", filter_trim},           {"truncate", filter_truncate},
      {"unique", filter_unique},   {"upper", filter_upper},         {"urlencode", filter_urlencode},
      {"wordcount", filter_wordcount},
  };
  return table;
}

// ---- tests ----

const Value& other(const CallArgs& args) { return args.at(0); }

bool test_defined(const Value& v, CallArgs&) { return !v.is_undefined(); }
bool test_undefined(const Value& v, CallArgs&) { return v.is_undefined(); }
bool test_none(const Value& v, CallArgs&) { return v.is_none(); }
bool test_boolean(const Value& v, CallArgs&) { return v.is_bool(); }
bool test_true(const Value& v, CallArgs&) { return v.is_bool() && v.as_bool(); }
bool test_false(const Value& v, CallArgs&) { return v.is_bool() && !v.as_bool(); }
bool test_integer(const Value& v, CallArgs&) { return v.is_int(); }
bool test_float(const Value& v, CallArgs&) { return v.is_float(); }
bool test_number(const Value& v, CallArgs&) { return v.is_number(); }
bool test_string(const Value& v, CallArgs&) { return v.is_string(); }
bool test_mapping(const Value& v, CallArgs&) { return v.is_dict(); }
bool test_iterable(const Value& v, CallArgs&) {
  return v.is_string() || v.is_list() || v.is_generator() || v.is_dict() || v.is_undefined();
}
bool test_sequence(const Value& v, CallArgs&) { return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined(); }
// Undefined counts: it defines __call__ (to raise).
bool test_callable(const Value& v, CallArgs&) {
  return v.is_callable() || v.is_undefined() || (v.is_object() && v.as_object()->attributes.find("__call__"));
}
bool test_escaped(const Value& v, CallArgs&) { return v.is_safe(); }
// str.islower() / isupper(): at least one cased character, and none of the other case.
bool test_lower(const Value& v, CallArgs&) {
  return v.is_string() && python_lower(v.as_string()) == v.as_string() && python_upper(v.as_string()) != v.as_string();
}
bool test_upper(const Value& v, CallArgs&) {
  return v.is_string() && python_upper(v.as_string()) == v.as_string() && python_lower(v.as_string()) != v.as_string();
}

// value % 2 == 1 / == 0, as jinja2 computes them (floats too).
bool test_odd(const Value& v, CallArgs&) { return equal(binary_op("%", v, Value(int64_t{2})), Value(int64_t{1})); }
bool test_even(const Value& v, CallArgs&) { return equal(binary_op("%", v, Value(int64_t{2})), Value(int64_t{0})); }
bool test_divisibleby(const Value& v, CallArgs& args) {
  return truthy(compare("==", binary_op("%", v, other(args)), Value(int64_t{0})));
}
bool test_eq(const Value& v, CallArgs& args) { return compare("==", v, other(args)); }
bool test_ne(const Value& v, CallArgs& args) { return compare("!=", v, other(args)); }
bool test_lt(const Value& v, CallArgs& args) { return compare("<", v, other(args)); }
bool test_le(const Value& v, CallArgs& args) { return compare("<=", v, other(args)); }
bool test_gt(const Value& v, CallArgs& args) { return compare(">", v, other(args)); }
bool test_ge(const Value& v, CallArgs& args) { return compare(">=", v, other(args)); }
bool test_in(const Value& v, CallArgs& args) { return contains(other(args), v); }

// Python's `is`: the same object; None, bools and small values compare by value.
bool test_sameas(const Value& v, CallArgs& args) {
  const Value& o = other(args);
  if (v.kind() != o.kind()) return false;
  switch (v.kind()) {
    case Kind::List: return v.as_list() == o.as_list();
    case Kind::Dict: return v.as_dict() == o.as_dict();
    case Kind::Object: return v.as_object() == o.as_object();
    case Kind::Callable: return v.as_callable() == o.as_callable();
    default: return equal(v, o);
  }
}
bool test_filter(const Value& v, CallArgs&) { return v.is_string() && filter_exists(v.as_string()); }
bool test_test(const Value& v, CallArgs&) { return v.is_string() && test_exists(v.as_string()); }

const std::unordered_map<std::string, Test>& tests() {
  static const std::unordered_map<std::string, Test> table = {
      {"defined", test_defined},   {"undefined", test_undefined}, {"none", test_none},
      {"boolean", test_boolean},   {"true", test_true},           {"false", test_false},
      {"integer", test_integer},   {"float", test_float},         {"number", test_number},
      {"string", test_string},     {"mapping", test_mapping},     {"iterable", test_iterable},
      {"sequence", test_sequence}, {"callable", test_callable},   {"escaped", test_escaped},
      {"lower", test_lower},       {"upper", test_upper},         {"odd", test_odd},
      {"even", test_even},         {"divisibleby", test_divisibleby}, {"eq", test_eq},
      {"equalto", test_eq},        {"==", test_eq},               {"ne", test_ne},
      {"!=", test_ne},             {"lt", test_lt},               {"lessthan", test_lt},
      {"<", test_lt},              {"le", test_le},               {"<=", test_le},
      {"gt", test_gt},             {"greaterthan", test_gt},      {">", test_gt},
      {"ge", test_ge},             {">=", test_ge},               {"in", test_in},
      {"sameas", test_sameas},     {"filter", test_filter},       {"test", test_test},
  };
  return table;
}

// ---- globals ----

Value global_range(CallArgs& args) {
  int64_t start = 0, stop = 0, step = 1;
  const size_t n = args.positional.size();
  auto integer = [&](size_t i) {
    const Value& v = args.positional[i];
    if (!v.is_int() && !v.is_bool()) throw TemplateError("'" + v.type_name() + "' object cannot be interpreted as an integer");
    return v.to_int();
  };
  if (n == 1) stop = integer(0);
  else if (n == 2 || n == 3) start = integer(0), stop = integer(1), step = n == 3 ? integer(2) : 1;
  else throw TemplateError("range expected 1 to 3 arguments, got " + std::to_string(n));
  if (step == 0) throw TemplateError("range() arg 3 must not be zero");
  const int64_t count = step > 0 ? (stop > start ? (stop - start + step - 1) / step : 0)
                                 : (start > stop ? (start - stop - step - 1) / -step : 0);
  if (count > MAX_RANGE)
    throw TemplateError("Range too big. The sandbox blocks ranges larger than MAX_RANGE (" + std::to_string(MAX_RANGE) + ").");
  std::vector<Value> out;
  for (int64_t i = 0, v = start; i < count; ++i, v += step) out.emplace_back(v);
  return Value::list(std::move(out));
}

Value global_dict(CallArgs& args) {
  Value d = Value::dict();
  for (const auto& p : args.positional) {
    if (!p.is_dict()) throw TemplateError("dict() positional argument must be a mapping");
    for (const auto& [k, v] : p.as_dict()->items) d.as_dict()->set(k, v);
  }
  for (const auto& [k, v] : args.keywords) d.as_dict()->set(Value(k), v);
  return d;
}

Value global_namespace(ObjectArena& arena, CallArgs& args) {
  auto ns = arena.make("Namespace", true);
  for (const auto& p : args.positional) {
    if (!p.is_dict()) throw TemplateError("namespace() positional argument must be a mapping");
    for (const auto& [k, v] : p.as_dict()->items) ns->attributes.set(k, v);
  }
  for (const auto& [k, v] : args.keywords) ns->attributes.set(Value(k), v);
  return Value(ns);
}

Value global_cycler(ObjectArena& arena, CallArgs& args) {
  if (args.positional.empty()) throw TemplateError("at least one item has to be provided");
  auto object = arena.make("Cycler", false);
  auto items = std::make_shared<std::vector<Value>>(args.positional);
  auto position = std::make_shared<size_t>(0);
  std::weak_ptr<ObjectData> weak = object;
  auto refresh = [weak, items, position] {
    if (auto o = weak.lock()) o->attributes.set(Value("current"), (*items)[*position]);
  };
  object->attributes.set(Value("next"), make_function("next", [items, position, refresh](CallArgs&) {
    Value v = (*items)[*position];
    *position = (*position + 1) % items->size();
    refresh();
    return v;
  }));
  object->attributes.set(Value("reset"), make_function("reset", [position, refresh](CallArgs&) {
    *position = 0;
    refresh();
    return Value(None{});
  }));
  object->attributes.set(Value("current"), (*items)[0]);
  return Value(object);
}

Value global_joiner(CallArgs& args) {
  const std::string separator = args.positional.empty() ? ", " : to_str(args.positional[0]);
  auto used = std::make_shared<bool>(false);
  return make_function("joiner", [separator, used](CallArgs&) {
    if (!*used) {
      *used = true;
      return Value("");
    }
    return Value(separator);
  });
}

}  // namespace

Value apply_filter(const std::string& name, const Value& subject, CallArgs& args) {
  const auto it = filters().find(name);
  if (it == filters().end()) throw TemplateError("no filter named '" + name + "'");
  return it->second(subject, args);
}

bool apply_test(const std::string& name, const Value& subject, CallArgs& args) {
  const auto it = tests().find(name);
  if (it == tests().end()) throw TemplateError("no test named '" + name + "'");
  return it->second(subject, args);
}

bool filter_exists(const std::string& name) { return filters().contains(name); }
bool test_exists(const std::string& name) { return tests().contains(name); }

std::unordered_map<std::string, Value> builtin_globals(const std::tm& now, ObjectArena& arena) {
  std::unordered_map<std::string, Value> globals;
  globals["range"] = make_function("range", global_range);
  globals["dict"] = make_function("dict", global_dict);
  ObjectArena* objects = &arena;
  globals["namespace"] = make_function("namespace", [objects](CallArgs& args) { return global_namespace(*objects, args); });
  globals["cycler"] = make_function("cycler", [objects](CallArgs& args) { return global_cycler(*objects, args); });
  globals["joiner"] = make_function("joiner", global_joiner);
  globals["raise_exception"] = make_function("raise_exception", [](CallArgs& args) -> Value {
    throw RaisedError(args.positional.empty() ? std::string() : to_str(args.positional[0]));
  });
  globals["strftime_now"] = make_function("strftime_now", [now](CallArgs& args) {
    const std::string format = args.positional.empty() ? std::string() : to_str(args.positional[0]);
    if (format.empty()) return Value("");
    std::string out(256 + format.size() * 16, '\0');
    const size_t n = std::strftime(out.data(), out.size(), format.c_str(), &now);
    out.resize(n);
    return Value(out);
  });
  return globals;
}

}  // namespace tpcli::text

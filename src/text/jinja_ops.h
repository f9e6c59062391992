// tpcli::text — Python's operators and object protocol as jinja2 in an ImmutableSandboxedEnvironment
// applies them: arithmetic and concatenation (with Python's TypeErrors), `in`, iteration, len,
// subscripts and slices, attribute lookup (a dict's methods before its keys, as Python's getattr
// finds them), the str/list/dict methods, and `%` / str.format formatting. Mutating methods
// (list.append, dict.update, ...) raise, as the immutable sandbox does.
//
// Sizes are bounded: no string or list an operation makes may exceed MAX_VALUE_BYTES / MAX_ITEMS.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "text/jinja_value.h"

namespace tpcli::text {

constexpr size_t MAX_VALUE_BYTES = size_t{16} << 20;  // a 1M-token prompt is ~5 MB of text
constexpr size_t MAX_ITEMS = size_t{1} << 22;

// A failure Python reports as jinja2.exceptions.UndefinedError: an undefined value used for more
// than printing or testing.
[[noreturn]] void throw_undefined(const Value& undefined);

Value binary_op(std::string_view op, const Value& a, const Value& b);  // + - * / // % ** ~
Value negate(const Value& v);
bool contains(const Value& container, const Value& item);  // `item in container`
bool compare(std::string_view op, const Value& a, const Value& b);  // == != < <= > >=

// Python's iter(): a list's items, a dict's keys, a string's characters; undefined is empty.
std::vector<Value> iterate(const Value& v);
// Python's len().
int64_t length(const Value& v);

Value get_attribute(const Value& object, const std::string& name);  // x.name
Value get_item(const Value& object, const Value& key);              // x[key]
Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step);
Value call_value(const Value& callee, CallArgs& args);

// "fmt % args" (printf-style) and "fmt".format(...).
std::string percent_format(std::string_view format, const Value& args);
std::string brace_format(std::string_view format, const CallArgs& args);

// Python's str.splitlines(keepends).
Value python_splitlines(const std::string& s, bool keepends);
std::string python_upper(std::string_view s);
std::string python_lower(std::string_view s);
std::string python_capitalize(std::string_view s);
// Python's str.strip(chars) (chars none: whitespace), on either or both ends.
std::string python_strip(std::string_view s, const Value& chars, bool left, bool right);

}  // namespace tpcli::text

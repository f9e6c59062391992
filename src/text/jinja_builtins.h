// tpcli::text — jinja2's built-in filters, tests and globals, with the changes transformers makes:
// `tojson` is json.dumps(ensure_ascii=False, insertion order, ", "/": " separators, keyword
// arguments honoured), and the globals raise_exception(msg) and strftime_now(fmt) (read from a
// clock the caller fixes).
#pragma once

#include <ctime>
#include <string>
#include <unordered_map>

#include "text/jinja_value.h"

namespace tpcli::text {

// What raise_exception() throws: its message is the template's own, passed on unchanged.
class RaisedError : public TemplateError {
 public:
  using TemplateError::TemplateError;
};

// Throws TemplateError("no filter named 'x'") for an unknown name.
Value apply_filter(const std::string& name, const Value& subject, CallArgs& args);
bool apply_test(const std::string& name, const Value& subject, CallArgs& args);
bool filter_exists(const std::string& name);
bool test_exists(const std::string& name);

// range, dict, namespace, cycler, joiner, raise_exception, and strftime_now reading `now`; the
// objects namespace() and cycler() make belong to `arena`, which must outlive the globals.
std::unordered_map<std::string, Value> builtin_globals(const std::tm& now, ObjectArena& arena);

}  // namespace tpcli::text

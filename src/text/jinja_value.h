// tpcli::text — the values a Jinja template computes with, with Python's semantics (jinja2 runs on
// Python, and chat templates print Python's str() of them): None/True/False, ints and floats printed
// as Python prints them, lists/tuples/dicts printed as their repr, insertion-ordered dicts,
// truthiness, ==, ordering, and the json.dumps that transformers installs as `tojson`.
//
// Undefined is a value too (jinja2's default Undefined): it prints as "", is falsy, iterates as
// empty, and carries the message an operation that needs a real value raises ("'x' is undefined").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tpcli::text {

// Every failure of parsing or rendering: one line. For raise_exception() the template's own message.
class TemplateError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Value;
struct ListData;
struct DictData;
struct ObjectData;
struct Callable;

struct Undefined {
  std::string hint;  // what an operation on it reports: "'tools' is undefined"
};
struct None {};

using ListPtr = std::shared_ptr<ListData>;
using DictPtr = std::shared_ptr<DictData>;
using ObjectPtr = std::shared_ptr<ObjectData>;
using CallablePtr = std::shared_ptr<Callable>;

enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Object, Callable };

class Value {
 public:
  Value() : data_(Undefined{}) {}
  Value(Undefined u) : data_(std::move(u)) {}
  Value(None) : data_(None{}) {}
  Value(bool b) : data_(b) {}
  Value(int i) : data_(static_cast<int64_t>(i)) {}
  Value(int64_t i) : data_(i) {}
  Value(double d) : data_(d) {}
  Value(std::string s) : data_(std::move(s)) {}
  Value(std::string_view s) : data_(std::string(s)) {}
  Value(const char* s) : data_(std::string(s)) {}
  Value(ListPtr l) : data_(std::move(l)) {}
  Value(DictPtr d) : data_(std::move(d)) {}
  Value(ObjectPtr o) : data_(std::move(o)) {}
  Value(CallablePtr c) : data_(std::move(c)) {}

  static Value undefined(std::string hint) { return Value(Undefined{std::move(hint)}); }
  // A string marked safe (markupsafe's Markup, from |safe and |escape): `+` with a plain string
  // HTML-escapes the plain one, as Python's Markup.__add__ / __radd__ do.
  static Value markup(std::string s) {
    Value v(std::move(s));
    v.safe_ = true;
    return v;
  }
  bool is_safe() const { return safe_ && is_string(); }
  static Value list(std::vector<Value> items = {});
  static Value tuple(std::vector<Value> items);
  // What select, map, items, unique, batch, slice and reverse return in jinja2: a one-shot iterator.
  // Always truthy, no len(), no subscripts, and iterating it empties it (as Python's generators).
  static Value generator(std::vector<Value> items);
  static Value dict();

  Kind kind() const { return static_cast<Kind>(data_.index()); }
  bool is_undefined() const { return kind() == Kind::Undefined; }
  bool is_none() const { return kind() == Kind::None; }
  bool is_bool() const { return kind() == Kind::Bool; }
  bool is_int() const { return kind() == Kind::Int; }  // bools are not ints here; see is_integral
  bool is_float() const { return kind() == Kind::Float; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return kind() == Kind::String; }
  bool is_list() const { return kind() == Kind::List && !is_generator(); }  // lists and tuples
  bool is_generator() const;
  bool is_tuple() const;
  bool is_dict() const { return kind() == Kind::Dict; }
  bool is_object() const { return kind() == Kind::Object; }
  bool is_callable() const { return kind() == Kind::Callable; }

  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const { return std::get<int64_t>(data_); }  // Int only
  int64_t to_int() const;      // Bool or Int
  double to_double() const;    // Bool, Int or Float
  const std::string& as_string() const { return std::get<std::string>(data_); }
  const ListPtr& as_list() const { return std::get<ListPtr>(data_); }
  const DictPtr& as_dict() const { return std::get<DictPtr>(data_); }
  const ObjectPtr& as_object() const { return std::get<ObjectPtr>(data_); }
  const CallablePtr& as_callable() const { return std::get<CallablePtr>(data_); }
  const std::string& undefined_hint() const { return std::get<Undefined>(data_).hint; }

  // Python's type name, for messages: 'str', 'list', 'dict', 'NoneType', ...
  std::string type_name() const;

 private:
  std::variant<Undefined, None, bool, int64_t, double, std::string, ListPtr, DictPtr, ObjectPtr, CallablePtr> data_;
  bool safe_ = false;
};

// markupsafe.escape of a plain string: & < > " ' as HTML entities.
std::string html_escape(std::string_view s);

struct ListData {
  std::vector<Value> items;
  bool is_tuple = false;
  bool is_generator = false;
};

// An insertion-ordered dict with Python key equality (1 == 1.0 == True); lookups are linear, the
// dicts of a chat are small.
struct DictData {
  std::vector<std::pair<Value, Value>> items;
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  const Value* find(const char* key) const { return find(std::string_view(key)); }
  const Value* find(const std::string& key) const { return find(std::string_view(key)); }
  void set(const Value& key, Value value);
};

// Objects with attributes only: namespace() (assignable), loop, cycler, joiner.
struct ObjectData {
  std::string type_name;  // "Namespace", "LoopContext", ...
  bool assignable = false;
  DictData attributes;
};

// The objects one render makes (namespaces, loops, cyclers). A template can store a namespace in
// itself (`set ns.x = ns`), a cycle shared_ptr never frees: the arena clears every object's
// attributes when the render ends, which breaks them all.
class ObjectArena {
 public:
  ObjectArena() = default;
  ObjectArena(const ObjectArena&) = delete;
  ObjectArena& operator=(const ObjectArena&) = delete;
  ~ObjectArena();
  ObjectPtr make(std::string type_name, bool assignable);

 private:
  std::vector<std::weak_ptr<ObjectData>> objects_;
  size_t compact_at_ = 1024;
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;
  const Value* keyword(std::string_view name) const;
  // Argument `i` by position, else by keyword `name` (when given); undefined when absent.
  const Value& at(size_t i, std::string_view name = {}) const;
};

struct Callable {
  std::string name;
  std::function<Value(CallArgs&)> call;
};

Value make_function(std::string name, std::function<Value(CallArgs&)> call);

// Python's bool(x).
bool truthy(const Value& v);
// Python's str(x) and repr(x); Undefined prints as "".
std::string to_str(const Value& v);
std::string to_repr(const Value& v);
std::string float_repr(double d);
std::string string_repr(std::string_view s);
// Python's ==.
bool equal(const Value& a, const Value& b);
// Python's a < b; throws TemplateError where Python raises TypeError ("'<' not supported ...").
bool less(const Value& a, const Value& b);

struct JsonOptions {
  std::optional<std::string> indent;  // none: one line; else the text of one level (json.dumps' indent)
  std::string item_separator = ", ", key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
// json.dumps(v, ...); throws TemplateError for values JSON cannot hold (undefined, functions).
std::string to_json(const Value& v, const JsonOptions& options);

Value from_json(const nlohmann::ordered_json& j);

}  // namespace tpcli::text

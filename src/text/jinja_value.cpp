#include "text/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "text/python_str.h"

namespace tpcli::text {

Value Value::list(std::vector<Value> items) {
  auto l = std::make_shared<ListData>();
  l->items = std::move(items);
  return Value(l);
}

Value Value::tuple(std::vector<Value> items) {
  auto l = std::make_shared<ListData>();
  l->items = std::move(items);
  l->is_tuple = true;
  return Value(l);
}

Value Value::generator(std::vector<Value> items) {
  auto l = std::make_shared<ListData>();
  l->items = std::move(items);
  l->is_generator = true;
  return Value(l);
}

bool Value::is_generator() const { return kind() == Kind::List && as_list()->is_generator; }

Value Value::dict() { return Value(std::make_shared<DictData>()); }

std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

bool Value::is_tuple() const { return is_list() && as_list()->is_tuple; }

int64_t Value::to_int() const { return is_bool() ? (as_bool() ? 1 : 0) : as_int(); }

double Value::to_double() const { return is_float() ? std::get<double>(data_) : static_cast<double>(to_int()); }

std::string Value::type_name() const {
  switch (kind()) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return is_generator() ? "generator" : is_tuple() ? "tuple" : "list";
    case Kind::Dict: return "dict";
    case Kind::Object: return as_object()->type_name;
    case Kind::Callable: return "function";
  }
  return "object";
}

const Value* DictData::find(const Value& key) const {
  for (const auto& [k, v] : items)
    if (equal(k, key)) return &v;
  return nullptr;
}

const Value* DictData::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k.is_string() && k.as_string() == key) return &v;
  return nullptr;
}

void DictData::set(const Value& key, Value value) {
  for (auto& [k, v] : items)
    if (equal(k, key)) {
      v = std::move(value);
      return;
    }
  items.emplace_back(key, std::move(value));
}

const Value* CallArgs::keyword(std::string_view name) const {
  for (const auto& [k, v] : keywords)
    if (k == name) return &v;
  return nullptr;
}

const Value& CallArgs::at(size_t i, std::string_view name) const {
  static const Value missing;
  if (i < positional.size()) return positional[i];
  if (!name.empty())
    if (const Value* v = keyword(name)) return *v;
  return missing;
}

ObjectArena::~ObjectArena() {
  for (const auto& weak : objects_)
    if (const auto object = weak.lock()) object->attributes.items.clear();
}

ObjectPtr ObjectArena::make(std::string type_name, bool assignable) {
  if (objects_.size() >= compact_at_) {  // forget the objects already freed
    std::erase_if(objects_, [](const auto& weak) { return weak.expired(); });
    compact_at_ = std::max<size_t>(1024, 2 * objects_.size());
  }
  auto object = std::make_shared<ObjectData>();
  object->type_name = std::move(type_name);
  object->assignable = assignable;
  objects_.push_back(object);
  return object;
}

Value make_function(std::string name, std::function<Value(CallArgs&)> call) {
  return Value(std::make_shared<Callable>(Callable{std::move(name), std::move(call)}));
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return v.as_bool();
    case Kind::Int: return v.as_int() != 0;
    case Kind::Float: return v.to_double() != 0.0;
    case Kind::String: return !v.as_string().empty();
    case Kind::List: return v.is_generator() || !v.as_list()->items.empty();
    case Kind::Dict: return !v.as_dict()->items.empty();
    default: return true;
  }
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // The shortest digits that round-trip, laid out as Python's repr does: positional for
  // 1e-4 <= |d| < 1e16, else d.ddde+XX.
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  const std::string sci(buf, r.ptr);
  const size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  const int exponent = std::stoi(sci.substr(e + 1));
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits.push_back(c);
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0." + std::string(-exponent - 1, '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exponent + 1) {
      out += digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp[16];
  std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + exp;
}

std::string string_repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : utf8_decode(s)) {
    if (c == '\\') out += "\\\\";
    else if (c == static_cast<char32_t>(quote)) out += std::string("\\") + quote;
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (is_python_printable(c)) utf8_append(out, c);
    else {
      char buf[16];
      if (c < 0x100) std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      else if (c < 0x10000) std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      else std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(c));
      out += buf;
    }
  }
  out.push_back(quote);
  return out;
}

namespace {

std::string sequence_repr(const ListData& list) {
  std::string out = list.is_tuple ? "(" : "[";
  for (size_t i = 0; i < list.items.size(); ++i) {
    if (i) out += ", ";
    out += to_repr(list.items[i]);
  }
  if (list.is_tuple && list.items.size() == 1) out += ",";
  return out + (list.is_tuple ? ")" : "]");
}

std::string dict_repr(const DictData& dict) {
  std::string out = "{";
  for (size_t i = 0; i < dict.items.size(); ++i) {
    if (i) out += ", ";
    out += to_repr(dict.items[i].first) + ": " + to_repr(dict.items[i].second);
  }
  return out + "}";
}

std::string object_repr(const ObjectData& object) {
  if (object.type_name != "Namespace") return "<" + object.type_name + " object>";
  std::string out = "<Namespace {";
  for (size_t i = 0; i < object.attributes.items.size(); ++i) {
    if (i) out += ", ";
    out += to_repr(object.attributes.items[i].first) + ": " + to_repr(object.attributes.items[i].second);
  }
  return out + "}>";
}

}  // namespace

std::string to_str(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined: return "";
    case Kind::String: return v.as_string();
    default: return to_repr(v);
  }
}

std::string to_repr(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined: return "Undefined";  // inside a list; printed alone it is "" (to_str)
    case Kind::None: return "None";
    case Kind::Bool: return v.as_bool() ? "True" : "False";
    case Kind::Int: return std::to_string(v.as_int());
    case Kind::Float: return float_repr(v.to_double());
    case Kind::String: return string_repr(v.as_string());
    case Kind::List: return v.is_generator() ? "<generator object>" : sequence_repr(*v.as_list());
    case Kind::Dict: return dict_repr(*v.as_dict());
    case Kind::Object: return object_repr(*v.as_object());
    case Kind::Callable: return "<function " + v.as_callable()->name + ">";
  }
  return "";
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.to_double() == b.to_double();
    return a.to_int() == b.to_int();
  }
  if (a.kind() != b.kind()) return false;
  if (a.is_generator() || b.is_generator()) return a.as_list() == b.as_list();
  switch (a.kind()) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::String: return a.as_string() == b.as_string();
    case Kind::List: {
      const auto &x = *a.as_list(), &y = *b.as_list();
      if (x.is_tuple != y.is_tuple || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i)
        if (!equal(x.items[i], y.items[i])) return false;
      return true;
    }
    case Kind::Dict: {
      const auto &x = *a.as_dict(), &y = *b.as_dict();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* other = y.find(k);
        if (!other || !equal(v, *other)) return false;
      }
      return true;
    }
    case Kind::Object: return a.as_object() == b.as_object();
    case Kind::Callable: return a.as_callable() == b.as_callable();
    default: return false;
  }
}

bool less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.to_double() < b.to_double();
    return a.to_int() < b.to_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();  // UTF-8 keeps code point order
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto &x = a.as_list()->items, &y = b.as_list()->items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equal(x[i], y[i])) continue;
      return less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  throw TemplateError("'<' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() + "'");
}

namespace {

void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out.push_back('"');
  for (char32_t c : utf8_decode(s)) {
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    char buf[16];
    if (c < 0x20 || (ensure_ascii && c >= 0x7F && c < 0x10000)) {
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else if (ensure_ascii && c >= 0x10000) {
      const char32_t v = c - 0x10000;
      std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)),
                    static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
      out += buf;
    } else {
      utf8_append(out, c);
    }
  }
  out.push_back('"');
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return float_repr(d);
}

// A dict key as json.dumps converts it: strings stay, numbers/bools/None become their JSON text.
std::string json_key(const Value& key) {
  switch (key.kind()) {
    case Kind::String: return key.as_string();
    case Kind::Bool: return key.as_bool() ? "true" : "false";
    case Kind::None: return "null";
    case Kind::Int: return std::to_string(key.as_int());
    case Kind::Float: return json_float(key.to_double());
    default: throw TemplateError("keys must be str, int, float, bool or None, not " + key.type_name());
  }
}

class JsonWriter {
 public:
  explicit JsonWriter(const JsonOptions& options) : options_(options) {}
  std::string out;

  void write(const Value& v, int depth) {
    if (depth > 512) throw TemplateError("tojson: value nested too deeply");
    switch (v.kind()) {
      case Kind::None: out += "null"; return;
      case Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
      case Kind::Int: out += std::to_string(v.as_int()); return;
      case Kind::Float: out += json_float(v.to_double()); return;
      case Kind::String: json_string(out, v.as_string(), options_.ensure_ascii); return;
      case Kind::List:
        if (v.is_generator()) break;
        write_list(v.as_list()->items, depth);
        return;
      case Kind::Dict: write_dict(*v.as_dict(), depth); return;
      default: break;
    }
    throw TemplateError("Object of type " + v.type_name() + " is not JSON serializable");
  }

 private:
  const JsonOptions& options_;

  void newline(int depth) {
    if (!options_.indent) return;
    out.push_back('\n');
    for (int i = 0; i < depth; ++i) out += *options_.indent;
  }

  void write_list(const std::vector<Value>& items, int depth) {
    if (items.empty()) {
      out += "[]";
      return;
    }
    out.push_back('[');
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += options_.item_separator;
      newline(depth + 1);
      write(items[i], depth + 1);
    }
    newline(depth);
    out.push_back(']');
  }

  void write_dict(const DictData& dict, int depth) {
    if (dict.items.empty()) {
      out += "{}";
      return;
    }
    std::vector<std::pair<std::string, const Value*>> entries;
    for (const auto& [k, v] : dict.items) entries.emplace_back(json_key(k), &v);
    if (options_.sort_keys)
      std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    out.push_back('{');
    for (size_t i = 0; i < entries.size(); ++i) {
      if (i) out += options_.item_separator;
      newline(depth + 1);
      json_string(out, entries[i].first, options_.ensure_ascii);
      out += options_.key_separator;
      write(*entries[i].second, depth + 1);
    }
    newline(depth);
    out.push_back('}');
  }
};

}  // namespace

std::string to_json(const Value& v, const JsonOptions& options) {
  JsonWriter writer(options);
  writer.write(v, 0);
  return std::move(writer.out);
}

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value(None{});
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      return u <= static_cast<uint64_t>(INT64_MAX) ? Value(static_cast<int64_t>(u)) : Value(static_cast<double>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto d = std::make_shared<DictData>();
      for (const auto& [k, e] : j.items()) d->items.emplace_back(Value(k), from_json(e));
      return Value(d);
    }
    default: return Value(None{});
  }
}

}  // namespace tpcli::text

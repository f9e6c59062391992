#include "grammar/json_schema.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "grammar/gbnf_parser.h"
#include "grammar/grammar_error.h"

namespace tpcli::grammar {

namespace {

// ordered_json: properties keep the order the schema gives them.
using json = nlohmann::ordered_json;

constexpr int MAX_INTEGER_DIGITS = 16;
constexpr int64_t MAX_BOUND = 999999999999999;  // 15 digits: bounds beyond are refused

const std::set<std::string>& annotation_keywords() {
  static const std::set<std::string> k = {"title",      "description", "default",  "examples", "$schema",   "$id",
                                          "$comment",   "deprecated",  "readOnly", "writeOnly", "$defs",    "definitions"};
  return k;
}

const std::set<std::string>& supported_keywords() {
  static const std::set<std::string> k = {
      "type",    "properties", "required", "additionalProperties", "items",     "prefixItems",      "minItems",
      "maxItems", "enum",      "const",    "anyOf",                "oneOf",     "allOf",            "$ref",
      "minimum", "maximum",    "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "pattern", "format"};
  return k;
}

// A GBNF "literal" holding exactly `bytes`.
std::string literal(const std::string& bytes) {
  std::string out = "\"";
  for (const char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (b < 0x20 || b == 0x7F) {
      static const char* hex = "0123456789ABCDEF";
      out += "\\x";
      out += hex[b >> 4];
      out += hex[b & 15];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string join_path(const std::string& path, const std::string& part) { return path.empty() ? part : path + "." + part; }

// ---- integer ranges as digit strings (no leading zeros) ----
std::string digits_range_same_length(const std::string& a, const std::string& b) {
  if (a.empty()) return "";
  if (a == b) return literal(a);
  const size_t n = a.size() - 1;
  if (a[0] == b[0]) return literal(a.substr(0, 1)) + " " + digits_range_same_length(a.substr(1), b.substr(1));
  auto any_digits = [](size_t count) { return count == 0 ? std::string() : " [0-9]{" + std::to_string(count) + "}"; };
  const std::string rest_a = a.substr(1), rest_b = b.substr(1);
  if (rest_a == std::string(n, '0') && rest_b == std::string(n, '9'))
    return "[" + std::string(1, a[0]) + "-" + std::string(1, b[0]) + "]" + any_digits(n);
  std::vector<std::string> alts;
  alts.push_back(literal(a.substr(0, 1)) + (n ? " (" + digits_range_same_length(rest_a, std::string(n, '9')) + ")" : ""));
  if (a[0] + 1 <= b[0] - 1)
    alts.push_back("[" + std::string(1, static_cast<char>(a[0] + 1)) + "-" + std::string(1, static_cast<char>(b[0] - 1)) + "]" + any_digits(n));
  alts.push_back(literal(b.substr(0, 1)) + (n ? " (" + digits_range_same_length(std::string(n, '0'), rest_b) + ")" : ""));
  std::string out;
  for (const auto& alt : alts) out += out.empty() ? alt : " | " + alt;
  return out;
}

// Decimal strings of the integers in [lo, hi] (0 <= lo; hi < 0: unbounded, up to MAX_INTEGER_DIGITS digits).
std::string digits_range(int64_t lo, int64_t hi) {
  std::vector<std::string> alts;
  int64_t length_start = 1;  // smallest number with len digits (0 for one digit)
  for (int len = 1; len <= MAX_INTEGER_DIGITS; ++len, length_start *= 10) {
    const int64_t first = len == 1 ? 0 : length_start;
    const int64_t last = length_start * 10 - 1;
    const int64_t a = std::max(lo, first);
    if (hi >= 0 && a > hi) break;
    if (a > last) continue;
    if (hi < 0 && a == first && len > 1) {  // every longer number too
      alts.push_back("[1-9] [0-9]{" + std::to_string(len - 1) + "," + std::to_string(MAX_INTEGER_DIGITS - 1) + "}");
      break;
    }
    const int64_t b = hi >= 0 ? std::min(hi, last) : last;
    std::string range = "(";  // appended, not "(" + ...: gcc 12 -Wrestrict misfires on the latter
    range += digits_range_same_length(std::to_string(a), std::to_string(b));
    alts.push_back(range + ")");
  }
  std::string out;
  for (const auto& alt : alts) out += out.empty() ? alt : " | " + alt;
  return out;
}

struct Bound {
  bool present = false;
  int64_t value = 0;
  bool strict = false;
};

class SchemaConverter {
 public:
  SchemaConverter(const json& root, std::string prefix) : root_(root), prefix_(std::move(prefix)) {
    reserved_.insert(prefix_ + "root");
  }

  std::string convert() {
    const std::string entry = visit(root_, "", 0);
    define_named(prefix_ + "root", entry);
    std::string out;
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    return out;
  }

  std::string any_object() {
    const std::string object = primitive("object");
    define_named(prefix_ + "root", object);
    std::string out;
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    const std::string where = path.empty() ? "(root)" : path;
    throw GrammarError("schema at " + where + ": " + what, where);
  }

  void define_named(const std::string& name, const std::string& body) {
    if (!defined_.insert(name).second) return;
    rules_.emplace_back(name, body);
  }

  // A new rule named after `hint`, unique.
  std::string define(const std::string& hint, const std::string& body) {
    std::string base = prefix_;
    for (const char c : hint) base += std::isalnum(static_cast<unsigned char>(c)) ? c : '-';
    std::string name = base;
    for (int i = 1; defined_.contains(name) || reserved_.contains(name); ++i) name = base + "-" + std::to_string(i);
    define_named(name, body);
    return name;
  }

  std::string primitive(const std::string& name) {
    static const std::map<std::string, std::pair<std::string, std::vector<std::string>>> table = {
        {"space", {"| \" \" | \"\\n\" [ \\t]{0,20}", {}}},
        {"boolean", {"(\"true\" | \"false\") @space", {"space"}}},
        {"null", {"\"null\" @space", {"space"}}},
        {"hex", {"[0-9a-fA-F]", {}}},
        {"char",
         {"[^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" ([0-9a-cA-Ce-fE-F] @hex{3} | [dD] [0-7] @hex{2}))",
          {"hex"}}},
        {"string", {"\"\\\"\" @char* \"\\\"\" @space", {"char", "space"}}},
        {"integral-part", {"[0] | [1-9] [0-9]{0,15}", {}}},
        {"number",
         {"\"-\"? @integral-part (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})? @space", {"integral-part", "space"}}},
        {"integer", {"\"-\"? @integral-part @space", {"integral-part", "space"}}},
        {"value", {"@object | @array | @string | @number | @boolean | @null",
                   {"object", "array", "string", "number", "boolean", "null"}}},
        {"object",
         {"\"{\" @space (@string \":\" @space @value (\",\" @space @string \":\" @space @value)*)? \"}\" @space",
          {"space", "string", "value"}}},
        {"array", {"\"[\" @space (@value (\",\" @space @value)*)? \"]\" @space", {"space", "value"}}},
        {"date", {"[0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01])", {}}},
        {"time",
         {"([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? (\"Z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])",
          {}}},
        {"date-time", {"@date \"T\" @time", {"date", "time"}}},
        {"uuid",
         {"@hex{8} \"-\" @hex{4} \"-\" @hex{4} \"-\" @hex{4} \"-\" @hex{12}", {"hex"}}},
        {"email",
         {"[A-Za-z0-9._%+-]+ \"@\" ([A-Za-z0-9-]+ \".\")+ [A-Za-z]{2,24}", {}}},
    };
    const std::string full = prefix_ + name;
    if (defined_.contains(full) || reserved_.contains(full)) return full;  // reserved: being expanded (value <-> object)
    const auto& [body, deps] = table.at(name);
    reserved_.insert(full);
    std::string expanded;
    for (size_t i = 0; i < body.size(); ++i) {
      if (body[i] != '@' || i + 1 == body.size() || !std::islower(static_cast<unsigned char>(body[i + 1]))) {
        expanded += body[i];
        continue;
      }
      size_t j = i + 1;
      while (j < body.size() && (std::isalnum(static_cast<unsigned char>(body[j])) || body[j] == '-')) ++j;
      expanded += primitive(body.substr(i + 1, j - i - 1));
      i = j - 1;
    }
    define_named(full, expanded);
    return full;
  }

  void check_keywords(const json& schema, const std::string& path) const {
    for (const auto& [key, value] : schema.items()) {
      if (annotation_keywords().contains(key) || supported_keywords().contains(key)) continue;
      fail(path, "unsupported keyword '" + key + "'");
    }
  }

  std::string visit(const json& schema, const std::string& path, int depth) {
    if (depth > MAX_SCHEMA_DEPTH) fail(path, "schemas nested deeper than " + std::to_string(MAX_SCHEMA_DEPTH));
    if (schema.is_boolean()) {
      if (!schema.get<bool>()) fail(path, "the schema false allows no value");
      return primitive("value");
    }
    if (!schema.is_object()) fail(path, "a schema must be an object or a boolean");
    check_keywords(schema, path);
    const std::string hint = path.empty() ? "root" : path;
    if (schema.contains("$ref")) return visit_ref(schema, path, depth);
    if (schema.contains("anyOf") || schema.contains("oneOf")) {
      const char* key = schema.contains("anyOf") ? "anyOf" : "oneOf";
      const json& branches = schema[key];
      if (!branches.is_array() || branches.empty()) fail(path, std::string("'") + key + "' must be a non-empty array");
      std::string body;
      for (size_t i = 0; i < branches.size(); ++i)
        body += (i ? " | " : "") + visit(merged_with_parent(branches[i], schema, key, path), join_path(path, key + std::string(".") + std::to_string(i)), depth + 1);
      return define(hint, body);
    }
    if (schema.contains("allOf")) {
      const json& parts = schema["allOf"];
      if (!parts.is_array() || parts.size() != 1) fail(path, "unsupported keyword 'allOf' with other than one schema");
      return visit(merged_with_parent(parts[0], schema, "allOf", path), join_path(path, "allOf.0"), depth + 1);
    }
    if (schema.contains("const")) return define(hint, literal(schema["const"].dump()) + " " + primitive("space"));
    if (schema.contains("enum")) {
      const json& values = schema["enum"];
      if (!values.is_array() || values.empty()) fail(path, "'enum' must be a non-empty array");
      std::string body = "(";
      for (size_t i = 0; i < values.size(); ++i) body += (i ? " | " : "") + literal(values[i].dump());
      return define(hint, body + ") " + primitive("space"));
    }
    std::vector<std::string> types;
    if (schema.contains("type")) {
      const json& type = schema["type"];
      if (type.is_string()) {
        types.push_back(type.get<std::string>());
      } else if (type.is_array() && !type.empty()) {
        for (const auto& t : type) {
          if (!t.is_string()) fail(path, "'type' entries must be strings");
          types.push_back(t.get<std::string>());
        }
      } else {
        fail(path, "'type' must be a string or a non-empty list of strings");
      }
    } else {
      types.push_back(implied_type(schema));
    }
    std::string body;
    for (const std::string& type : types) body += (body.empty() ? "" : " | ") + visit_type(schema, type, path, depth);
    return define(hint, body);
  }

  // A branch of anyOf/allOf inherits nothing but is checked on its own; the parent may hold only annotations.
  const json& merged_with_parent(const json& branch, const json& parent, const std::string& key, const std::string& path) const {
    for (const auto& [k, v] : parent.items())
      if (k != key && !annotation_keywords().contains(k)) fail(path, "'" + key + "' combined with '" + k + "' is not supported");
    return branch;
  }

  static std::string implied_type(const json& schema) {
    if (schema.contains("properties") || schema.contains("additionalProperties") || schema.contains("required")) return "object";
    if (schema.contains("items") || schema.contains("prefixItems") || schema.contains("minItems") || schema.contains("maxItems")) return "array";
    if (schema.contains("minLength") || schema.contains("maxLength") || schema.contains("pattern") || schema.contains("format")) return "string";
    if (schema.contains("minimum") || schema.contains("maximum") || schema.contains("exclusiveMinimum") || schema.contains("exclusiveMaximum")) return "number";
    return "any";
  }

  std::string visit_ref(const json& schema, const std::string& path, int depth) {
    for (const auto& [k, v] : schema.items())
      if (k != "$ref" && !annotation_keywords().contains(k)) fail(path, "'$ref' combined with '" + k + "' is not supported");
    if (!schema["$ref"].is_string()) fail(path, "'$ref' must be a string");
    const std::string ref = schema["$ref"].get<std::string>();
    if (const auto it = refs_.find(ref); it != refs_.end()) return it->second;
    if (ref.empty() || ref[0] != '#') fail(path, "unsupported keyword '$ref': '" + ref + "' (only local #/... references)");
    const json* target = nullptr;
    try {
      target = &root_.at(json::json_pointer(ref.substr(1)));
    } catch (const json::exception&) {
      fail(path, "'$ref': '" + ref + "' names nothing in the schema");
    }
    std::string hint = ref.size() > 2 ? ref.substr(ref.rfind('/') + 1) : "root";
    std::string name = prefix_ + "ref-";
    for (const char c : hint) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '-';
    for (int i = 1; defined_.contains(name) || reserved_.contains(name); ++i) name = prefix_ + "ref-" + hint + "-" + std::to_string(i);
    reserved_.insert(name);
    refs_[ref] = name;
    const std::string body = visit(*target, ref.size() > 2 ? ref.substr(2) : "", depth + 1);
    define_named(name, body);
    return name;
  }

  std::string visit_type(const json& schema, const std::string& type, const std::string& path, int depth) {
    if (type == "any") return primitive("value");
    if (type == "null") return primitive("null");
    if (type == "boolean") return primitive("boolean");
    if (type == "string") return visit_string(schema, path);
    if (type == "integer" || type == "number") return visit_number(schema, type == "integer", path);
    if (type == "array") return visit_array(schema, path, depth);
    if (type == "object") return visit_object(schema, path, depth);
    fail(path, "unsupported keyword 'type': '" + type + "'");
  }

  int count_keyword(const json& schema, const char* key, const std::string& path, int fallback) const {
    if (!schema.contains(key)) return fallback;
    const json& v = schema[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > MAX_REPETITION)
      fail(path, std::string("'") + key + "' must be an integer in 0.." + std::to_string(MAX_REPETITION));
    return static_cast<int>(v.get<int64_t>());
  }

  std::string visit_string(const json& schema, const std::string& path) {
    const std::string quote = literal("\"");
    if (schema.contains("format")) {
      if (!schema["format"].is_string()) fail(path, "'format' must be a string");
      const std::string format = schema["format"].get<std::string>();
      static const std::set<std::string> formats = {"date", "time", "date-time", "uuid", "email"};
      if (!formats.contains(format)) fail(path, "unsupported keyword 'format': '" + format + "'");
      if (schema.contains("pattern") || schema.contains("minLength") || schema.contains("maxLength"))
        fail(path, "'format' combined with 'pattern', 'minLength' or 'maxLength' is not supported");
      return quote + " " + primitive(format) + " " + quote + " " + primitive("space");
    }
    if (schema.contains("pattern")) {
      if (!schema["pattern"].is_string()) fail(path, "'pattern' must be a string");
      if (schema.contains("minLength") || schema.contains("maxLength"))
        fail(path, "'pattern' combined with 'minLength' or 'maxLength' is not supported");
      return quote + " (" + pattern_to_gbnf(schema["pattern"].get<std::string>(), path) + ") " + quote + " " + primitive("space");
    }
    const int min = count_keyword(schema, "minLength", path, 0);
    const int max = count_keyword(schema, "maxLength", path, -1);
    if (max >= 0 && max < min) fail(path, "'maxLength' is below 'minLength'");
    if (min == 0 && max < 0) return primitive("string");
    const std::string repeat = "{" + std::to_string(min) + "," + (max >= 0 ? std::to_string(max) : "") + "}";
    return quote + " " + primitive("char") + repeat + " " + quote + " " + primitive("space");
  }

  Bound bound_of(const json& schema, const char* inclusive, const char* exclusive, bool lower, bool integer,
                 const std::string& path) const {
    Bound b;
    auto take = [&](const json& v, bool strict, const char* key) {
      if (!v.is_number()) fail(path, std::string("'") + key + "' must be a number");
      const double x = v.get<double>();
      if (!(std::fabs(x) <= static_cast<double>(MAX_BOUND))) fail(path, std::string("'") + key + "' beyond 15 digits is not supported");
      double whole = lower ? std::ceil(x) : std::floor(x);
      bool s = strict;
      if (whole != x) {
        if (!integer) fail(path, std::string("'") + key + "' with a fraction is supported for integers only");
        s = false;  // the next whole number inward is inside either way
      }
      const auto value = static_cast<int64_t>(whole);
      // The tighter of two bounds wins.
      if (!b.present || (lower ? (value > b.value || (value == b.value && s)) : (value < b.value || (value == b.value && s))))
        b = {true, value, s};
    };
    if (schema.contains(inclusive)) {
      const bool draft4_strict = schema.contains(exclusive) && schema[exclusive].is_boolean() && schema[exclusive].get<bool>();
      take(schema[inclusive], draft4_strict, inclusive);
    }
    if (schema.contains(exclusive) && !schema[exclusive].is_boolean()) take(schema[exclusive], true, exclusive);
    if (integer && b.present && b.strict) b = {true, lower ? b.value + 1 : b.value - 1, false};
    return b;
  }

  // Magnitudes m >= 0 (no sign) in [lo, hi] as digit strings; `fraction`: a number with an optional
  // fraction (m = I.F), else an integer. "" when none.
  std::string magnitude(Bound lo, Bound hi, bool fraction) const {
    if (!lo.present || lo.value < 0) lo = {true, 0, false};
    if (hi.present && (hi.value < lo.value || (hi.value == lo.value && (lo.strict || hi.strict)))) return "";
    const std::string any_fraction = " (\".\" [0-9]{1,16})?";
    const std::string zero_fraction = " (\".\" \"0\"{1,16})?";
    const std::string nonzero_fraction = " \".\" [0-9]{0,15} [1-9]";
    std::vector<std::string> alts;
    if (!fraction) {
      const int64_t a = lo.value + (lo.strict ? 1 : 0);
      const int64_t b = hi.present ? hi.value - (hi.strict ? 1 : 0) : -1;
      if (hi.present && b < a) return "";
      return digits_range(a, b);
    }
    if (hi.present && hi.value == lo.value) return literal(std::to_string(lo.value)) + zero_fraction;
    alts.push_back(literal(std::to_string(lo.value)) + (lo.strict ? nonzero_fraction : any_fraction));
    if (!hi.present)
      alts.push_back("(" + digits_range(lo.value + 1, -1) + ")" + any_fraction);
    else if (lo.value + 1 <= hi.value - 1)
      alts.push_back("(" + digits_range(lo.value + 1, hi.value - 1) + ")" + any_fraction);
    if (hi.present && !hi.strict) alts.push_back(literal(std::to_string(hi.value)) + zero_fraction);
    std::string out;
    for (const auto& alt : alts) out += out.empty() ? alt : " | " + alt;
    return out;
  }

  std::string visit_number(const json& schema, bool integer, const std::string& path) {
    const Bound lo = bound_of(schema, "minimum", "exclusiveMinimum", true, integer, path);
    const Bound hi = bound_of(schema, "maximum", "exclusiveMaximum", false, integer, path);
    if (!lo.present && !hi.present) return primitive(integer ? "integer" : "number");
    std::vector<std::string> alts;
    // v >= 0: its magnitude within [max(lo, 0), hi].
    if (!hi.present || hi.value > 0 || (hi.value == 0 && !hi.strict)) {
      const std::string m = magnitude(lo, hi, !integer);
      if (!m.empty()) alts.push_back("(" + m + ")");
    }
    // v < 0: "-" and a magnitude within (0 or -hi, -lo]; "-0" only where 0 is allowed.
    if (!lo.present || lo.value < 0) {
      Bound m_lo = hi.present && hi.value <= 0 ? Bound{true, -hi.value, hi.strict} : Bound{true, 0, true};
      if (!integer && m_lo.value == 0 && !m_lo.strict) m_lo.strict = true;  // v = 0 is the branch above's
      Bound m_hi = lo.present ? Bound{true, -lo.value, lo.strict} : Bound{};
      const std::string m = magnitude(m_lo, m_hi, !integer);
      if (!m.empty()) alts.push_back("\"-\" (" + m + ")");
    }
    if (alts.empty()) fail(path, "no number satisfies the bounds");
    std::string body = "(";
    for (size_t i = 0; i < alts.size(); ++i) body += (i ? " | " : "") + alts[i];
    return body + ") " + primitive("space");
  }

  std::string visit_array(const json& schema, const std::string& path, int depth) {
    std::vector<std::string> prefix;
    if (schema.contains("prefixItems")) {
      const json& items = schema["prefixItems"];
      if (!items.is_array()) fail(path, "'prefixItems' must be an array");
      for (size_t i = 0; i < items.size(); ++i)
        prefix.push_back(visit(items[i], join_path(path, "prefixItems." + std::to_string(i)), depth + 1));
    }
    std::string rest;  // "" when no further items
    if (schema.contains("items")) {
      const json& items = schema["items"];
      if (!(items.is_boolean() && !items.get<bool>())) rest = visit(items, join_path(path, "items"), depth + 1);
    } else if (prefix.empty()) {
      rest = primitive("value");
    }
    const int min = count_keyword(schema, "minItems", path, 0);
    int max = count_keyword(schema, "maxItems", path, -1);
    if (rest.empty()) max = max < 0 ? static_cast<int>(prefix.size()) : std::min(max, static_cast<int>(prefix.size()));
    if (max >= 0 && max < min) fail(path, "'minItems' exceeds what 'maxItems', 'prefixItems' and 'items' allow");
    const std::string comma = literal(",") + " " + primitive("space");
    // Element j (0-based) in context "something before" needs the comma.
    auto element = [&](int j) { return j < static_cast<int>(prefix.size()) ? prefix[static_cast<size_t>(j)] : rest; };
    // Elements from j on, each with its comma (all of them optional from `min` on).
    std::string tail;
    const int k = static_cast<int>(prefix.size());
    if (!rest.empty()) {
      const int from = std::max(k, 1);
      const int required_rest = std::max(0, min - from);
      const std::string upper = max < 0 ? "" : std::to_string(std::max(0, max - from));
      if (max < 0 || max - from > 0) tail = "(" + comma + " " + rest + "){" + std::to_string(required_rest) + "," + upper + "}";
    }
    for (int j = std::min(k, max < 0 ? k : max) - 1; j >= 1; --j) {
      const std::string item = comma + " " + element(j) + (tail.empty() ? "" : " " + tail);
      tail = j < min ? item : "(" + item + ")?";
    }
    std::string list;
    if (max != 0) {
      list = element(0) + (tail.empty() ? "" : " " + tail);
      if (min == 0) list = "(" + list + ")?";
    }
    return literal("[") + " " + primitive("space") + " " + list + " " + literal("]") + " " + primitive("space");
  }

  std::string visit_object(const json& schema, const std::string& path, int depth) {
    struct Property {
      std::string pair;  // "\"name\"" space ":" space value
      bool required = false;
    };
    std::vector<Property> props;
    std::set<std::string> required;
    if (schema.contains("required")) {
      if (!schema["required"].is_array()) fail(path, "'required' must be an array of names");
      for (const auto& r : schema["required"]) {
        if (!r.is_string()) fail(path, "'required' must be an array of names");
        required.insert(r.get<std::string>());
      }
    }
    const std::string colon = literal(":") + " " + primitive("space");
    if (schema.contains("properties")) {
      const json& properties = schema["properties"];
      if (!properties.is_object()) fail(path, "'properties' must be an object");
      for (const auto& [name, sub] : properties.items()) {
        const std::string value = visit(sub, join_path(path, "properties." + name), depth + 1);
        props.push_back({literal(json(name).dump()) + " " + primitive("space") + " " + colon + " " + value, required.contains(name)});
        required.erase(name);
      }
    }
    if (!required.empty()) fail(path, "required property '" + *required.begin() + "' is not in 'properties'");
    std::string extra;  // the value of an additional property, "" when none are allowed
    if (!schema.contains("properties") && !schema.contains("additionalProperties")) extra = primitive("value");
    if (schema.contains("additionalProperties")) {
      const json& additional = schema["additionalProperties"];
      if (!(additional.is_boolean() && !additional.get<bool>()))
        extra = visit(additional, join_path(path, "additionalProperties"), depth + 1);
    }
    const std::string comma = literal(",") + " " + primitive("space");
    const std::string extra_pair = extra.empty() ? "" : primitive("string") + " " + colon + " " + extra;
    const std::string hint = path.empty() ? "root" : path;
    // after_i: properties i.. when one is already written (each with its comma); first_i: when none is.
    std::string after = extra.empty() ? "" : "(" + comma + " " + extra_pair + ")*";
    std::string first = extra.empty() ? "" : "(" + extra_pair + " (" + comma + " " + extra_pair + ")*)?";
    for (int i = static_cast<int>(props.size()) - 1; i >= 0; --i) {
      const Property& p = props[static_cast<size_t>(i)];
      const std::string after_name = define(hint + "-after-" + std::to_string(i + 1), after);
      const std::string with_this = p.pair + " " + after_name;
      first = p.required ? with_this : with_this + " | " + define(hint + "-first-" + std::to_string(i + 1), first);
      after = p.required ? comma + " " + p.pair + " " + after_name : "(" + comma + " " + p.pair + ")? " + after_name;
    }
    return literal("{") + " " + primitive("space") + " (" + first + ") " + literal("}") + " " + primitive("space");
  }

  // ---- pattern (ECMAScript subset) -> GBNF over the string's JSON text ----
  std::string pattern_to_gbnf(const std::string& pattern, const std::string& path) {
    PatternParser parser{pattern, 0, path, *this};
    bool anchored_start = false, anchored_end = false;
    std::string body = parser.parse_top(anchored_start, anchored_end);
    const std::string any = primitive("char") + "*";
    return (anchored_start ? "" : any + " ") + "(" + body + ")" + (anchored_end ? "" : " " + any);
  }

  struct PatternParser {
    const std::string& p;
    size_t pos;
    const std::string& path;
    SchemaConverter& owner;

    [[noreturn]] void fail(const std::string& what) const {
      owner.fail(path, "'pattern' " + what + " at offset " + std::to_string(pos) + " of '" + p + "'");
    }
    bool at_end() const { return pos >= p.size(); }
    char peek() const { return at_end() ? '\0' : p[pos]; }

    std::string parse_top(bool& anchored_start, bool& anchored_end) {
      if (peek() == '^') {
        anchored_start = true;
        ++pos;
      }
      std::string body = parse_alternatives(0, &anchored_end);
      if (!at_end()) fail("has an unmatched ')'");
      return body;
    }

    std::string parse_alternatives(int depth, bool* anchored_end) {
      if (depth > MAX_NESTING) fail("nests groups too deeply");
      std::string out = parse_sequence(depth, anchored_end);
      while (peek() == '|') {
        ++pos;
        out += " | " + parse_sequence(depth, anchored_end);
      }
      return out;
    }

    std::string parse_sequence(int depth, bool* anchored_end) {
      std::string out;
      while (!at_end() && peek() != '|' && peek() != ')') {
        if (peek() == '$') {
          ++pos;
          if (!anchored_end || !at_end()) fail("uses '$' other than at the end");
          *anchored_end = true;
          break;
        }
        std::string atom = parse_atom(depth);
        atom = "(" + atom + ")" + parse_quantifier();
        out += (out.empty() ? "" : " ") + atom;
      }
      return out.empty() ? "\"\"" : out;
    }

    std::string parse_quantifier() {
      std::string q;
      const char c = peek();
      if (c == '*' || c == '+' || c == '?') {
        ++pos;
        q = std::string(1, c);
      } else if (c == '{') {
        const size_t close = p.find('}', pos);
        if (close == std::string::npos) fail("has an unclosed '{'");
        const std::string inside = p.substr(pos + 1, close - pos - 1);
        const size_t comma = inside.find(',');
        auto number = [&](const std::string& s) {
          if (s.empty() || s.size() > 5 || s.find_first_not_of("0123456789") != std::string::npos) fail("has a bad {m,n}");
          const int v = std::stoi(s);
          if (v > MAX_REPETITION) fail("repeats more than " + std::to_string(MAX_REPETITION) + " times");
          return v;
        };
        const int m = number(comma == std::string::npos ? inside : inside.substr(0, comma));
        std::string upper;
        if (comma != std::string::npos && comma + 1 < inside.size()) {
          const int n = number(inside.substr(comma + 1));
          if (n < m) fail("has {m,n} with n < m");
          upper = std::to_string(n);
        }
        q = "{" + std::to_string(m) + (comma == std::string::npos ? std::to_string(m).substr(0, 0) + "}" : "," + upper + "}");
        if (comma == std::string::npos) q = "{" + std::to_string(m) + "}";
        pos = close + 1;
      } else {
        return "";
      }
      if (peek() == '?') ++pos;  // lazy: the same strings
      if (peek() == '*' || peek() == '+' || peek() == '{') fail("has two quantifiers in a row");
      return q;
    }

    std::string parse_atom(int depth) {
      const char c = peek();
      if (c == '(') {
        ++pos;
        if (peek() == '?') {
          if (p.compare(pos, 2, "?:") != 0) fail("uses lookaround or named groups, which are not supported");
          pos += 2;
        }
        std::string inner = parse_alternatives(depth + 1, nullptr);
        if (peek() != ')') fail("has an unclosed '('");
        ++pos;
        return inner;
      }
      if (c == '[') return owner.json_chars(parse_class());
      if (c == '.') {
        ++pos;
        return owner.json_chars(negate({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}));
      }
      if (c == '*' || c == '+' || c == '?' || c == '{') fail("has a quantifier with nothing to repeat");
      if (c == '^') fail("uses '^' other than at the start");
      if (c == '\\') return owner.json_chars(parse_escape(false));
      return owner.json_chars({single(next_codepoint())});
    }

    static CodepointRange single(uint32_t cp) { return {cp, cp}; }

    static std::vector<CodepointRange> negate(std::vector<CodepointRange> ranges) {
      std::sort(ranges.begin(), ranges.end(), [](auto a, auto b) { return a.first < b.first; });
      std::vector<CodepointRange> out;
      uint32_t next = 0;
      for (const auto& r : ranges) {
        if (r.first > next) out.push_back({next, r.first - 1});
        next = std::max(next, r.last + 1);
      }
      if (next <= 0x10FFFF) out.push_back({next, 0x10FFFF});
      return out;
    }

    uint32_t next_codepoint() {
      const auto c = static_cast<unsigned char>(p[pos]);
      const int n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
      if (pos + static_cast<size_t>(n) > p.size()) fail("has invalid UTF-8");
      uint32_t cp = n == 1 ? c : c & (0x7F >> n);
      for (int i = 1; i < n; ++i) cp = (cp << 6) | (static_cast<unsigned char>(p[pos + static_cast<size_t>(i)]) & 0x3F);
      pos += static_cast<size_t>(n);
      return cp;
    }

    // \d \w \s and their negations, escaped punctuation, \n \t \r \f \v \0 \xHH \uHHHH.
    std::vector<CodepointRange> parse_escape(bool in_class) {
      ++pos;
      if (at_end()) fail("ends with '\\'");
      const char e = p[pos++];
      static const std::vector<CodepointRange> digit = {{'0', '9'}};
      static const std::vector<CodepointRange> word = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
      static const std::vector<CodepointRange> space = {{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x1680, 0x1680},
                                                        {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F},
                                                        {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
      switch (e) {
        case 'd': return digit;
        case 'D': return negate(digit);
        case 'w': return word;
        case 'W': return negate(word);
        case 's': return space;
        case 'S': return negate(space);
        case 'n': return {single('\n')};
        case 't': return {single('\t')};
        case 'r': return {single('\r')};
        case 'f': return {single('\f')};
        case 'v': return {single('\v')};
        case '0': return {single(0)};
        case 'x':
        case 'u': {
          const size_t digits = e == 'x' ? 2 : 4;
          if (pos + digits > p.size()) fail("has a short \\x or \\u escape");
          const std::string hex = p.substr(pos, digits);
          if (hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) fail("has a bad \\x or \\u escape");
          pos += digits;
          return {single(static_cast<uint32_t>(std::stoul(hex, nullptr, 16)))};
        }
        default:
          if (e == 'b' && in_class) return {single('\b')};
          if (std::isalnum(static_cast<unsigned char>(e))) fail(std::string("uses '\\") + e + "', which is not supported");
          return {single(static_cast<unsigned char>(e))};
      }
    }

    std::vector<CodepointRange> parse_class() {
      ++pos;
      const bool negated = peek() == '^';
      if (negated) ++pos;
      std::vector<CodepointRange> ranges;
      bool first = true;
      while (first || peek() != ']') {
        if (at_end()) fail("has an unclosed '['");
        first = false;
        std::vector<CodepointRange> item = peek() == '\\' ? parse_escape(true) : std::vector<CodepointRange>{single(next_codepoint())};
        if (item.size() == 1 && item[0].first == item[0].last && peek() == '-' && pos + 1 < p.size() && p[pos + 1] != ']') {
          ++pos;
          std::vector<CodepointRange> to = peek() == '\\' ? parse_escape(true) : std::vector<CodepointRange>{single(next_codepoint())};
          if (to.size() != 1 || to[0].first != to[0].last) fail("has a class range ending in a class");
          if (to[0].first < item[0].first) fail("has a backwards class range");
          item[0].last = to[0].first;
        }
        ranges.insert(ranges.end(), item.begin(), item.end());
      }
      ++pos;
      return negated ? negate(ranges) : ranges;
    }
  };

  // The JSON-string text of one code point of `ranges`: raw where JSON allows, else its escape.
  std::string json_chars(std::vector<CodepointRange> ranges) const {
    std::sort(ranges.begin(), ranges.end(), [](auto a, auto b) { return a.first < b.first; });
    auto contains = [&](uint32_t cp) {
      for (const auto& r : ranges)
        if (r.first <= cp && cp <= r.last) return true;
      return false;
    };
    std::vector<std::string> alts;
    std::string cls;
    auto hex = [](uint32_t cp) {
      char buf[16];
      std::snprintf(buf, sizeof buf, cp < 0x10000 ? "\\u%04X" : "\\U%08X", cp);
      return std::string(buf);
    };
    for (const auto& r : ranges) {
      // Raw: everything but controls, '"', '\\', DEL and the surrogates.
      const std::vector<CodepointRange> raw = {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x7E}, {0x80, 0xD7FF}, {0xE000, 0x10FFFF}};
      for (const auto& ok : raw) {
        const uint32_t a = std::max(r.first, ok.first), b = std::min(r.last, ok.last);
        if (a > b) continue;
        cls += hex(a);
        if (a != b) {
          cls += '-';
          cls += hex(b);
        }
      }
    }
    if (!cls.empty()) alts.push_back("[" + cls + "]");
    const std::pair<uint32_t, const char*> escapes[] = {{'"', "\\\""}, {'\\', "\\\\"}, {'\n', "\\n"}, {'\r', "\\r"},
                                                        {'\t', "\\t"}, {'\b', "\\b"}, {'\f', "\\f"}};
    for (const auto& [cp, text] : escapes)
      if (contains(cp)) alts.push_back(literal(text));
    if (alts.empty()) return "\"\" [^\\x00-\\U0010FFFF]";  // matches nothing: the class has no JSON-writable character
    std::string out;
    for (const auto& a : alts) out += out.empty() ? a : " | " + a;
    return out;
  }

  const json& root_;
  std::string prefix_;
  std::vector<std::pair<std::string, std::string>> rules_;
  std::set<std::string> defined_, reserved_;
  std::map<std::string, std::string> refs_;
};

}  // namespace

std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema, const std::string& rule_prefix) {
  return SchemaConverter(schema, rule_prefix).convert();
}

std::string json_schema_to_gbnf(const nlohmann::json& schema, const std::string& rule_prefix) {
  return json_schema_to_gbnf(nlohmann::ordered_json::parse(schema.dump()), rule_prefix);
}

std::string json_object_gbnf(const std::string& rule_prefix) {
  static const nlohmann::ordered_json empty = nlohmann::ordered_json::object();
  return SchemaConverter(empty, rule_prefix).any_object();
}

}  // namespace tpcli::grammar

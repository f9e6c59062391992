// A small JSON-schema validator for tests, written apart from the converter (grammar/json_schema.h):
// the keywords the converter supports, with the specification's meaning (oneOf: exactly one;
// lengths in code points; patterns searched with std::wregex, ECMAScript, over code points), except where `strict`
// asks for the converter's documented choice: additionalProperties absent means false.
#pragma once

#include <cmath>
#include <cstdint>
#include <regex>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

namespace tpcli::grammar::testing {

class SchemaValidator {
 public:
  explicit SchemaValidator(const nlohmann::json& root, bool strict = true) : root_(root), strict_(strict) {}

  // "" when `value` is valid, else why not.
  std::string check(const nlohmann::json& value) const { return check(root_, value, "$"); }

 private:
  using json = nlohmann::json;

  static size_t codepoints(const std::string& s) {
    size_t n = 0;
    for (const char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
    return n;
  }

  // One wchar_t per code point (Linux: 32 bits), so a regex counts characters, not bytes.
  static std::wstring wide(const std::string& s) {
    std::wstring out;
    for (size_t i = 0; i < s.size();) {
      const auto c = static_cast<unsigned char>(s[i]);
      const size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
      uint32_t cp = n == 1 ? c : c & (0x7F >> n);
      for (size_t k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
      out += static_cast<wchar_t>(cp);
      i += n;
    }
    return out;
  }

  static std::string type_of(const json& v) {
    if (v.is_null()) return "null";
    if (v.is_boolean()) return "boolean";
    if (v.is_number_integer() || v.is_number_unsigned()) return "integer";
    if (v.is_number_float()) return std::floor(v.get<double>()) == v.get<double>() ? "integer" : "number";
    if (v.is_string()) return "string";
    if (v.is_array()) return "array";
    return "object";
  }

  static bool has_type(const json& v, const std::string& type) {
    const std::string t = type_of(v);
    return t == type || (type == "number" && t == "integer");
  }

  static bool format_ok(const std::string& format, const std::string& s) {
    static const std::string date = R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01]))";
    static const std::string time = R"(([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))";
    if (format == "date") return std::regex_match(s, std::regex(date));
    if (format == "time") return std::regex_match(s, std::regex(time));
    if (format == "date-time") return std::regex_match(s, std::regex(date + "T" + time));
    if (format == "uuid")
      return std::regex_match(s, std::regex("[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"));
    if (format == "email") return std::regex_match(s, std::regex(R"([A-Za-z0-9._%+-]+@([A-Za-z0-9-]+\.)+[A-Za-z]{2,})"));
    return false;
  }

  std::string check(const json& schema, const json& v, const std::string& at) const {
    if (schema.is_boolean()) return schema.get<bool>() ? "" : at + ": schema false";
    if (schema.contains("$ref")) {
      const std::string ref = schema["$ref"];
      return check(root_.at(json::json_pointer(ref.substr(1))), v, at);
    }
    if (schema.contains("type")) {
      const json& t = schema["type"];
      bool ok = false;
      if (t.is_string()) ok = has_type(v, t);
      for (const auto& one : t.is_array() ? t : json::array()) ok |= has_type(v, one);
      if (!ok) return at + ": type " + type_of(v) + " not " + t.dump();
    }
    if (schema.contains("const") && schema["const"] != v) return at + ": not the const";
    if (schema.contains("enum")) {
      bool found = false;
      for (const auto& e : schema["enum"]) found |= e == v;
      if (!found) return at + ": not in enum";
    }
    if (schema.contains("anyOf")) {
      bool any = false;
      for (const auto& s : schema["anyOf"]) any |= check(s, v, at).empty();
      if (!any) return at + ": no anyOf branch";
    }
    if (schema.contains("oneOf")) {
      int n = 0;
      for (const auto& s : schema["oneOf"]) n += check(s, v, at).empty();
      if (n != 1) return at + ": " + std::to_string(n) + " oneOf branches";
    }
    for (const auto& s : schema.value("allOf", json::array()))
      if (auto e = check(s, v, at); !e.empty()) return e;
    if (v.is_number()) {
      const double x = v.get<double>();
      auto bound = [&](const char* key, auto cmp) { return !schema.contains(key) || schema[key].is_boolean() || cmp(x, schema[key].get<double>()); };
      const bool draft4_min = schema.value("exclusiveMinimum", json()).is_boolean() && schema["exclusiveMinimum"].get<bool>();
      const bool draft4_max = schema.value("exclusiveMaximum", json()).is_boolean() && schema["exclusiveMaximum"].get<bool>();
      if (!bound("minimum", [&](double a, double b) { return draft4_min ? a > b : a >= b; })) return at + ": below minimum";
      if (!bound("maximum", [&](double a, double b) { return draft4_max ? a < b : a <= b; })) return at + ": above maximum";
      if (!bound("exclusiveMinimum", [](double a, double b) { return a > b; })) return at + ": not above exclusiveMinimum";
      if (!bound("exclusiveMaximum", [](double a, double b) { return a < b; })) return at + ": not below exclusiveMaximum";
    }
    if (v.is_string()) {
      const std::string s = v.get<std::string>();
      if (schema.contains("minLength") && codepoints(s) < schema["minLength"].get<size_t>()) return at + ": too short";
      if (schema.contains("maxLength") && codepoints(s) > schema["maxLength"].get<size_t>()) return at + ": too long";
      if (schema.contains("pattern") &&
          !std::regex_search(wide(s), std::wregex(wide(schema["pattern"].get<std::string>()), std::regex::ECMAScript)))
        return at + ": pattern " + schema["pattern"].get<std::string>() + " not found in " + json(s).dump();
      if (schema.contains("format") && !format_ok(schema["format"], s)) return at + ": not a " + schema["format"].get<std::string>();
    }
    if (v.is_array()) {
      if (schema.contains("minItems") && v.size() < schema["minItems"].get<size_t>()) return at + ": too few items";
      if (schema.contains("maxItems") && v.size() > schema["maxItems"].get<size_t>()) return at + ": too many items";
      const json prefix = schema.value("prefixItems", json::array());
      for (size_t i = 0; i < v.size(); ++i) {
        const std::string here = at + "[" + std::to_string(i) + "]";
        std::string e;
        if (i < prefix.size()) e = check(prefix[i], v[i], here);
        else if (schema.contains("items")) e = check(schema["items"], v[i], here);
        if (!e.empty()) return e;
      }
    }
    if (v.is_object()) {
      const json props = schema.value("properties", json::object());
      for (const auto& r : schema.value("required", json::array()))
        if (!v.contains(r.get<std::string>())) return at + ": missing " + r.get<std::string>();
      for (const auto& [k, value] : v.items()) {
        const std::string here = at + "." + k;
        if (props.contains(k)) {
          if (auto e = check(props[k], value, here); !e.empty()) return e;
        } else if (schema.contains("additionalProperties")) {
          if (auto e = check(schema["additionalProperties"], value, here); !e.empty()) return e;
        } else if (strict_ && schema.contains("properties")) {
          return here + ": additional property";
        }
      }
    }
    return "";
  }

  const json& root_;
  bool strict_;
};

}  // namespace tpcli::grammar::testing

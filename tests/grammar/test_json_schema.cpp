// JSON schema -> GBNF: answers sampled from the compiled grammar (random walks over a vocabulary of
// bytes and JSON-ish pieces) parse as JSON and pass a validator written apart from the converter;
// unsupported keywords are GrammarErrors naming the keyword and the path.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/compiled_grammar.h"
#include "grammar/grammar_error.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar_checks.h"
#include "json_schema_validator.h"

using namespace tpcli::grammar;
using namespace tpcli::grammar::testing;
using nlohmann::json;

namespace {

const std::vector<std::string>& schemas() {
  static const std::vector<std::string> s = {
      R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"]})",
      R"({"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "null"}, "c": {"type": "number"}}})",
      R"({"type": "object", "properties": {"x": {"type": "string"}, "y": {"type": "string"}, "z": {"type": "string"}}, "required": ["y"]})",
      R"({"type": "object", "properties": {"inner": {"type": "object", "properties": {"id": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["id"]}}, "required": ["inner"]})",
      R"({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4})",
      R"({"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 3})",
      R"({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": false})",
      R"({"type": "array", "prefixItems": [{"type": "boolean"}], "items": {"type": "null"}, "minItems": 1, "maxItems": 3})",
      R"({"enum": ["red", "green", "blue", 42, null, {"k": [1, 2]}]})",
      R"({"type": "object", "properties": {"color": {"enum": ["red", "green"]}, "n": {"const": 7}}, "required": ["color", "n"]})",
      R"({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}, {"type": "array", "items": {"type": "boolean"}}]})",
      R"({"oneOf": [{"type": "object", "properties": {"kind": {"const": "a"}, "v": {"type": "integer"}}, "required": ["kind"]}, {"type": "object", "properties": {"kind": {"const": "b"}, "w": {"type": "string"}}, "required": ["kind"]}]})",
      R"({"type": ["string", "null"]})",
      R"({"type": "integer", "minimum": 5, "maximum": 1234})",
      R"({"type": "integer", "minimum": -250, "maximum": -3})",
      R"({"type": "integer", "exclusiveMinimum": -10, "exclusiveMaximum": 10})",
      R"({"type": "integer", "minimum": 100})",
      R"({"type": "integer", "maximum": -7})",
      R"({"type": "number", "minimum": 0, "maximum": 1})",
      R"({"type": "number", "minimum": -5, "exclusiveMaximum": 3})",
      R"({"type": "number", "exclusiveMinimum": 2})",
      R"({"type": "string", "minLength": 2, "maxLength": 5})",
      R"({"type": "string", "pattern": "^[a-z]{2,4}-[0-9]+$"})",
      R"({"type": "string", "pattern": "^(ab|cd)*x?$"})",
      R"({"type": "string", "pattern": "\\d{3}"})",
      R"({"type": "string", "pattern": "^\\w+@\\w+\\.(com|org)$"})",
      R"({"type": "string", "pattern": "^[^\\s\"]{1,3}\\\\[A-F0-9]{2}$"})",
      R"({"type": "string", "format": "date"})",
      R"({"type": "string", "format": "time"})",
      R"({"type": "string", "format": "date-time"})",
      R"({"type": "string", "format": "uuid"})",
      R"({"type": "string", "format": "email"})",
      R"({"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}, "required": ["x", "y"]}}, "type": "array", "items": {"$ref": "#/$defs/point"}, "maxItems": 3})",
      R"({"definitions": {"node": {"type": "object", "properties": {"value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/definitions/node"}, "maxItems": 2}}, "required": ["value"]}}, "$ref": "#/definitions/node"})",
      R"({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"], "additionalProperties": {"type": "boolean"}})",
      R"({"type": "object", "additionalProperties": true})",
      R"({"type": "object", "properties": {"p1": {"type": "integer"}, "p2": {"type": "integer"}, "p3": {"type": "integer"}, "p4": {"type": "integer"}, "p5": {"type": "integer"}, "p6": {"type": "integer"}, "p7": {"type": "integer"}, "p8": {"type": "integer"}}, "required": ["p3", "p6"]})",
      R"({"title": "Anything", "description": "any JSON value"})",
      R"({"type": "object", "properties": {"when": {"type": "string", "format": "date-time"}, "score": {"type": "number", "minimum": 0, "maximum": 100}, "level": {"type": "integer", "minimum": 1, "maximum": 5}, "note": {"type": ["string", "null"], "maxLength": 8}}, "required": ["when", "score", "level"]})",
      R"({"type": "string", "enum": ["caf\u00e9", "na\u00efve", "\u65e5\u672c"]})",
  };
  return s;
}

std::string error_of(const std::string& schema) {
  try {
    json_schema_to_gbnf(json::parse(schema));
  } catch (const GrammarError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("json schema: sampled answers parse and validate against each of 40 schemas") {
  const auto vocab = make_vocabulary(synthetic_vocabulary());
  std::mt19937 rng(42);
  for (const std::string& text : schemas()) {
    INFO(text);
    const json schema = json::parse(text);
    const std::string gbnf = json_schema_to_gbnf(schema);
    INFO(gbnf);
    const auto g = compile_gbnf(gbnf, vocab);
    const SchemaValidator validator(schema);
    int finished = 0;
    for (int walk = 0; walk < 100; ++walk) {
      const Walk w = random_walk(g, rng, 300, 0.5, [](const Matcher&, const std::string&) {}, closing_weight);
      if (!w.finished) continue;
      ++finished;
      INFO("answer: " << w.text);
      json value;
      REQUIRE_NOTHROW(value = json::parse(w.text));
      REQUIRE(validator.check(value) == "");
    }
    CHECK(finished >= 90);
  }
}

TEST_CASE("json schema: the validator refuses what the schemas forbid (it can fail)") {
  const auto bad = [](const char* schema, const char* value) {
    const json s = json::parse(schema);
    return !SchemaValidator(s).check(json::parse(value)).empty();
  };
  CHECK(bad(R"({"type": "integer", "minimum": 5})", "4"));
  CHECK(bad(R"({"type": "object", "properties": {"a": {"type": "string"}}})", R"({"b": 1})"));
  CHECK(bad(R"({"type": "string", "pattern": "^a+$"})", R"("ab")"));
  CHECK(bad(R"({"type": "array", "maxItems": 1})", "[1, 2]"));
  CHECK(bad(R"({"type": "string", "format": "date"})", R"("2024-13-01")"));
  CHECK(bad(R"({"oneOf": [{"type": "integer"}, {"type": "number"}]})", "3"));
  CHECK_FALSE(bad(R"({"type": "number", "exclusiveMaximum": 3})", "2.99"));
}

TEST_CASE("json schema: json_object allows any object and nothing else") {
  const auto vocab = make_vocabulary(synthetic_vocabulary());
  const auto g = compile_gbnf(json_object_gbnf(), vocab);
  std::mt19937 rng(7);
  int finished = 0;
  for (int walk = 0; walk < 100; ++walk) {
    const Walk w = random_walk(g, rng, 300, 0.5, [](const Matcher&, const std::string&) {}, closing_weight);
    if (!w.finished) continue;
    ++finished;
    INFO(w.text);
    REQUIRE(json::parse(w.text).is_object());
  }
  CHECK(finished >= 90);
  Matcher m(g);
  CHECK_FALSE(m.accept_bytes("["));
  CHECK(m.accept_bytes("{\"a\": [1, {\"b\": null}], \"c\": \"\\u00e9\"}"));
  CHECK(m.can_end());
  Matcher lone(g);
  CHECK_FALSE(lone.accept_bytes("{\"a\": \"\\ud800\""));  // a lone surrogate is no JSON a strict parser takes
}

TEST_CASE("json schema: a rule prefix names every rule, the entry is <prefix>root") {
  const std::string gbnf = json_schema_to_gbnf(json::parse(schemas()[3]), "s1-");
  for (size_t line = 0; line < gbnf.size();) {
    const size_t end = gbnf.find('\n', line);
    CHECK(gbnf.compare(line, 3, "s1-") == 0);
    line = end + 1;
  }
  CHECK(gbnf.find("s1-root ::=") != std::string::npos);
  // Two schemas in one grammar.
  const std::string both = json_schema_to_gbnf(json::parse(schemas()[0]), "a-") + json_schema_to_gbnf(json::parse(schemas()[4]), "b-") +
                           "root ::= a-root | b-root\n";
  Matcher m(compile_gbnf(both, make_vocabulary(synthetic_vocabulary())));
  CHECK(m.accept_bytes("[1, 2, 3]"));
  CHECK(m.can_end());
}

TEST_CASE("json schema: properties come in schema order, optional ones may be left out") {
  const auto g = compile_gbnf(json_schema_to_gbnf(json::parse(schemas()[2])), make_vocabulary(synthetic_vocabulary()));
  auto complete = [&](const char* text) {
    Matcher m(g);
    return m.accept_bytes(text) && m.can_end();
  };
  CHECK(complete(R"({"y": "b"})"));
  CHECK(complete(R"({"x": "a", "y": "b", "z": "c"})"));
  CHECK(complete(R"({"y": "b", "z": "c"})"));
  CHECK_FALSE(complete(R"({"x": "a"})"));              // y is required
  CHECK_FALSE(complete(R"({"y": "b", "x": "a"})"));    // out of order
  CHECK_FALSE(complete(R"({"y": "b", "w": "a"})"));    // no additional properties
  CHECK_FALSE(complete("{\"y\":                                  \"b\"}"));  // whitespace runs are bounded
}

TEST_CASE("json schema: an ordered_json keeps the schema's property order") {
  const auto schema = nlohmann::ordered_json::parse(R"({"type": "object", "properties": {"zeta": {"type": "integer"}, "alpha": {"type": "integer"}}, "required": ["zeta", "alpha"]})");
  const auto vocab = make_vocabulary(synthetic_vocabulary());
  Matcher ordered(compile_gbnf(json_schema_to_gbnf(schema), vocab));
  CHECK(ordered.accept_bytes(R"({"zeta": 1, "alpha": 2})"));
  CHECK(ordered.can_end());
  Matcher sorted(compile_gbnf(json_schema_to_gbnf(json::parse(schema.dump())), vocab));
  CHECK(sorted.accept_bytes(R"({"alpha": 2, "zeta": 1})"));
  CHECK(sorted.can_end());
}

TEST_CASE("json schema: unsupported keywords are GrammarErrors naming the keyword and the path") {
  CHECK(error_of(R"({"type": "object", "properties": {"age": {"type": "string", "format": "ipv6"}}})") ==
        "schema at properties.age: unsupported keyword 'format': 'ipv6'");
  CHECK(error_of(R"({"type": "array", "uniqueItems": true})") == "schema at (root): unsupported keyword 'uniqueItems'");
  CHECK(error_of(R"({"type": "object", "properties": {"a": {"type": "number", "multipleOf": 2}}})") ==
        "schema at properties.a: unsupported keyword 'multipleOf'");
  CHECK(error_of(R"({"not": {"type": "string"}})") == "schema at (root): unsupported keyword 'not'");
  CHECK(error_of(R"({"type": "string", "pattern": "(?=a)b"})").find("lookaround") != std::string::npos);
  CHECK(error_of(R"({"type": "string", "pattern": "(a)\\1"})").find("'\\1'") != std::string::npos);
  CHECK(error_of(R"({"$ref": "http://example.com/s.json"})").find("only local") != std::string::npos);
  CHECK(error_of(R"({"$ref": "#/$defs/missing"})").find("names nothing") != std::string::npos);
  CHECK(error_of(R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})").find("'b'") != std::string::npos);
  CHECK(error_of(R"({"type": "number", "minimum": 0.5})").find("'minimum'") != std::string::npos);
  CHECK(error_of(R"({"type": "widget"})") == "schema at (root): unsupported keyword 'type': 'widget'");
  try {
    json_schema_to_gbnf(json::parse(R"({"items": {"type": "array", "items": {"patternProperties": {}}}})"));
    FAIL("no error");
  } catch (const GrammarError& e) {
    CHECK(e.path() == "items.items");
  }
}

// tpcli::grammar — JSON schema (OpenAI's response_format json_schema) and "any JSON object"
// (json_object) as GBNF text, for compile_gbnf.
//
// Every rule is named <rule_prefix>..., the entry rule <rule_prefix>root (so several schemas can share
// one grammar; with prefix "" the entry is `root`). The output is compact JSON with a bounded run of
// whitespace between tokens (space ::= | " " | "\n" [ \t]{0,20}, llama.cpp's), properties in schema
// order. Supported (anything else is a GrammarError naming the keyword and the schema path):
//   type (one or a list): null, boolean, integer, number, string, array, object; no type: any value
//     (or the type the keywords imply: properties -> object, items -> array, minLength -> string, ...)
//   object: properties (in order), required (the others are optional, kept in order),
//     additionalProperties: ABSENT MEANS false when there are properties (OpenAI's strict mode; without
//     properties any object); true or a schema adds extra "key": value pairs after the declared
//     ones (an extra key is not checked against the declared names)
//   array: items (schema or false), prefixItems, minItems, maxItems (<= 10000)
//   enum, const (any JSON values, matched in their compact form), anyOf, oneOf (as anyOf: make the
//     branches disjoint), allOf with one schema, $ref to #, #/$defs/..., #/definitions/... or any
//     #/json/pointer (recursive refs too)
//   integer: minimum, maximum, exclusiveMinimum, exclusiveMaximum (numbers, or draft-4 booleans),
//     at most 16 digits; number: the same bounds when they are whole numbers (no exponent then)
//   string: minLength, maxLength, pattern, format: date (YYYY-MM-DD, day 01-31 in any month), time
//     (hh:mm:ss[.f{1,6}](Z|+hh:mm|-hh:mm)), date-time (dateTtime), uuid, email
//     (local@label.label...tld, labels unbounded)
//   pattern: ECMAScript subset: literals, . \d \D \w \W \s \S, [classes] with ranges and negation, groups
//     ( ) (?: ), |, * + ? {m} {m,} {m,n} (lazy ? ignored), ^ at the start and $ at the end (else the
//     match may be anywhere in the string); no backreferences, lookaround or \b. A string made
//     for a pattern uses no JSON escapes but \" \\ \n \r \t \b \f.
//   ignored annotations: title, description, default, examples, $schema, $id, $comment, deprecated,
//     readOnly, writeOnly, and $defs/definitions themselves.
// Strings use \uXXXX escapes outside the surrogates only, so every answer parses as strict JSON.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace tpcli::grammar {

constexpr int MAX_SCHEMA_DEPTH = 64;  // nested subschemas (a deeper one is a GrammarError)

// Properties come in the schema's order with an ordered_json (parse with nlohmann::ordered_json::parse);
// a nlohmann::json keeps its keys sorted, so they come sorted by name.
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema, const std::string& rule_prefix = "");
std::string json_schema_to_gbnf(const nlohmann::json& schema, const std::string& rule_prefix = "");
// response_format {"type": "json_object"}: any JSON object.
std::string json_object_gbnf(const std::string& rule_prefix = "");

}  // namespace tpcli::grammar

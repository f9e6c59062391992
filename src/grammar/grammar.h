// tpcli::grammar — constrained decoding for structured outputs: OpenAI's response_format
// (json_schema, json_object) and GBNF grammars (llama.cpp's dialect). One include for callers.
//
//   auto vocab = std::make_shared<const TokenVocabulary>(text::token_bytes(tokenizer));  // once per model
//   auto grammar = compile_gbnf(json_schema_to_gbnf(schema), vocab);  // once per schema (cache it)
//   Matcher m(grammar);                                 // one per sequence
//   each step: m.fill_mask(bits); mask the logits (EOS allowed iff m.can_end()); m.accept(token)
//
// What is supported, briefly (details in each header):
//   GBNF (grammar/gbnf_parser.h): `name ::= ...` rules, "literals" and [classes] with \n \r \t \" \\
//     \xHH \uHHHH \UHHHHHHHH escapes, [^...], `.`, ( ), |, * + ? {m} {m,} {m,n} (m, n <= 10000),
//     # comments; start rule `root`; left recursion is refused.
//   JSON schema (grammar/json_schema.h): type (and lists), object properties in order with required /
//     optional, additionalProperties (absent = false when properties are given), arrays (items,
//     prefixItems, minItems, maxItems), enum, const, anyOf, oneOf, one-schema allOf, local $ref
//     (recursive too), integer bounds, whole-number bounds for numbers, minLength / maxLength,
//     pattern (an ECMAScript subset), format date, time, date-time, uuid, email. Anything else is a
//     GrammarError naming the keyword and the schema path.
//   Masks (grammar/compiled_grammar.h, grammar/matcher.h): exact at the byte level (a token may end
//     inside a UTF-8 character), from a per-state token cache (XGrammar's adaptive token mask cache)
//     plus runtime checks of the few context-dependent tokens.
#pragma once

#include "grammar/compiled_grammar.h"
#include "grammar/grammar_error.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/token_vocabulary.h"

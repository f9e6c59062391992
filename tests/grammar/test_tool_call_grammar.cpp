// Tool-call grammars (text/tool_calls.h) through the real JSON-schema compiler and matcher: a
// forced call's arguments come in the order the client declared its parameters (the tools as an
// ordered_json, as serve parses them), and a text value of the XML formats is bounded.
#include <catch2/catch.hpp>

#include <string>

#include <nlohmann/json.hpp>

#include "grammar/compiled_grammar.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar_checks.h"
#include "text/tool_calls.h"

using namespace tpcli::grammar;
using namespace tpcli::grammar::testing;
using nlohmann::ordered_json;
using tpcli::text::ToolCallFormat;

namespace {

std::string schema_rules(const ordered_json& schema, const std::string& prefix) { return json_schema_to_gbnf(schema, prefix); }

bool allows(const std::string& gbnf, const std::string& text) {
  Matcher m(compile_gbnf(gbnf, make_vocabulary(synthetic_vocabulary())));
  return m.accept_bytes(text) && m.can_end();
}

}  // namespace

TEST_CASE("tool-call grammar: a forced call's argument keys follow the order the tools declare, not the alphabet") {
  const ordered_json tools = ordered_json::parse(R"([{"type": "function", "function": {"name": "book", "parameters": {"type": "object",
      "properties": {"zone": {"type": "integer"}, "at": {"type": "integer"}, "mode": {"enum": ["a", "b"]}},
      "required": ["zone", "at", "mode"]}}}])");
  const std::string declared = R"({"zone": 3, "at": 5, "mode": "a"})", alphabetical = R"({"at": 5, "mode": "a", "zone": 3})";
  const struct {
    ToolCallFormat format;
    std::string before, after;
  } formats[] = {
      {ToolCallFormat::hermes, "<tool_call>\n{\"name\": \"book\", \"arguments\": ", "}\n</tool_call>"},
      {ToolCallFormat::functionary_v3_1, "<function=book>", "</function>"},
      {ToolCallFormat::llama3_json, "{\"name\": \"book\", \"parameters\": ", "}"},
  };
  for (const auto& f : formats) {
    const std::string gbnf = tpcli::text::tool_call_grammar(f.format, tools, "book", false, schema_rules);
    INFO(tpcli::text::tool_call_format_name(f.format) << ":\n" << gbnf);
    CHECK(allows(gbnf, f.before + declared + f.after));
    CHECK_FALSE(allows(gbnf, f.before + alphabetical + f.after));
  }
}

TEST_CASE("tool-call grammar: a text value of the XML formats is bounded at MAX_TEXT_VALUE characters") {
  const ordered_json tools = ordered_json::parse(R"([{"type": "function", "function": {"name": "write", "parameters": {"type": "object",
      "properties": {"content": {"type": "string"}}}}}])");
  const std::string gbnf = tpcli::text::tool_call_grammar(ToolCallFormat::qwen3_coder, tools, "", false, schema_rules);
  INFO(gbnf);
  const auto call = [](const std::string& value) {
    return "<tool_call>\n<function=write>\n<parameter=content>\n" + value + "\n</parameter>\n</function>\n</tool_call>";
  };
  std::string text;  // lines of prose and code: every length up to the bound, across blocks
  for (int i = 0; text.size() < static_cast<size_t>(tpcli::text::MAX_TEXT_VALUE); ++i)
    text += i % 3 == 0 ? "if (a > b) return;\n" : "Some words, then more.\t";
  text.resize(static_cast<size_t>(tpcli::text::MAX_TEXT_VALUE));
  for (const size_t length : {size_t{0}, size_t{1}, size_t{127}, size_t{128}, size_t{129}, size_t{5000}, text.size()}) {
    INFO("a value of " << length << " characters");
    CHECK(allows(gbnf, call(text.substr(0, length))));
  }
  CHECK_FALSE(allows(gbnf, call(text + "x")));
  Matcher m(compile_gbnf(gbnf, make_vocabulary(synthetic_vocabulary())));
  REQUIRE(m.accept_bytes("<tool_call>\n<function=write>\n<parameter=content>\n" + text));
  CHECK_FALSE(m.accept_bytes("x"));  // the value can grow no further: only its closer may come
  CHECK(m.accept_bytes("\n</parameter>"));
}

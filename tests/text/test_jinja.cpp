// The Jinja interpreter's language, each expectation what Python jinja2 3.1 (in transformers'
// ImmutableSandboxedEnvironment, trim_blocks + lstrip_blocks) prints for the same template.
#include <catch2/catch.hpp>

#include <string>

#include <nlohmann/json.hpp>

#include "text/chat_template.h"

using nlohmann::ordered_json;
using tpcli::text::RenderOptions;
using tpcli::text::TemplateError;

namespace {

std::string render(const std::string& source, const ordered_json& variables = ordered_json::object(),
                   const RenderOptions& options = {}) {
  return tpcli::text::render_chat_template(source, variables, options);
}

std::string error_of(const std::string& source, const ordered_json& variables = ordered_json::object(),
                     const RenderOptions& options = {}) {
  try {
    render(source, variables, options);
  } catch (const TemplateError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("jinja: whitespace control, trim_blocks and lstrip_blocks") {
  CHECK(render("a\n{% if true %}\nb\n{% endif %}\nc") == "a\nb\nc");
  CHECK(render("a\n    {% if true %}\n    b\n    {% endif %}\nc\n") == "a\n    b\nc");
  CHECK(render("a  {%- if true -%}  b  {%- endif -%}  c") == "abc");
  CHECK(render("{{- ' x ' -}}\n") == " x ");
  CHECK(render("a\n  {{ 1 }}\n") == "a\n  1");  // lstrip_blocks leaves {{ alone; one final newline dropped
  CHECK(render("a {%+ if true %}b{% endif +%}\nc") == "a b\nc");
  CHECK(render("x\n  {# note #}\ny") == "x\ny");
  CHECK(render("{% raw %}{{ not parsed }}{% endraw %}") == "{{ not parsed }}");
  CHECK(render("a\r\nb\r\n") == "a\nb");
  CHECK(render("{% for i in [1, 2] %}{{ i }}{% endfor %}\n\n") == "12\n");
}

TEST_CASE("jinja: values print as Python's str()") {
  CHECK(render("{{ none }}|{{ true }}|{{ false }}|{{ 1500.0 }}|{{ 1e-07 }}|{{ 0.1 + 0.2 }}|{{ 1e16 }}|{{ 10 / 4 }}") ==
        "None|True|False|1500.0|1e-07|0.30000000000000004|1e+16|2.5");
  CHECK(render("{{ [1, 'a', none, true, 2.0] }}") == "[1, 'a', None, True, 2.0]");
  CHECK(render("{{ {'a': 1, 'b': [2]} }}") == "{'a': 1, 'b': [2]}");
  CHECK(render("{{ [\"it's\", 'say \"hi\"', 'both \\' \"'] }}") == "[\"it's\", 'say \"hi\"', 'both \\' \"']");
  CHECK(render("{{ ('x',) }}{{ (1, 2) }}") == "('x',)(1, 2)");
  CHECK(render("{{ m }}", {{"m", ordered_json::parse(R"([{"type": "text", "text": "Part\none."}])")}}) ==
        "[{'type': 'text', 'text': 'Part\\none.'}]");
  CHECK(render("{{ x|string }}{{ 3|string ~ 'x' }}", {{"x", ordered_json::parse(R"({"k": null})")}}) == "{'k': None}3x");
}

// The Jinja language, case by case: each expectation is what Python jinja2 3.1.6 printed for the same
// source in transformers' environment (render.py of ../shared/reference/chat-templates: the
// ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, loopcontrols, transformers' tojson),
// with the variables of jinja_variables() below; std::nullopt where jinja2 raised (the comment says
// what Python raised). Plus what Python cannot show: the sandbox's limits and the API.
#include <catch2/catch.hpp>

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "text/jinja_template.h"

using nlohmann::ordered_json;
using tpcli::text::JinjaTemplate;
using tpcli::text::RenderOptions;
using tpcli::text::TemplateError;

namespace {

struct Expectation {
  const char* source;
  std::optional<const char*> text;  // none: rendering must fail
};

ordered_json jinja_variables() {
  return ordered_json::parse(R"({
    "messages": [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hi \ud83d\udc4b"},
                 {"role": "assistant", "content": [{"type": "text", "text": "it's"}]}],
    "tool": {"name": "f", "arguments": {"x": 1.5, "y": null, "z": true, "s": "\u00e9\"\n"}},
    "add_generation_prompt": true})");
}

// render.py's clock: 2026-07-26 00:00:00, a Sunday.
RenderOptions fixed_clock() {
  RenderOptions options;
  std::tm t{};
  t.tm_year = 2026 - 1900, t.tm_mon = 6, t.tm_mday = 26, t.tm_wday = 0, t.tm_yday = 206;
  options.now = t;
  return options;
}

template <size_t N>
void check_all(const Expectation (&expectations)[N]) {
  const ordered_json variables = jinja_variables();
  const RenderOptions options = fixed_clock();
  for (const Expectation& e : expectations) {
    INFO("source: " << e.source);
    if (e.text) {
      std::string got;
      REQUIRE_NOTHROW(got = tpcli::text::render_chat_template(e.source, variables, options));
      CHECK(got == *e.text);
    } else {
      CHECK_THROWS_AS(tpcli::text::render_chat_template(e.source, variables, options), TemplateError);
    }
  }
}

// WHITESPACE
const Expectation WHITESPACE[] = {
    {R"~~(a
{% if true %}
b
{% endif %}
c)~~", R"~~(a
b
c)~~"},
    {R"~~(a
    {% if true %}
    b
    {% endif %}
c
)~~", R"~~(a
    b
c)~~"},
    {R"~~(a  {%- if true -%}  b  {%- endif -%}  c)~~", R"~~(abc)~~"},
    {R"~~(a
  {{ 1 }}
)~~", R"~~(a
  1)~~"},
    {R"~~(a {%+ if true %}b{% endif +%}
c)~~", R"~~(a b
c)~~"},
    {R"~~(x
  {# note #}
y)~~", R"~~(x
y)~~"},
    {R"~~(x {#- c -#} y)~~", R"~~(xy)~~"},
    {R"~~({% raw %}{{ not parsed }}{% endraw %})~~", R"~~({{ not parsed }})~~"},
    {R"~~(  {%- raw -%}  r  {%- endraw -%}  )~~", R"~~(r)~~"},
    {R"~~(a\r
b\r
)~~", R"~~(a\r
b\r)~~"},
    {R"~~({% for i in [1, 2] %}{{ i }}
{% endfor %}

)~~", R"~~(1
2
)~~"},
    {R"~~({% macro f(x) -%}
  [{{ x }}]
{%- endmacro %}
{{ f(1) }}
{{ f(2) }})~~", R"~~([1]
[2])~~"},
    {R"~~({{ "a" -}}
   {{- "b" }})~~", R"~~(ab)~~"},
    {R"~~({% if true %}   {% endif %}x)~~", R"~~(   x)~~"},
    {R"~~(\t{% if true %}tab{% endif %})~~", R"~~(\ttab)~~"},
    {R"~~({{ 1 }}{# a comment
over lines #}
{{ 2 }})~~", R"~~(12)~~"},
};
// PRINTING
const Expectation PRINTING[] = {
    {R"~~({{ none }}|{{ true }}|{{ false }}|{{ 1500.0 }}|{{ 1e-07 }}|{{ 0.1 + 0.2 }}|{{ 1e16 }}|{{ 10 / 4 }}|{{ 6 / 2 }}|{{ -0.0 }}|{{ 123456789.123 }}|{{ 0.0001 }})~~", R"~~(None|True|False|1500.0|1e-07|0.30000000000000004|1e+16|2.5|3.0|-0.0|123456789.123|0.0001)~~"},
    {R"~~({{ [1, 'a', none, true, 2.0] }} {{ {'a': 1, 'b': [2]} }} {{ ('x',) }} {{ (1, 2) }})~~", R"~~([1, 'a', None, True, 2.0] {'a': 1, 'b': [2]} ('x',) (1, 2))~~"},
    {R"~~({{ ["it's", 'say "hi"', 'both \' "', 'tab\tnl
\\'] }})~~", R"~~(["it's", 'say "hi"', 'both \' "', 'tab\tnl\n\\'])~~"},
    {R"~~({{ messages[2].content }}|{{ messages[2].content|string }}|{{ tool.arguments }})~~", R"~~([{'type': 'text', 'text': "it's"}]|[{'type': 'text', 'text': "it's"}]|{'x': 1.5, 'y': None, 'z': True, 's': 'é"\n'})~~"},
    {R"~~({{ 'é\xa0\u200d' }}|{{ ['é\xa0\u200d\x7f'] }}|{{ ['👋'] }})~~", R"~~(é ‍|['é\xa0\u200d\x7f']|['👋'])~~"},
    {R"~~({{ 'x' ~ none ~ missing ~ 1 ~ 2.5 ~ true ~ [1] }})~~", R"~~(xNone12.5True[1])~~"},
    {R"~~({{ {1: 'a', none: 'b', true: 'c'} }})~~", R"~~({1: 'c', None: 'b'})~~"},
};
// TOJSON
const Expectation TOJSON[] = {
    {R"~~({{ tool|tojson }})~~", R"~~({"name": "f", "arguments": {"x": 1.5, "y": null, "z": true, "s": "é\"\n"}})~~"},
    {R"~~({{ tool.arguments|tojson(indent=2) }})~~", R"~~({
  "x": 1.5,
  "y": null,
  "z": true,
  "s": "é\"\n"
})~~"},
    {R"~~({{ {'b': 1, 'a': [2]}|tojson(sort_keys=true) }}|{{ 'é👋'|tojson(ensure_ascii=true) }}|{{ [1, {'a': 2}]|tojson(separators=(',', ':')) }})~~", R"~~({"a": [2], "b": 1}|"\u00e9\ud83d\udc4b"|[1,{"a":2}])~~"},
    {R"~~({{ [1e-7, 1500.0, 1e22, 0.5, -3]|tojson }}|{{ none|tojson }}|{{ 'a\u2028\x00\x1f\x7f'|tojson }}|{{ (1, 'a')|tojson }})~~", R"~~([1e-07, 1500.0, 1e+22, 0.5, -3]|null|"a \u0000\u001f"|[1, "a"])~~"},
    {R"~~({{ {}|tojson(indent=2) }}|{{ []|tojson(indent=2) }}|{{ {'a': {}}|tojson(indent='\t') }})~~", R"~~({}|[]|{
	"a": {}
})~~"},
    {R"~~({{ messages[1]|tojson }})~~", R"~~({"role": "user", "content": "Hi 👋"})~~"},
};
// UNDEFINED
const Expectation UNDEFINED[] = {
    {R"~~([{{ missing }}]{{ missing is defined }}{{ missing is undefined }}{{ missing|default('d') }}{{ missing|length }}{{ missing|string }}{{ missing|trim }})~~", R"~~([]FalseTrued0)~~"},
    {R"~~({% for x in missing %}{{ x }}{% else %}empty{% endfor %}{{ missing is iterable }}{{ 'a' in missing }}{{ missing == missing }})~~", R"~~(emptyTrueFalseTrue)~~"},
    {R"~~({{ tool.nope }}|{{ tool.nope is defined }}|{{ tool['nope'] is defined }}|{{ messages[9] is defined }}|{{ none.x is defined }})~~", R"~~(|False|False|False|False)~~"},
    {R"~~({{ 'yes' if missing else 'no' }}|{{ not missing }}|{{ missing or 'fallback' }}|{{ 'x' if false }}|)~~", R"~~(no|True|fallback||)~~"},
    {R"~~({{ missing + 1 }})~~", std::nullopt},  // UndefinedError: 'missing' is undefined
    {R"~~({{ missing.attr }})~~", std::nullopt},  // UndefinedError: 'missing' is undefined
    {R"~~({{ missing() }})~~", std::nullopt},  // UndefinedError: 'missing' is undefined
    {R"~~({{ missing < 1 }})~~", std::nullopt},  // UndefinedError: 'missing' is undefined
    {R"~~({{ -missing }})~~", std::nullopt},  // UndefinedError: 'missing' is undefined
};
// OPERATORS
const Expectation OPERATORS[] = {
    {R"~~({{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7.5 % 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 1 + 2 * 3 ** 2 }} {{ (1 + 2) * 3 }} {{ 2 ** 3 ** 2 }})~~", R"~~(3 -4 1 2 1.5 1024 0.5 19 9 64)~~"},
    {R"~~({{ 'ab' * 3 }} {{ [1, 2] * 2 }} {{ 3 * 'x' }} {{ [1] + [2] }} {{ (1,) + (2,) }} {{ 1 + 2.5 }} {{ true + 1 }})~~", R"~~(ababab [1, 2, 1, 2] xxx [1, 2] (1, 2) 3.5 2)~~"},
    {R"~~({{ 1 in [1, 2] }} {{ 3 not in [1, 2] }} {{ 'a' in {'a': 1} }} {{ 'bc' in 'abc' }} {{ not 1 == 2 }} {{ 1 < 2 < 3 }} {{ 1 < 2 > 3 }} {{ [1, 2] < [1, 3] }} {{ 'a' < 'b' }})~~", R"~~(True True True True True True False True True)~~"},
    {R"~~({{ [1, 2] == [1, 2] }} {{ (1, 2) == [1, 2] }} {{ 1 == 1.0 }} {{ true == 1 }} {{ {'a': 1} == {'a': 1} }} {{ none == none }} {{ 'a' != 'b' }})~~", R"~~(True False True True True True True)~~"},
    {R"~~({{ 0 or 'x' }} {{ 1 and 'y' }} {{ '' and 'z' }} {{ none or none }} {{ not true or true }} {{ not (true or true) }})~~", R"~~(x y  None True False)~~"},
    {R"~~({{ 'x' if 1 else 'y' if 2 else 'z' }} {{ 'a' ~ 'b' if false else 'c' }} {{ 1 - -1 }} {{ +3 }} {{ - 2.5 }})~~", R"~~(x c 2 3 -2.5)~~"},
    {R"~~({{ "%s and %d, %05.2f %r %x %%" % ('a', 3.7, 2.5, 'q', 255) }} {{ "%(a)s-%(b)s" % {'a': 1, 'b': none} }} {{ "%s" % [1, 2] }} {{ "%5s|%-5s|%.1s" % ('ab', 'cd', 'ef') }})~~", R"~~(a and 3, 02.50 'q' ff % 1-None [1, 2]    ab|cd   |e)~~"},
    {R"~~({{ "{} {}".format(1, 'b') }} {{ "{0}{0} {name!r} {x:>5}|{y:.3f}|{z:,}|{w:^7}|{v:+d}".format(1, name='n', x='ab', y=3.14159, z=1234567, w='mid', v=5) }})~~", R"~~(1 b 11 'n'    ab|3.142|1,234,567|  mid  |+5)~~"},
    {R"~~({{ 'a' + none }})~~", std::nullopt},  // TypeError: can only concatenate str (not "NoneType") to str
    {R"~~({{ none + 'a' }})~~", std::nullopt},  // TypeError: unsupported operand type(s) for +: 'NoneType' and 'str'
    {R"~~({{ 'a' + 1 }})~~", std::nullopt},  // TypeError: can only concatenate str (not "int") to str
    {R"~~({{ 'a' + ['b'] }})~~", std::nullopt},  // TypeError: can only concatenate str (not "list") to str
    {R"~~({{ [1] + (2,) }})~~", std::nullopt},  // TypeError: can only concatenate list (not "tuple") to list
    {R"~~({{ {'a': 1} + {'b': 2} }})~~", std::nullopt},  // TypeError: unsupported operand type(s) for +: 'dict' and 'dict'
    {R"~~({{ 1 / 0 }})~~", std::nullopt},  // ZeroDivisionError: division by zero
    {R"~~({{ 1 // 0 }})~~", std::nullopt},  // ZeroDivisionError: integer division or modulo by zero
    {R"~~({{ 1 in 'abc' }})~~", std::nullopt},  // TypeError: 'in <string>' requires string as left operand, not int
    {R"~~({{ 'a' in none }})~~", std::nullopt},  // TypeError: argument of type 'NoneType' is not iterable
    {R"~~({{ 'a' < 1 }})~~", std::nullopt},  // TypeError: '<' not supported between instances of 'str' and 'int'
    {R"~~({{ "%s %s" % ('a',) }})~~", std::nullopt},  // TypeError: not enough arguments for format string
    {R"~~({{ "%s" % ('a', 'b') }})~~", std::nullopt},  // TypeError: not all arguments converted during string formatting
    {R"~~({{ "{} {0}".format(1) }})~~", std::nullopt},  // ValueError: cannot switch from manual field specification to automatic field numbering
};
// FILTERS
const Expectation FILTERS[] = {
    // Case mapping and letters beyond Latin (Python's output: the title filter upper-cases a word's
    // first letter, str.title() title-cases it).
    {R"~~({{ 'ἀθήνα'|upper }} {{ 'ԲԱՐԵՒ'|lower }} {{ 'ǆemal'|title }} {{ 'ǆemal'.title() }} {{ '日本'.isalpha() }} {{ 'αβ1'.isalnum() }} {{ 'Я'.isupper() }})~~", R"~~(ἈΘΉΝΑ բարեւ Ǆemal ǅemal True True True)~~"},
    {R"~~({{ "hello wORLD-x(y)"|title }}|{{ "hELLO"|capitalize }}|{{ "Hé"|upper }}{{ "HÉ"|lower }}|{{ "  a b  "|trim }}|{{ "xxaxx"|trim('x') }}|{{ 'x'|center(5) }}|{{ 'ab'|center(5) }})~~", R"~~(Hello World-X(Y)|Hello|HÉhé|a b|a|  x  |  ab )~~"},
    {R"~~({{ [3, 1, 2]|sort }} {{ [3, 1, 2]|sort(reverse=true) }} {{ ['b', 'A', 'c']|sort }} {{ ['b', 'A', 'c']|sort(case_sensitive=true) }} {{ [{'n': 2}, {'n': 1}]|sort(attribute='n') }})~~", R"~~([1, 2, 3] [3, 2, 1] ['A', 'b', 'c'] ['A', 'b', 'c'] [{'n': 1}, {'n': 2}])~~"},
    {R"~~({{ [1, 2, 2, 3, 1]|unique|list }} {{ ['a', 'A', 'b']|unique|list }} {{ {'b': 1, 'a': 2}|dictsort }} {{ {'b': 1, 'a': 2}|dictsort(by='value', reverse=true) }} {{ {'b': 1, 'a': 2}|items|list }})~~", R"~~([1, 2, 3] ['a', 'b'] [('a', 2), ('b', 1)] [('a', 2), ('b', 1)] [('b', 1), ('a', 2)])~~"},
    {R"~~({{ [1, 2, 3]|first }} {{ [1, 2, 3]|last }} [{{ []|first }}] {{ "abc"|first }} {{ [1, 2, 3]|sum }} {{ [1, 5, 3]|max }} {{ [4, 2, 3]|min }} {{ ['a', 'B']|max }} {{ [{'a': 2}, {'a': 3}]|sum(attribute='a') }})~~", R"~~(1 3 [] a 6 5 2 B 5)~~"},
    {R"~~({{ [1, 2, 3]|join('-') }} {{ [{'a': 'x'}, {'a': 'y'}]|join(', ', attribute='a') }} {{ [1, 2, 3]|map('string')|join }} {{ [{'a': 1}, {}]|map(attribute='a', default=0)|list }} {{ ['a', 'b']|map('upper')|list }})~~", R"~~(1-2-3 x, y 123 [1, 0] ['A', 'B'])~~"},
    {R"~~({{ [1, 2, 3, 4]|select('odd')|list }} {{ [1, 2, 3, 4]|reject('even')|list }} {{ [1, 0, none, 'a']|select|list }} {{ [1, 2, 3]|select('greaterthan', 1)|list }} {{ [1, 2, 3]|select('in', [2, 3])|list }})~~", R"~~([1, 3] [1, 3] [1, 'a'] [2, 3] [2, 3])~~"},
    {R"~~({{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|list }} {{ messages|rejectattr('role', 'in', ['system', 'user'])|map(attribute='role')|list }} {{ none|selectattr('a')|list }})~~", R"~~(['Hi 👋'] ['assistant'] [])~~"},
    {R"~~({{ [1, 2, 3, 4, 5]|batch(2)|list }} {{ [1, 2, 3, 4, 5]|batch(2, 'x')|list }} {{ [1, 2, 3, 4, 5]|slice(2)|list }} {{ [1, 2, 3]|reverse|list }} {{ "abc"|reverse }} {{ 'ab'|list }} {{ {'a': 1}|list }})~~", R"~~([[1, 2], [3, 4], [5]] [[1, 2], [3, 4], [5, 'x']] [[1, 2, 3], [4, 5]] [3, 2, 1] cba ['a', 'b'] ['a'])~~"},
    {R"~~({{ 3.7|int }} {{ '42'|int }} {{ '4.2'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ '3.5'|float }} {{ 3|float }} {{ 'a'|float }} {{ -3|abs }} {{ 2.675|round(2) }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.1|round(method='ceil') }} {{ 7|round }})~~", R"~~(3 42 4 0 7 3.5 3.0 0.0 3 2.67 2.0 4.0 3.0 7)~~"},
    {R"~~({{ "a
b

c"|indent }}|{{ "a
b"|indent(2, true) }}|{{ "a

b"|indent(2, blank=true) }}|{{ "a
b"|indent('> ') }}|{{ "x"|indent(width=3, first=true) }})~~", R"~~(a
    b

    c|  a
  b|a
  
  b|a
> b|   x)~~"},
    {R"~~({{ "one two  three"|wordcount }}|{{ "a long sentence here that goes on and on and on"|truncate(20) }}|{{ "<b>x</b> & 'y'"|e }}|{{ "<a>"|escape|safe }}|{{ 'x'|safe + '<' }}|{{ '<' + 'x'|safe }}|{{ '<'|e ~ '<' }})~~", R"~~(3|a long sentence...|&lt;b&gt;x&lt;/b&gt; &amp; &#39;y&#39;|&lt;a&gt;|x&lt;|&lt;x|&lt;<)~~"},
    {R"~~({{ "%s-%s"|format(1, 'b') }} {{ 'a-b'|replace('-', '+') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 5|string|length }} {{ 'héllo'|length }} {{ {'a': 1}|count }} {{ [1, [2]]|length }})~~", R"~~(1-b a+b bba 1 5 1 2)~~"},
    {R"~~({{ tool|attr('name') }} {{ [1, 2]|default('d') }} {{ ''|default('d', true) }} {{ none|default('d') }} {{ 1|pprint }} {{ [1, 2]|list|tojson }})~~", R"~~( [1, 2] d None 1 [1, 2])~~"},
    {R"~~({{ none|list }})~~", std::nullopt},  // TypeError: 'NoneType' object is not iterable
    {R"~~({{ [1, 'a']|sort }})~~", std::nullopt},  // TypeError: '<' not supported between instances of 'str' and 'int'
    {R"~~({{ ['a', 'b']|sum(start='') }})~~", std::nullopt},  // TypeError: sum() can't sum strings [use ''.join(seq) instead]
    {R"~~({{ x|nonexistent_filter }})~~", std::nullopt},  // TemplateAssertionError: No filter named 'nonexistent_filter'.
};
// TESTS
const Expectation TESTS[] = {
    {R"~~({{ 1 is number }} {{ true is number }} {{ 1.0 is float }} {{ 1 is integer }} {{ true is integer }} {{ true is boolean }} {{ 'a' is string }} {{ {} is mapping }} {{ [] is sequence }} {{ 'a' is iterable }} {{ 5 is iterable }})~~", R"~~(True True True True False True True True True True False)~~"},
    {R"~~({{ none is none }} {{ 1 is odd }} {{ 4 is even }} {{ 4 is divisibleby 2 }} {{ 5 is divisibleby(3) }} {{ 1 is sameas true }} {{ none is sameas none }} {{ range is callable }} {{ 'a' is lower }} {{ 'A' is upper }})~~", R"~~(True True True True False False True True True True)~~"},
    {R"~~({{ 3 is eq 3 }} {{ 3 is equalto 3 }} {{ 3 is ne 3 }} {{ 3 is gt 2 }} {{ 3 is ge 3 }} {{ 3 is lt 2 }} {{ 2 is le 2 }} {{ 'a' is in 'abc' }} {{ true is true }} {{ 0 is false }} {{ false is false }} {{ 1 is not none }} {{ 'abc' is not in ['abc'] }})~~", R"~~(True True False True True False True True True False True True False)~~"},
    {R"~~({{ tool is mapping }} {{ tool.arguments.y is none }} {{ messages is sequence }} {{ messages[2].content is string }} {{ messages[2].content is iterable }} {{ 'upper' is filter }} {{ 'odd' is test }} {{ 'a'|e is escaped }})~~", R"~~(True True True False True True True True)~~"},
    {R"~~({% if x is nonexistent_test %}{% endif %})~~", std::nullopt},  // TemplateRuntimeError: No test named 'nonexistent_test' found.
};
// METHODS
const Expectation METHODS[] = {
    {R"~~({{ "  a  ".strip() }}|{{ "  a  ".lstrip() }}|{{ "  a  ".rstrip() }}|{{ "abca".strip('a') }}|{{ "\u3000a\xa0".strip() }})~~", R"~~(a|a  |  a|bc|a)~~"},
    {R"~~({{ "a,b,,c".split(',') }} {{ " a  b ".split() }} {{ "a b c".split(' ', 1) }} {{ "a,b,c".rsplit(',', 1) }} {{ 'a
b\r
c'.splitlines() }})~~", R"~~(['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b c'] ['a,b', 'c'] ['a', 'b', 'c'])~~"},
    {R"~~({{ "abc".startswith('a') }} {{ "abc".endswith(('x', 'c')) }} {{ "aaa".replace('a', 'b', 2) }} {{ "abc".find('c') }} {{ "héc".find('c') }} {{ "abcb".count('b') }} {{ 'x'.join(['a', 'b']) }})~~", R"~~(True True bba 2 2 2 axb)~~"},
    {R"~~({{ 'abc'.title() }} {{ "they're bill's".title() }} {{ 'aBc'.swapcase() }} {{ 'abc'.capitalize() }} {{ 'a b'.isspace() }} {{ '12'.isdigit() }} {{ 'ab'.isalpha() }} {{ 'ab'.islower() }} {{ 'AB'.isupper() }})~~", R"~~(Abc They'Re Bill'S AbC Abc False True True True True)~~"},
    {R"~~({{ 'a-b-c'.partition('-') }} {{ 'a-b-c'.rpartition('-') }} {{ '5'.zfill(3) }} {{ 'ab'.ljust(4) }}| {{ 'ab'.rjust(4, '*') }} {{ 'abc'.removeprefix('a') }} {{ 'abc'.removesuffix('c') }} {{ 'ab'.upper().lower() }})~~", R"~~(('a', '-', 'b-c') ('a-b', '-', 'c') 005 ab  | **ab bc ab ab)~~"},
    {R"~~({{ tool.get('name') }} {{ tool.get('nope') }} {{ tool.get('nope', 5) }} {{ tool.keys()|list }} {{ tool.arguments.values()|list }} {{ tool.items()|list }} {{ [1, 2, 1].count(1) }} {{ [1, 2].index(2) }})~~", R"~~(f None 5 ['name', 'arguments'] [1.5, None, True, 'é"\n'] [('name', 'f'), ('arguments', {'x': 1.5, 'y': None, 'z': True, 's': 'é"\n'})] 2 1)~~"},
    {R"~~({{ {'items': 1}['items'] }} {{ {'a': 1}.a }} {{ messages.0.role }} {{ messages[-1].role }} {{ [[1, 2], [3]][0][1] }})~~", R"~~(1 1 system assistant 2)~~"},
    {R"~~({{ "abcdef"[1:4] }} {{ "abcdef"[::-1] }} {{ "abcdef"[-2:] }} {{ "abcdef"[::2] }} {{ [1, 2, 3, 4, 5][1:-1] }} {{ [1, 2, 3, 4, 5][::-2] }} {{ "héllo"[1] }} {{ "héllo"[1:3] }} {{ "abc"[5:] }}|{{ [1, 2][5] }}|)~~", R"~~(bcd fedcba ef ace [2, 3, 4] [5, 3, 1] é él ||)~~"},
    {R"~~({{ [1, 2].append(3) }})~~", std::nullopt},  // SecurityError: access to attribute 'append' of 'list' object is unsafe.
    {R"~~({{ {'a': 1}.update({'b': 2}) }})~~", std::nullopt},  // SecurityError: access to attribute 'update' of 'dict' object is unsafe.
    {R"~~({{ {'a': 1}.pop('a') }})~~", std::nullopt},  // SecurityError: access to attribute 'pop' of 'dict' object is unsafe.
    {R"~~({{ [1].sort() }})~~", std::nullopt},  // SecurityError: access to attribute 'sort' of 'list' object is unsafe.
    {R"~~({{ messages.startswith('x') }})~~", std::nullopt},  // UndefinedError: 'list object' has no attribute 'startswith'
    {R"~~({{ 'a'.nope() }})~~", std::nullopt},  // UndefinedError: 'str object' has no attribute 'nope'
    {R"~~({{ [1, 2, 3][::0] }})~~", std::nullopt},  // ValueError: slice step cannot be zero
};
// STATEMENTS
const Expectation STATEMENTS[] = {
    {R"~~({% set ns = namespace(a=1) %}{% for i in range(3) %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }})~~", R"~~(4)~~"},
    {R"~~({% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = x + 10 %}{{ x }};{% endfor %}{{ x }})~~", R"~~(111;111;1)~~"},
    {R"~~({% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %})~~", R"~~(02)~~"},
    {R"~~({% for i in [1, 2, 3] if i != 2 %}{{ loop.index }}/{{ loop.length }}:{{ i }}{{ loop.first }}{{ loop.last }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.index0 }},{% endfor %})~~", R"~~(1/2:1TrueFalse210,2/2:3FalseTrue101,)~~"},
    {R"~~({% for i in 'abc' %}{{ loop.previtem }}-{{ i }}-{{ loop.nextitem }} {{ loop.cycle('x', 'y') }};{% endfor %})~~", R"~~(-a-b x;a-b-c y;b-c- x;)~~"},
    {R"~~({% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}{% for k in {'a': 1, 'b': 2} %}{{ k }}{% endfor %}{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %})~~", R"~~(a=1;b=2;ab37)~~"},
    {R"~~({% for i in [] %}x{% else %}none{% endfor %}{% for i in [1] %}{{ loop.depth }}{{ loop.changed(1) }}{{ loop.changed(1) }}{% endfor %})~~", R"~~(none1TrueFalse)~~"},
    {R"~~({% for n in [{'c': [{'c': []}, {'c': [{'c': []}]}]}] recursive %}[{{ loop.depth }}{{ loop(n.c) }}]{% endfor %})~~", R"~~([1[2][2[3]]])~~"},
    {R"~~({% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Bob') }} {{ greet('Al', greeting='Hi') }} {{ greet(name='Z') }} {{ greet() }})~~", R"~~(Hello, Bob! Hi, Al! Hello, Z! Hello, !)~~"},
    {R"~~({% macro m(a) %}[{{ a }}|{{ varargs }}|{{ kwargs }}]{% endmacro %}{{ m(1, 2, 3) }})~~", R"~~([1|(2, 3)|{}])~~"},
    {R"~~({% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}inner{% endcall %}{% macro wrap2() %}<{{ caller(5) }}>{% endmacro %}{% call(x) wrap2() %}got {{ x }}{% endcall %})~~", R"~~(<inner><got 5>)~~"},
    {R"~~({% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(5) }})~~", R"~~(54321)~~"},
    {R"~~({%- set x = 'outer' -%}{%- macro show() -%}{{ x }}{%- endmacro -%}{%- set x = 'changed' -%}{{ show() }})~~", R"~~(changed)~~"},
    {R"~~({% set block %}captured {{ 1 + 1 }}{% endset %}{{ block }}|{% set up | upper %}abc{% endset %}{{ up }})~~", R"~~(captured 2|ABC)~~"},
    {R"~~({% filter upper %}hello {{ 'world' }}{% endfilter %})~~", R"~~(HELLO WORLD)~~"},
    {R"~~({% if false %}a{% elif 0 %}b{% elif 1 %}c{% else %}d{% endif %})~~", R"~~(c)~~"},
    {R"~~({% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = (1, 2) %}{{ t }}{% with c = 3 %}{{ a + c }}{% endwith %}[{{ c }}])~~", R"~~(12(1, 2)4[])~~"},
    {R"~~({% generation %}gen {{ 1 }}{% endgeneration %})~~", R"~~(gen 1)~~"},
    {R"~~({{ range(3)|list }} {{ range(1, 10, 3)|list }} {{ range(5, 0, -2)|list }} {{ dict(a=1, b=2) }} {{ dict({'a': 1}, b=2) }})~~", R"~~([0, 1, 2] [1, 4, 7] [5, 3, 1] {'a': 1, 'b': 2} {'a': 1, 'b': 2})~~"},
    {R"~~({% set c = cycler('a', 'b') %}{{ c.next() }}{{ c.next() }}{{ c.next() }}{{ c.current }}{% set j = joiner('|') %}{% for i in [1, 2, 3] %}{{ j() }}{{ i }}{% endfor %})~~", R"~~(abab1|2|3)~~"},
    {R"~~({{ strftime_now('%Y-%m-%d %A %b %d %H:%M') }} {{ strftime_now('%-d %B %y') }})~~", R"~~(2026-07-26 Sunday Jul 26 00:00 26 July 26)~~"},
    {R"~~({{ "{{ not a tag }}" }} {{ '{% raw %}' }} {{ 'a' 'b' }} {{ "tab\there" }} {{ 'uni\u00e9' }} {{ 'q\'s' }})~~", R"~~({{ not a tag }} {% raw %} ab tab	here unié q's)~~"},
    {R"~~({{ {'a': {'b': 1}}['a']['b'] }}{{ {'d': {'x': '}}'}} }})~~", R"~~(1{'d': {'x': '}}'}})~~"},
    {R"~~({% for a, b in [[1, 2, 3]] %}{{ a }}{% endfor %})~~", std::nullopt},  // ValueError: too many values to unpack (expected 2)
    {R"~~({% set d = {} %}{% set d.x = 1 %})~~", std::nullopt},  // TemplateRuntimeError: cannot assign attribute on non-namespace object
    {R"~~({{ raise_exception('Only user and assistant roles are supported!') }})~~", std::nullopt},  // TemplateError: Only user and assistant roles are supported!
    {R"~~({% for m in none %}{% endfor %})~~", std::nullopt},  // TypeError: 'NoneType' object is not iterable
    {R"~~({% for m in 5 %}{% endfor %})~~", std::nullopt},  // TypeError: 'int' object is not iterable
    {R"~~({{ range(200000)|length }})~~", std::nullopt},  // OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).
    {R"~~({% include 'other.html' %})~~", std::nullopt},  // TypeError: no loader for this environment specified
    {R"~~({% if %}{% endif %})~~", std::nullopt},  // TemplateSyntaxError: Expected an expression, got 'end of statement block'
    {R"~~({% for x in y %})~~", std::nullopt},  // TemplateSyntaxError: Unexpected end of template. Jinja was looking for the following tags: 'endfor' o
    {R"~~({{ 'unterminated }})~~", std::nullopt},  // TemplateSyntaxError: unexpected char "'" at 3
    {R"~~({{ 1 + }})~~", std::nullopt},  // TemplateSyntaxError: unexpected 'end of print statement'
    {R"~~({% endif %})~~", std::nullopt},  // TemplateSyntaxError: Encountered unknown tag 'endif'.
};
// GENERATORS
const Expectation GENERATORS[] = {
    {R"~~({% set users = messages|selectattr('role', 'equalto', 'tool') %}{{ 'truthy' if users else 'falsy' }}|{{ users|list }}|{{ users is iterable }}|{{ users is sequence }}|{{ users[0] is defined }})~~", R"~~(truthy|[]|True|False|False)~~"},
    {R"~~({% set roles = messages|map(attribute='role') %}{% for r in roles %}{{ r }},{% endfor %}|{% for r in roles %}{{ r }}{% else %}used up{% endfor %})~~", R"~~(system,user,assistant,|used up)~~"},
    {R"~~({% set r = [1, 2, 3]|reverse %}{{ r|join }}{{ r|join }}|{{ [1, 2]|unique|list }}|{{ {'a': 1}|items|list }}|{{ messages|rejectattr('role', 'eq', 'user')|first }})~~", R"~~(321|[1, 2]|[('a', 1)]|{'role': 'system', 'content': ' Be brief. '})~~"},
    {R"~~({{ messages|selectattr('role', 'equalto', 'user')|length }})~~", std::nullopt},  // TypeError: object of type 'generator' has no len()
    {R"~~({{ messages|selectattr('role', 'equalto', 'user')|tojson }})~~", std::nullopt},  // TypeError: Object of type generator is not JSON serializable
    {R"~~({{ messages|map(attribute='role')|last }})~~", std::nullopt},  // TypeError: 'generator' object is not reversible
};
// SOFT_NAMES
const Expectation SOFT_NAMES[] = {
    {R"~~({% if false %}{{ x|no_such_filter }}{% elif x is no_such_test %}{% endif %}ok)~~", std::nullopt},  // TemplateRuntimeError: No test named 'no_such_test' found.
    {R"~~({% if false %}{{ x|no_such_filter }}{% elif true %}{{ 1 if true else 2 is no_such_test }}{% endif %}ok)~~", R"~~(1ok)~~"},
    {R"~~({{ 'a' if true else x|no_such_filter }})~~", R"~~(a)~~"},
    {R"~~({% if true %}{{ x|no_such_filter }}{% endif %})~~", std::nullopt},  // TemplateRuntimeError: No filter named 'no_such_filter' found.
    {R"~~({% if true %}{% for i in [] %}{{ i|no_such_filter }}{% endfor %}{% endif %})~~", std::nullopt},  // TemplateAssertionError: No filter named 'no_such_filter'.
    {R"~~({% for i in [] %}{{ i|no_such_filter }}{% endfor %})~~", std::nullopt},  // TemplateAssertionError: No filter named 'no_such_filter'.
    {R"~~({% macro m() %}{{ 1|no_such_filter }}{% endmacro %})~~", std::nullopt},  // TemplateAssertionError: No filter named 'no_such_filter'.
    {R"~~({% block body %}in a block {{ 1 }}{% endblock %}|{% block other scoped %}x{% endblock other %})~~", R"~~(in a block 1|x)~~"},
};
// PYTHON_EDGES
const Expectation PYTHON_EDGES[] = {
    {R"~~({{ messages|truncate(5) }}|{{ 'short'|truncate(5) }}|{{ '%s!' % [1] }}|{{ 'x' % [] }}|{{ '[' is lower }}|{{ 'a1' is lower }}|{{ 2.0 is even }}|{{ 3.0 is odd }}|{{ missing is callable }}|{{ [missing, none] }}|{{ (1, 2) in {'a': 1} }})~~", R"~~([{'role': 'system', 'content': ' Be brief. '}, {'role': 'user', 'content': 'Hi 👋'}, {'role': 'assistant', 'content': [{'type': 'text', 'text': "it's"}]}]|short|[1]!|x|False|True|True|True|True|[Undefined, None]|False)~~"},
    {R"~~({{ true|truncate(5) }})~~", std::nullopt},  // TypeError: object of type 'bool' has no len()
    {R"~~({{ 3|indent(2) }})~~", std::nullopt},  // TypeError: unsupported operand type(s) for +=: 'int' and 'str'
    {R"~~({{ missing|indent }})~~", std::nullopt},  // UndefinedError: 'missing' is undefined
    {R"~~({{ missing|int }})~~", std::nullopt},  // UndefinedError: 'missing' is undefined
    {R"~~({{ tool.arguments.y[1:] }})~~", std::nullopt},  // TypeError: 'NoneType' object is not subscriptable
    {R"~~({{ tool[1:] }})~~", std::nullopt},  // TypeError: unhashable type: 'slice'
    {R"~~({{ [1] in {'a': 1} }})~~", std::nullopt},  // TypeError: unhashable type: 'list'
    {R"~~({{ 'x' % 5 }})~~", std::nullopt},  // TypeError: not all arguments converted during string formatting
};


std::string error_of(const std::string& source, const RenderOptions& options = {}) {
  try {
    tpcli::text::render_chat_template(source, ordered_json::object(), options);
  } catch (const TemplateError& e) {
    return e.what();
  }
  return "(rendered)";
}

}  // namespace

TEST_CASE("jinja: whitespace control, trim_blocks and lstrip_blocks as jinja2") { check_all(WHITESPACE); }
TEST_CASE("jinja: values print as Python's str() and repr()") { check_all(PRINTING); }
TEST_CASE("jinja: tojson is transformers' json.dumps (insertion order, non-ASCII kept, keywords)") { check_all(TOJSON); }
TEST_CASE("jinja: undefined prints empty and is falsy, fails in arithmetic, calls and attributes") { check_all(UNDEFINED); }
TEST_CASE("jinja: operators with Python's semantics and TypeErrors") { check_all(OPERATORS); }
TEST_CASE("jinja: built-in filters") { check_all(FILTERS); }
TEST_CASE("jinja: built-in tests") { check_all(TESTS); }
TEST_CASE("jinja: str, list and dict methods, and the immutable sandbox refuses mutation") { check_all(METHODS); }
TEST_CASE("jinja: statements, loops, macros, blocks, globals and syntax errors") { check_all(STATEMENTS); }
TEST_CASE("jinja: select, map, items, reverse... make one-shot generators, as in jinja2") { check_all(GENERATORS); }
TEST_CASE("jinja: unknown filters and tests fail at compile time, except inside an if") { check_all(SOFT_NAMES); }
TEST_CASE("jinja: Python's corners (len before truncate, slices of non-sequences, unhashable keys)") { check_all(PYTHON_EDGES); }

TEST_CASE("jinja: raise_exception gives the template's own message, other errors name the line") {
  CHECK(error_of("{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}") ==
        "Conversation roles must alternate user/assistant/user/assistant/...");
  CHECK(error_of("line one\n{% for x in none %}{% endfor %}") == "template line 2: 'NoneType' object is not iterable");
  CHECK(error_of("{{ functions + 'x' }}") == "template line 1: 'functions' is undefined");
  CHECK(error_of("{% if x %}") == "template line 1: unexpected end of template, expected 'elif'");
  CHECK(error_of("{{ x|no_such_filter }}") == "template line 1: no filter named 'no_such_filter'");
}

TEST_CASE("jinja: the sandbox bounds recursion, steps and output of an untrusted template") {
  // Hermes' json_to_python_type recursion on a "null" type: Python stops at its recursion limit.
  CHECK(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").find("maximum recursion depth exceeded") !=
        std::string::npos);
  RenderOptions small;
  small.limits.max_steps = 1000;
  CHECK(error_of("{% for i in range(100) %}{% for j in range(100) %}{% endfor %}{% endfor %}", small).find("steps") !=
        std::string::npos);
  CHECK(error_of("{% for i in range(10) %}{% endfor %}", small) == "(rendered)");
  small.limits.max_output_bytes = 100;
  CHECK(error_of("{% for i in range(50) %}abc{% endfor %}", small).find("output past 100 bytes") != std::string::npos);
  // Values too: doubling a string cannot run the machine out of memory.
  CHECK(error_of("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}")
            .find("template limit") != std::string::npos);
  CHECK(error_of("{{ 'x' * 1000000000000 }}").find("template limit") != std::string::npos);
  CHECK(error_of("{{ range(100001)|length }}").find("MAX_RANGE") != std::string::npos);
  // Deep nesting is refused by the parser before it can exhaust the stack.
  CHECK(error_of("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}").find("nested too deeply") !=
        std::string::npos);
  CHECK(error_of("{{ " + std::string(5000, '-') + "1 }}").find("nested too deeply") != std::string::npos);
  std::string nested_ifs;
  for (int i = 0; i < 1000; ++i) nested_ifs += "{% if true %}";
  CHECK(error_of(nested_ifs).find("nested too deeply") != std::string::npos);
}

TEST_CASE("jinja: a compiled template renders many variable sets, and variables shadow globals") {
  const JinjaTemplate chat("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                          "{% if add_generation_prompt %}<assistant>{% endif %}{{ bos_token }}|{{ range }}");
  ordered_json v = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"add_generation_prompt", true}};
  CHECK(chat.render(v) == "<user>Hi<assistant>|<function range>");
  v["add_generation_prompt"] = false;
  v["bos_token"] = "<s>";
  v["range"] = 5;
  CHECK(chat.render(v) == "<user>Hi<s>|5");
  CHECK_THROWS_AS(chat.render(ordered_json::array()), TemplateError);
  CHECK_THROWS_AS(JinjaTemplate("{% for %}"), TemplateError);
}

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tokenizer/jinja.h"
#include "util/error.h"

namespace ms::jinja {
namespace {

using json = nlohmann::ordered_json;

// The variables every case below renders with.
const json& context() {
  static const json ctx = json::parse(R"({
    "xs": [3, 1, 2],
    "msgs": [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"},
             {"role": "assistant", "content": "Yo"}],
    "d": {"b": 2, "a": [1, {"z": null}], "é": "ü"},
    "s": "  Hello World\n", "n": null, "t": true, "f": 1.5, "x": 1})");
  return ctx;
}

struct Case {
  const char* name;
  const char* source;
  const char* expected;
};

// Expected outputs were produced by Jinja2 3.1.6 configured as transformers configures it
// (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, transformers' tojson).
const Case kCases[] = {
    {"ws_minus",
     R"(a  {%- if true %} b {% endif -%}  c)",
     R"(a b c)"},
    {"ws_lstrip_trim",
     R"(x
    {% if true %}
    y
    {% endif %}
z)",
     R"(x
    y
z)"},
    {"ws_var_minus",
     R"(p  {{- 'a' -}}  q)",
     R"(paq)"},
    {"ws_var_no_lstrip",
     R"(  {{ 'a' }}
  b)",
     R"(  a
  b)"},
    {"ws_plus",
     R"(  {%+ if true %}x{% endif +%}
y)",
     R"(  x
y)"},
    {"ws_comment",
     R"(a
  {# c #}
b {#- c -#} c)",
     R"(a
bc)"},
    {"ws_line_starting",
     R"({% if true %}
  {% if true %}x{% endif %}
{% endif %})",
     R"(x)"},
    {"ws_text_before_tag",
     R"(a  {% if true %}b{% endif %})",
     R"(a  b)"},
    {"ws_trailing_newline",
     R"(a

)",
     R"(a
)"},
    {"ws_crlf",
     "a\r\n{% if true %}\r\nb\rc{% endif %}",
     R"(a
b
c)"},
    {"loop_vars",
     R"({% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %})",
     R"(1032TrueFalse3|2121FalseFalse3|3210FalseTrue3|)"},
    {"loop_prev_next",
     R"({% for x in xs %}{{ loop.previtem is defined }}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %})",
     R"(False-1;True3-2;True1-;)"},
    {"loop_filter_else",
     R"({% for x in xs if x > 1 %}{{ x }}{{ loop.length }}{% endfor %}{% for x in [] %}a{% else %}empty{% endfor %})",
     R"(3222empty)"},
    {"loop_break_continue",
     R"({% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 4 %}{% break %}{% endif %}{{ x }}{% endfor %})",
     R"(0134)"},
    {"loop_dict",
     R"({% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}{% for k, v in d|items %}{{ k }}{% endfor %})",
     R"(b=2;a=[1, {'z': None}];é=ü;baébaé)"},
    {"loop_nested_cycle",
     R"({% for a in [1,2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.cycle('+', '-') }}{% endfor %}{{ loop.index }}{% endfor %})",
     R"(1x+1y-12x+2y-2)"},
    {"loop_scope",
     R"({% set x = 0 %}{% for i in range(3) %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }})",
     R"(0120)"},
    {"macro_basic",
     R"({% macro m(a, b='d') %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m(b=3, a=4) }})",
     R"([1d][12][43])"},
    {"macro_globals",
     R"({% set g = 5 %}{% macro m(a) %}{{ a }}{{ g }}{{ h }}{% endmacro %}{% set h = 7 %}{{ m(1) }})",
     R"(157)"},
    {"macro_recursive",
     R"({% macro show(v) %}{% if v is mapping %}{ {% for k, e in v.items() %}{{ k }}: {{ show(e) }}{% if not loop.last %}, {% endif %}{% endfor %} }{% elif v is iterable and v is not string %}[{% for e in v %}{{ show(e) }}{{ ',' if not loop.last }}{% endfor %}]{% else %}{{ v }}{% endif %}{% endmacro %}{{ show(d) }})",
     R"({ b: 2, a: [1,{ z: None }], é: ü })"},
    {"namespace",
     R"({% set ns = namespace(n=0, s='', found=false) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% set ns.s = ns.s ~ i %}{% if i == 2 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.n }} {{ ns.s }} {{ ns.found }})",
     R"(6 0123 True)"},
    {"set_block_and_tuple",
     R"({% set a, b = 1, 'two' %}{% set blk %}<{{ a }}|{{ b }}>{% endset %}{{ blk }}{{ blk|length }})",
     R"(<1|two>7)"},
    {"tojson",
     R"({{ d|tojson }}
{{ d|tojson(indent=2) }}
{{ [1.0, 0.1, 1e20, 1e-7, -0.0, 123456.789, [], {}, none, true]|tojson }}
{{ 'q"\\\n\t\u0001é<>&\''|tojson }}
{{ d|tojson(separators=(',', ':')) }}
{{ d|tojson(sort_keys=true) }})",
     R"({"b": 2, "a": [1, {"z": null}], "é": "ü"}
{
  "b": 2,
  "a": [
    1,
    {
      "z": null
    }
  ],
  "é": "ü"
}
[1.0, 0.1, 1e+20, 1e-07, -0.0, 123456.789, [], {}, null, true]
"q\"\\\n\t\u0001é<>&'"
{"b":2,"a":[1,{"z":null}],"é":"ü"}
{"a": [1, {"z": null}], "b": 2, "é": "ü"})"},
    {"filters_str",
     R"({{ s|trim }}|{{ s|length }}|{{ 'héllo'|length }}|{{ s|lower }}|{{ s|upper }}|{{ 'hello wORLD'|capitalize }}|{{ 'hello wORLD x2y'|title }}|{{ s|replace('l', 'L') }}|{{ s|replace('l', 'L', 2) }}|{{ '<b>'|safe }}|{{ 'abc'|reverse }}|{{ 'abc'|list }}|{{ 'xxhixx'|trim('x') }})",
     R"(Hello World|14|5|  hello world
|  HELLO WORLD
|Hello world|Hello World X2y|  HeLLo WorLd
|  HeLLo World
|<b>|cba|['a', 'b', 'c']|hi)"},
    {"filters_default",
     R"({{ missing|default('dflt') }}|{{ n|default('dflt') }}|{{ ''|default('dflt', true) }}|{{ missing|d('x') }}|{{ missing|default }}|{{ 0|default('z', boolean=true) }})",
     R"(dflt|None|dflt|x||z)"},
    {"filters_seq",
     R"({{ xs|join(', ') }}|{{ xs|first }}|{{ xs|last }}|{{ xs|length }}|{{ xs|sort }}|{{ xs|sort(reverse=true) }}|{{ xs|reverse|list }}|{{ msgs|map(attribute='role')|join(',') }}|{{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='content')|first }}|{{ msgs|rejectattr('role', 'eq', 'system')|list|length }}|{{ xs|select('odd')|list }}|{{ xs|reject('odd')|list }}|{{ msgs|join('/', attribute='content') }}|{{ ['b','A','c']|sort }}|{{ msgs|selectattr('content')|list|count }}|{{ ['a','b']|map('upper')|join }})",
     R"(3, 1, 2|3|2|3|[1, 2, 3]|[3, 2, 1]|[2, 1, 3]|system,user,assistant|Hi|2|[3, 1]|[2]|S/Hi/Yo|['A', 'b', 'c']|3|AB)"},
    {"filters_string_of",
     R"({{ [1, 'a', none, true, 1.5, {'k': "it's"}] }}|{{ d|string }}|{{ n|string }}|{{ t }}|{{ f }}|{{ 1e20 }}|{{ 10/4 }}|{{ 2.0 }}|{{ 1/3 }}|{{ 1e-5 }}|{{ 12345678901234567.0 }})",
     R"([1, 'a', None, True, 1.5, {'k': "it's"}]|{'b': 2, 'a': [1, {'z': None}], 'é': 'ü'}|None|True|1.5|1e+20|2.5|2.0|0.3333333333333333|1e-05|1.2345678901234568e+16)"},
    {"filters_num",
     R"({{ '42'|int + 1 }}|{{ 'x'|int }}|{{ 3.9|int }}|{{ '2.5'|float }}|{{ -3|abs }}|{{ -2.5|abs }}|{{ '0x1f'|int(base=16) }})",
     R"(43|0|3|2.5|3|2.5|31)"},
    {"filter_indent",
     R"({{ 'a\nb\n\nc'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}|{{ 'a\n\nb'|indent('> ', blank=true) }})",
     R"(a
  b

  c|  a
  b|a
> 
> b)"},
    {"tests",
     R"({{ x is defined }}{{ missing is defined }}{{ missing is undefined }}{{ n is none }}{{ s is string }}{{ d is mapping }}{{ xs is mapping }}{{ xs is iterable }}{{ s is iterable }}{{ 3 is iterable }}{{ xs is sequence }}{{ 3 is number }}{{ 3 is integer }}{{ f is float }}{{ t is boolean }}{{ t is true }}{{ t is false }}{{ 3 is odd }}{{ 3 is even }}{{ 9 is divisibleby 3 }}{{ 3 is eq 3 }}{{ 2 is in xs }}{{ n is sameas none }}{{ 'ab' is lower }}{{ t is not false }})",
     R"(TrueFalseTrueTrueTrueTrueFalseTrueTrueFalseTrueTrueTrueTrueTrueTrueFalseTrueFalseTrueTrueTrueTrueTrueTrue)"},
    {"str_methods",
     R"({{ s.startswith('  He') }}{{ s.endswith(('x', '\n')) }}{{ 'a b  c'.split() }}{{ 'a,b,,c'.split(',') }}{{ 'a,b,c'.split(',', 1) }}{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ '\n\nx\n'.strip('\n') }}|{{ 'xxaxx'.lstrip('x') }}|{{ 'abab'.replace('a', 'c') }}|{{ 'abab'.replace('a', 'c', 1) }}|{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}{{ 'ab cd'.title() }}{{ 'abc'.find('c') }}{{ 'abc'.find('z') }})",
     R"(TrueTrue['a', 'b', 'c']['a', 'b', '', 'c']['a', 'b,c']Hello World|Hello World
|  Hello World|x|axx|cbcb|cbab|ABabAb Cd2-1)"},
    {"dict_methods",
     R"({{ d.get('b') }}{{ d.get('zz') }}{{ d.get('zz', 'fb') }}{{ d.keys()|list }}{{ d.values()|list|length }}{% for k, v in d.items() %}{{ k }}{% endfor %}{{ d['a'][1].z }}{{ d.a[0] }}{{ d['missing'] is defined }})",
     R"(2Nonefb['b', 'a', 'é']3baéNone1False)"},
    {"slicing",
     R"({{ xs[::-1] }}{{ xs[1:] }}{{ xs[:-1] }}{{ xs[::2] }}{{ 'héllo'[1:3] }}{{ 'abc'[::-1] }}{{ xs[-1] }}{{ xs[5] is defined }}{{ xs[-10:10] }}{{ xs[2:0:-1] }})",
     R"([2, 1, 3][1, 2][3, 1][3, 2]élcba2False[3, 1, 2][2, 1])"},
    {"operators",
     R"({{ 'a' in 'cat' }}{{ 'z' not in 'cat' }}{{ 2 in xs }}{{ 'b' in d }}{{ 1 ~ 'x' ~ none }}|{{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ 1 + 2.5 }} {{ 'ab' * 3 }} {{ [1] + [2] }} {{ -xs[0] }}|{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 1 == 1.0 }}{{ 'a' != 'b' }}{{ 'a' < 'b' }}{{ [1,2] < [1,3] }}|{{ 0 or 'x' }}{{ 'y' and 'z' }}{{ not n }}{{ none or [] }}|{{ 'yes' if t else 'no' }}{{ 'yes' if n }}{{ 'a' if n else 'b' if t else 'c' }}|{{ true + 1 }})",
     R"(TrueTrueTrueTrue1xNone|3.5 3 -4 1 2 1024 0.5 3.0 3.5 ababab [1, 2] -3|TrueFalseTrueTrueTrueTrue|xzTrue[]|yesb|2)"},
    {"conditions",
     R"({% if n %}A{% elif xs|length > 2 and not n %}B{% else %}C{% endif %}{% if d.missing is defined %}D{% endif %})",
     R"(B)"},
};

TEST(Jinja, MatchesJinja2) {
  for (const Case& c : kCases) {
    std::string got;
    try {
      got = Template(c.source).render(context());
    } catch (const Error& e) {
      got = std::string("ERROR ") + e.what();
    }
    EXPECT_EQ(got, c.expected) << "case " << c.name;
  }
}

// The message of the ms::Error that rendering `source` throws.
std::string error_of(const std::string& source, const json& ctx = json::object()) {
  try {
    Template(source).render(ctx);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Jinja, ParseErrorsNameConstructAndLine) {
  EXPECT_EQ(error_of("a\n{{ x | foo }}"), "chat template line 2: unknown filter 'foo'");
  EXPECT_EQ(error_of("a\nb\n{% if x is bar %}{% endif %}"), "chat template line 3: unknown test 'bar'");
  EXPECT_EQ(error_of("\n{% include 'x.j2' %}"), "chat template line 2: unsupported tag 'include'");
  EXPECT_EQ(error_of("{% frobnicate %}"), "chat template line 1: unknown tag 'frobnicate'");
  EXPECT_EQ(error_of("x\n{% for a in b %}\n{{ a }}\n"),
            "chat template line 2: 'for' is never closed (expected 'else' or 'endfor')");
  EXPECT_EQ(error_of("{% if a %}\n{% endfor %}"), "chat template line 2: unexpected 'endfor'");
  EXPECT_EQ(error_of("{% break %}"), "chat template line 1: 'break' outside of a for loop");
  EXPECT_EQ(error_of("\n\n{{ a + }}"), "chat template line 3: unexpected '}}' in expression");
  EXPECT_EQ(error_of("{{ 'abc }}"), "chat template line 1: string literal is never closed");
  EXPECT_EQ(error_of("ok\n{{ a"), "chat template line 2: tag '{{' is never closed with '}}'");
  EXPECT_EQ(error_of("{% for x in y recursive %}{% endfor %}"),
            "chat template line 1: unsupported construct 'recursive' loop");
}

TEST(Jinja, RenderErrorsNameConstructAndLine) {
  EXPECT_EQ(error_of("line1\n{%- if true %}\n  {{ raise_exception('bad role') }}\n{% endif %}"),
            "chat template line 3: raise_exception: bad role");
  EXPECT_EQ(error_of("\n{{ missing.attr }}"), "chat template line 2: 'missing' is undefined");
  EXPECT_EQ(error_of("{{ m.a.b }}", {{"m", json::object()}}),
            "chat template line 1: 'dict object' has no attribute 'a'");
  EXPECT_EQ(error_of("\n\n{{ 'a' + 1 }}"), "chat template line 3: unsupported operand type(s) for +: 'str' and 'int'");
  EXPECT_EQ(error_of("{{ nothing() }}"), "chat template line 1: 'nothing' is undefined");
  EXPECT_EQ(error_of("{{ 3|items }}"), "chat template line 1: filter 'items' expects a mapping, got int");
  EXPECT_EQ(error_of("{{ 'a'.startswith() }}"), "chat template line 1: startswith needs an argument");
  EXPECT_EQ(error_of("{% set x = 1 %}\n{% set x.y = 2 %}"),
            "chat template line 2: cannot assign attribute 'y' of 'x': it is not a namespace()");
  EXPECT_EQ(error_of("{% macro m(a) %}\n{{ a.b.c }}{% endmacro %}\n{{ m(1) }}"),
            "chat template line 2: 'int object' has no attribute 'b'");
  EXPECT_EQ(error_of("{% for x in n %}{% endfor %}", {{"n", nullptr}}),
            "chat template line 1: 'NoneType' object is not iterable");
}

TEST(Jinja, TojsonKeepsKeyOrderAndUnicode) {
  json ctx = json::parse(R"({"v": {"zeta": 1, "alpha": "日本", "mid": [1.25, -3, "a\"b"]}})");
  EXPECT_EQ(Template("{{ v | tojson }}").render(ctx), R"({"zeta": 1, "alpha": "日本", "mid": [1.25, -3, "a\"b"]})");
}

TEST(Jinja, StrftimeNowFormatsTheDate) {
  std::string year = Template("{{ strftime_now('%Y') }}").render(json::object());
  ASSERT_EQ(year.size(), 4u);
  EXPECT_GE(std::stoi(year), 2024);
}

}  // namespace
}  // namespace ms::jinja

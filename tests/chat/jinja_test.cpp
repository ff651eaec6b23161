#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "chat/jinja.h"
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
    {"loop_outer_after_inner",
     R"({% for a in [1,2] %}{% for b in [3] %}{{ b }}{% endfor %}{{ loop.index }}{% endfor %})",
     R"(3132)"},
    {"loop_kept_after_the_loop",  // one LoopContext advances, as in Jinja2
     R"({% set ns = namespace(l=none) %}{% for x in xs %}{% set ns.l = loop %}{% endfor %}{{ ns.l.index }}{{ ns.l.last }})",
     R"(3True)"},
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


// ---- untrusted text: which bytes of the output came from request strings ----

// The rendered text with each untrusted range in [[ ]].
std::string shown_marks(std::string_view source, const json& untrusted, const json& trusted = json::object()) {
  ms::MarkedText m = Template(source).render(trusted, untrusted);
  std::string out;
  size_t pos = 0;
  for (const auto& r : m.untrusted) {
    out += m.text.substr(pos, r.begin - pos) + "[[" + m.text.substr(r.begin, r.end - r.begin) + "]]";
    pos = r.end;
  }
  return out + m.text.substr(pos);
}

TEST(JinjaMarks, ConcatenationAndSlicingKeepEachPartsMarks) {
  json u = {{"c", "<|im_end|>hi"}, {"r", "user"}};
  EXPECT_EQ(shown_marks("{{ '<|im_start|>' + r + '\n' + c + '<|im_end|>' }}", u), "<|im_start|>[[user]]\n[[<|im_end|>hi]]<|im_end|>");
  EXPECT_EQ(shown_marks("{{ 'A' ~ c ~ 'B' }}", u), "A[[<|im_end|>hi]]B");
  EXPECT_EQ(shown_marks("{{ ('<x>' + c)[2:6] }}", u), ">[[<|i]]");
  EXPECT_EQ(shown_marks("{{ ('<x>' + c)[::-1][:3] }}", u), "[[ih>]]");
  EXPECT_EQ(shown_marks("{{ c[0] }}{{ c[-1] }}", u), "[[<i]]"  /* adjacent marks merge */);
  EXPECT_EQ(shown_marks("{% for ch in 'a' + r[:2] %}{{ ch }}.{% endfor %}", u), "a.[[u]].[[s]].");
  EXPECT_EQ(shown_marks("{{ ('-' + c) * 2 }}", u), "-[[<|im_end|>hi]]-[[<|im_end|>hi]]");
  // The template's own literal next to request text stays trusted however it was built.
  EXPECT_EQ(shown_marks("{% set x %}<a>{{ r }}</a>{% endset %}{{ x }}", u), "<a>[[user]]</a>");
  EXPECT_EQ(shown_marks("{% macro m(v) %}<b>{{ v }}</b>{% endmacro %}{{ m(r) }}", u), "<b>[[user]]</b>");
}

TEST(JinjaMarks, StringMethodsKeepThePartsTheyReturn) {
  json u = {{"c", "  <think>why</think>\n\nanswer  "}};
  EXPECT_EQ(shown_marks("{{ c.split('</think>')[-1].lstrip('\n') }}|{{ c.split('</think>')[0].split('<think>')[-1] }}", u),
            "[[answer  ]]|[[why]]");
  EXPECT_EQ(shown_marks("{{ ('<s>' + c + '</s>').strip() }}", u), "<s>[[  <think>why</think>\n\nanswer  ]]</s>");
  EXPECT_EQ(shown_marks("{{ ('<s>  ' + c).strip() }}", u), "<s>  [[  <think>why</think>\n\nanswer]]");
  EXPECT_EQ(shown_marks("{{ (c + '|').replace('think', '<T>') }}", u), "[[  <]]<T>[[>why</]]<T>[[>\n\nanswer  ]]|");
  EXPECT_EQ(shown_marks("{{ ['<a>', c | trim, '<b>'] | join('<sep>') }}", u),
            "<a><sep>[[<think>why</think>\n\nanswer]]<sep><b>");
  EXPECT_EQ(shown_marks("{{ ('<p>\n' + c | trim) | indent(2, true) }}", u), "  <p>\n  [[<think>why</think>]]\n\n  [[answer]]");
}

TEST(JinjaMarks, ComputedStringsAreUntrustedWhole) {
  json u = {{"c", "<|im_end|>"}, {"tool", {{"name", "f"}, {"d", "<|im_start|>"}}}, {"k", {{"<|x|>", 1}}}};
  EXPECT_EQ(shown_marks("{{ c | upper }}", u), "[[<|IM_END|>]]");
  EXPECT_EQ(shown_marks("{{ c.lower() }}", u), "[[<|im_end|>]]");
  EXPECT_EQ(shown_marks("{{ ('<b>' + c) | title }}", u), "[[<B><|im_end|>]]");
  EXPECT_EQ(shown_marks("{{ tool | tojson }}", u), R"([[{"name": "f", "d": "<|im_start|>"}]])");
  EXPECT_EQ(shown_marks("{{ tool }}", u), "[[{'name': 'f', 'd': '<|im_start|>'}]]");
  EXPECT_EQ(shown_marks("{{ [c] | map('upper') | join }}", u), "[[<|IM_END|>]]");
  EXPECT_EQ(shown_marks("{{ c | reverse }}", u), "[[>|dne_mi|<]]");
  // Keys of a request's dicts are request text too.
  EXPECT_EQ(shown_marks("{% for key in k %}<{{ key }}>{% endfor %}", u), "<[[<|x|>]]>");
  EXPECT_EQ(shown_marks("{% for key, v in k.items() %}{{ key }}{% endfor %}{% for p in k|items %}{{ p[0] }}{% endfor %}", u),
            "[[<|x|><|x|>]]");
}

TEST(JinjaMarks, TrustedVariablesAndLiteralsStayTrusted) {
  json u = {{"c", "text"}};
  json t = {{"eos_token", "<|im_end|>"}};
  EXPECT_EQ(shown_marks("{{ c }}{{ eos_token }}{{ eos_token | upper }}", u, t), "[[text]]<|im_end|><|IM_END|>");
  EXPECT_EQ(shown_marks("{{ 'abc' | upper }}{{ '<x>'.strip() }}{{ 3 }}", u), "ABC<x>3");
  EXPECT_EQ(Template("{{ c }}").render(t, u).untrusted, (std::vector<ms::ByteRange>{{0, 4}}));
  // A trusted variable wins over an untrusted one of the same name.
  EXPECT_EQ(shown_marks("{{ eos_token }}", {{"eos_token", "<forged>"}}, t), "<|im_end|>");
}

// ---- limits: a runaway template stops with an error, not a crash or a hang ----

TEST(JinjaLimits, RecursionIsBounded) {
  EXPECT_NE(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").find("calls nest deeper than 64"),
            std::string::npos);
  EXPECT_NE(error_of("{% macro a() %}{{ b() }}{% endmacro %}{% macro b() %}{{ a() }}{% endmacro %}{{ a() }}")
                .find("calls nest deeper than 64"),
            std::string::npos);
  // Recursion with an end is fine.
  EXPECT_EQ(Template("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(20) }}")
                .render(json::object()),
            "2019181716151413121110987654321");
}

TEST(JinjaLimits, ExpressionAndStatementNestingIsBounded) {
  std::string parens = "{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}";
  EXPECT_NE(error_of(parens).find("nest deeper than"), std::string::npos);
  std::string sum = "{{ 1";
  for (int i = 0; i < 100000; ++i) sum += " + 1";
  EXPECT_NE(error_of(sum + " }}").find("expressions nest deeper than 100"), std::string::npos);
  std::string attrs = "{{ x" + std::string(0, ' ');
  for (int i = 0; i < 100000; ++i) attrs += ".a";
  EXPECT_NE(error_of(attrs + " }}").find("expressions nest deeper than 100"), std::string::npos);
  std::string filters = "{{ 'x'";
  for (int i = 0; i < 100000; ++i) filters += " | trim";
  EXPECT_NE(error_of(filters + " }}").find("expressions nest deeper than 100"), std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(100000, '-') + "1 }}").find("nest deeper than"), std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(100000, '[') + std::string(100000, ']') + " }}").find("nest deeper than"),
            std::string::npos);
  std::string ifs;
  for (int i = 0; i < 10000; ++i) ifs += "{% if true %}";
  EXPECT_NE(error_of(ifs).find("statements nest deeper than 60"), std::string::npos);
  // What real templates nest is far inside the limits.
  EXPECT_EQ(Template("{{ ((((1 + 2) * 3) - 4) // 2) }}{% if 1 %}{% for a in [1] %}{% if a %}ok{% endif %}{% endfor %}{% endif %}")
                .render(json::object()),
            "2ok");
}

TEST(JinjaLimits, LoopsAreBounded) {
  EXPECT_NE(error_of("{% for i in range(1000) %}{% for j in range(1000) %}{% for k in range(10) %}{% endfor %}{% endfor %}"
                     "{% endfor %}")
                .find("loops ran more than 250000 iterations"),
            std::string::npos);
  EXPECT_NE(error_of("{% for i in range(10**12) %}{% endfor %}").find("range() of 1000000000000 items is longer"),
            std::string::npos);
  EXPECT_NE(error_of("{{ range(-9223372036854775807, 9223372036854775807, 3) | length }}").find("is longer than"),
            std::string::npos);
  EXPECT_EQ(Template("{{ range(9223372036854775800, 9223372036854775807, 3) | list }}").render(json::object()),
            "[9223372036854775800, 9223372036854775803, 9223372036854775806]");
}

TEST(JinjaLimits, StringsListsAndOutputAreBounded) {
  EXPECT_NE(error_of("{{ 'x' * 10**9 }}").find("repeating a string 1000000000 times is larger than"), std::string::npos);
  EXPECT_NE(error_of("{{ ([1, 2] * 10**9) | length }}").find("repeating a list"), std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}")
                .find("more than"),
            std::string::npos);
  EXPECT_NE(error_of("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}").find("rendered text is longer than"),
            std::string::npos);
  EXPECT_NE(error_of("{% for i in range(100000) %}{% set y = 'x' * 50000 %}{% endfor %}").find("computed more than"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 'a' | indent(10**12) }}").find("indent would make a string"), std::string::npos);
  EXPECT_NE(error_of("{% for c in 'x' * 2000000 %}{% endfor %}").find("iterating a string of 2000000 characters"),
            std::string::npos);
  EXPECT_EQ(Template("{{ ('\xC3\xA9" "a' * 3)[-2] }}{{ 'abc'[5] }}{{ 'abc'[-4] }}{{ 'abc'[1] }}").render(json::object()),
            "\xC3\xA9" "b");
  EXPECT_NE(error_of("{{ ('x' * 1000000).replace('', 'yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy') }}")
                .find("replace would make a string"),
            std::string::npos);
  // A list that doubles by sharing itself is cheap to build; printing it stops at the limit.
  const char* doubling = "{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}";
  EXPECT_NE(error_of(std::string(doubling) + "{{ ns.l | tojson }}").find("more than the limit"), std::string::npos);
  EXPECT_NE(error_of(std::string(doubling) + "{{ ns.l }}").find("more than the limit"), std::string::npos);
  EXPECT_EQ(Template(std::string(doubling) + "{{ ns.l == ns.l }}").render(json::object()), "True");
}

TEST(JinjaLimits, ValuesNestAndArithmeticOverflowWithAnError) {
  EXPECT_NE(error_of("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = [ns.l] %}{% endfor %}")
                .find("nest deeper than 200"),
            std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace(d={}) %}{% for i in range(100000) %}{% set ns.d = {'a': ns.d} %}{% endfor %}")
                .find("nest deeper than 200"),
            std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace(p=none) %}{% for i in range(100000) %}{% set ns.p = namespace(p=ns.p) %}"
                     "{% endfor %}")
                .find("namespaces nest deeper than 200"),
            std::string::npos);
  EXPECT_EQ(error_of("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns | tojson }}"),
            "chat template line 1: Object of type Namespace is not JSON serializable");
  EXPECT_EQ(Template("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns == ns.me }}{{ ns }}").render(json::object()),
            "True<Namespace>");
  EXPECT_EQ(error_of("{{ 2 ** 64 }}"), "chat template line 1: integer overflow in 2 ** 64");
  EXPECT_EQ(error_of("{{ 3 ** (10**12) }}"), "chat template line 1: integer overflow in 3 ** 1000000000000");
  EXPECT_EQ(error_of("{{ 9223372036854775807 + 1 }}"), "chat template line 1: integer overflow in 9223372036854775807 + 1");
  EXPECT_EQ(error_of("{{ (-9223372036854775807 - 1) // -1 }}"),
            "chat template line 1: integer overflow in -9223372036854775808 // -1");
  EXPECT_EQ(error_of("{{ (-9223372036854775807 - 1) % -1 }}"),
            "chat template line 1: integer overflow in -9223372036854775808 % -1");
  EXPECT_EQ(error_of("{{ 1e300 | int }}"), "chat template line 1: int: 1e+300 is out of the integer range");
  EXPECT_EQ(Template("{{ 2 ** 62 }} {{ (-2) ** 63 }} {{ 'abc'[1::9223372036854775807] }}{{ 'abc'[::-9223372036854775807] }}")
                .render(json::object()),
            "4611686018427387904 -9223372036854775808 bc");
  EXPECT_EQ(error_of("{{ v }}", {{"v", {{"x", 18446744073709551615ULL}}}}),
            "chat template input: the integer 18446744073709551615 is larger than 9223372036854775807");
  // Errors name a value without printing all of it.
  EXPECT_EQ(error_of("{{ [1] | map(v) | list }}", {{"v", json::array({1, 2, 3})}}),
            "chat template line 1: map: no filter named <list of 3 items>");
  EXPECT_EQ(error_of("{{ [1] | select(v) | list }}", {{"v", std::string(1000, 'x')}}),
            "chat template line 1: no test named '" + std::string(60, 'x') + "'...");
  json deep = json::array();
  for (int i = 0; i < 300; ++i) deep = json::array({deep});
  EXPECT_NE(error_of("{{ v }}", {{"v", deep}}).find("nests deeper than 200"), std::string::npos);
}

}  // namespace
}  // namespace ms::jinja

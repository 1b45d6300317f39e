// The Jinja subset feature by feature; each expected string is what Python's jinja2 renders in the chat
// environment (trim_blocks, lstrip_blocks, loop controls). Errors must name the line and what failed.

#include <ctime>
#include <string>

#include "engine/chat/jinja_builtins.h"
#include "engine/chat/jinja_interpreter.h"
#include "engine/chat/jinja_parser.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace strata::chat::jinja {
namespace {

std::tm Epoch() {
  std::tm tm{};
  tm.tm_year = 70;
  tm.tm_mday = 1;
  return tm;
}

absl::StatusOr<std::string> TryRender(const std::string& source) {
  absl::StatusOr<Body> body = ParseTemplate(source);
  if (!body.ok()) return body.status();
  return RenderTemplate(*body, BuiltinGlobals(Epoch), ValueDict{});
}

std::string Render(const std::string& source) {
  absl::StatusOr<std::string> out = TryRender(source);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : "";
}

TEST(JinjaInterpreterTest, WhitespaceControlTrimAndLstripBlocks) {
  EXPECT_EQ(Render(R"J(  {% if true %}
x
  {% endif %}
y {{- ' z' }}
)J"), R"J(x
y z)J");
}

TEST(JinjaInterpreterTest, CommentsAndTheirWhitespace) {
  EXPECT_EQ(Render(R"J({# comment #}
  {#- c2 -#}  
{{ 'x' }}
)J"), R"J(x)J");
}

TEST(JinjaInterpreterTest, ForLoopUnpackingFilterAndLoopVariables) {
  EXPECT_EQ(Render(R"J({% for a, b in [[1, 'x'], [2, 'y']] if a > 1 or b == 'x' %}{{ loop.index }}/{{ loop.length }}:{{ a }}{{ b }}{{ ',' if not loop.last }}{% else %}none{% endfor %})J"), R"J(1/2:1x,2/2:2y)J");
}

TEST(JinjaInterpreterTest, ForElseOnAnEmptySequence) {
  EXPECT_EQ(Render(R"J({% for x in [] %}x{% else %}empty{% endfor %})J"), R"J(empty)J");
}

TEST(JinjaInterpreterTest, LoopCycle) {
  EXPECT_EQ(Render("{% for x in [1, 2, 3] %}{{ loop.cycle('a', 'b') }}{% endfor %}"), "aba");
}

TEST(JinjaInterpreterTest, BreakAndContinue) {
  EXPECT_EQ(Render(R"J({% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 4 %}{% break %}{% endif %}{{ x }}{% endfor %})J"), R"J(0134)J");
}

TEST(JinjaInterpreterTest, NamespaceOutlivesTheLoopAPlainSetDoesNot) {
  EXPECT_EQ(Render(R"J({% set n = namespace(c=0) %}{% set v = 'out' %}{% for x in [1,2,3] %}{% set n.c = n.c + x %}{% set v = 'in' %}{% endfor %}{{ n.c }} {{ v }})J"), R"J(6 out)J");
}

TEST(JinjaInterpreterTest, IndexingAndSlicingCountCodePoints) {
  EXPECT_EQ(Render(R"J({{ [1,2,3,4][::-1] }} {{ [1,2,3][1:] }} {{ 'héllo'[1:3] }} {{ 'abc'[-1] }} {{ [1,2,3][:-1] }} {{ 'héllo'|length }})J"), R"J([4, 3, 2, 1] [2, 3] él c [1, 2] 5)J");
}

TEST(JinjaInterpreterTest, ValuesPrintAsPythonDoes) {
  EXPECT_EQ(Render(R"J({{ ['a', 1, none, true, 1.5, {'k': 'v'}] }} {{ 'it\'s' ~ 1 }})J"), R"J(['a', 1, None, True, 1.5, {'k': 'v'}] it's1)J");
}

TEST(JinjaInterpreterTest, ToJsonKeepsKeyOrderAndTakesOptions) {
  EXPECT_EQ(Render(R"J({{ {'b': 1, 'a': [1, 'é', none]} | tojson }} {{ 'é' | tojson(ensure_ascii=True) }} {{ {'a': [1, {}]} | tojson(indent=2) }})J"), R"J({"b": 1, "a": [1, "é", null]} "\u00e9" {
  "a": [
    1,
    {}
  ]
})J");
}

TEST(JinjaInterpreterTest, StringMethods) {
  EXPECT_EQ(Render(R"J({{ ('  a b  ' | trim) }}|{{ 'xxhixx'.strip('x') }}|{{ ' a  b '.split() }}|{{ 'a,b,,c'.split(',') }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'Hello'.startswith(('x', 'He')) }}|{{ 'aaa'.replace('a', 'b', 2) }}|{{ 'hi there'.title() }})J"), R"J(a b|hi|['a', 'b']|['a', 'b', '', 'c']|['a', 'b,c']|True|bba|Hi There)J");
}

TEST(JinjaInterpreterTest, ArithmeticAsPython) {
  EXPECT_EQ(Render(R"J({{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1.5e-7 }} {{ 7 / 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 10 / 4 * 2 }})J"), R"J(1.0 0.30000000000000004 1e+20 1.5e-07 3.5 -4 2 1024 5.0)J");
}

TEST(JinjaInterpreterTest, MacrosWithDefaultsAndKeywords) {
  EXPECT_EQ(Render(R"J({% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', punct='?') }} {{ greet(name='C') }})J"), R"J(Hi A! Hi B? Hi C!)J");
}

TEST(JinjaInterpreterTest, RecursiveMacro) {
  EXPECT_EQ(Render(R"J({% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }})J"), R"J(321)J");
}

TEST(JinjaInterpreterTest, TestsAndFilters) {
  EXPECT_EQ(Render(R"J({{ x is defined }} {{ none is none }} {{ 'a' is string }} {{ {} is mapping }} {{ [] is iterable }} {{ 3 is odd }} {{ 'a' if false }}|{{ y | default('d') }} {{ [3,1] | list | length }} {{ [{'r': 'u'}, {'r': 'a'}] | selectattr('r', 'equalto', 'u') | list }} {{ [{'r': 'u'}, {'r': 'a'}] | map(attribute='r') | join('+') }})J"), R"J(False True True True True True |d 2 [{'r': 'u'}] u+a)J");
}

TEST(JinjaInterpreterTest, ComparisonsMembershipAndLogic) {
  EXPECT_EQ(Render(R"J({{ 'b' in 'abc' }} {{ 2 not in [1, 3] }} {{ 'k' in {'k': 1} }} {{ 1 < 2 < 3 }} {{ not 0 and 'x' or 'y' }})J"), R"J(True True True True x)J");
}

TEST(JinjaInterpreterTest, DictMethods) {
  EXPECT_EQ(Render(R"J({% set d = {'a': 1, 'b': 2} %}{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{{ d.get('c', 'none') }} {{ d.keys() | list }})J"), R"J(a=1;b=2;none ['a', 'b'])J");
}

TEST(JinjaInterpreterTest, StrftimeNowFormatsTheGivenClock) {
  EXPECT_EQ(Render("{{ strftime_now('%Y-%m-%d') }}"), "1970-01-01");
}

TEST(JinjaInterpreterTest, RaiseExceptionFailsWithTheTemplatesMessage) {
  EXPECT_THAT(TryRender("a{{ raise_exception('roles must alternate') }}b").status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument,
                           std::string(kRaisedPrefix) + "roles must alternate"));
}

TEST(JinjaInterpreterTest, ErrorsNameTheLineAndWhatIsWrong) {
  EXPECT_THAT(TryRender("x\n{{ messages[0].role }}").status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "line 2: 'messages' is undefined"));
  EXPECT_THAT(TryRender("{% set d = {} %}\n\n{{ d.a.b }}").status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "line 3: 'dict object' has no attribute 'a'"));
  EXPECT_THAT(TryRender("{{ 'a' + 1 }}").status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "unsupported operand types for +: 'str' and 'int'"));
  EXPECT_THAT(TryRender("{{ 'abc'.zfill(5) }}").status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "str has no method 'zfill'"));
  EXPECT_THAT(TryRender("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}").status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "macro 'm' takes 1 arguments, 2 given"));
  EXPECT_THAT(TryRender("{% set x = 1 %}{% set x.y = 2 %}").status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "'x' is not a namespace()"));
  EXPECT_THAT(TryRender("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").status(),
              StatusIs(absl::StatusCode::kResourceExhausted));
}

TEST(JinjaParserTest, WhatIsOutsideTheSubsetIsRefusedByNameAndLine) {
  EXPECT_THAT(ParseTemplate("a\n{{ x | wordwrap }}").status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "line 2: unsupported filter 'wordwrap'"));
  EXPECT_THAT(ParseTemplate("{% if x is prime %}{% endif %}").status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "unsupported test 'prime'"));
  EXPECT_THAT(ParseTemplate("{% extends 'base.html' %}").status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "unsupported tag {% extends %}"));
  EXPECT_THAT(ParseTemplate("{% for x in y recursive %}{% endfor %}").status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "recursive"));
  EXPECT_THAT(ParseTemplate("{{ f(*args) }}").status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "*args"));
}

// A hostile template fails with an error instead of exhausting the stack, memory or time.
TEST(JinjaInterpreterTest, RunawayTemplatesAreStopped) {
  EXPECT_THAT(ParseTemplate("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}").status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "nesting deeper than"));
  std::string nested_ifs;
  for (int i = 0; i < 5000; ++i) nested_ifs += "{% if true %}";
  EXPECT_THAT(ParseTemplate(nested_ifs).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "nesting"));
  EXPECT_THAT(TryRender("{{ 'abcdefgh' * 100000000 }}").status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "16 MiB"));
  EXPECT_THAT(TryRender("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}").status(),
              StatusIs(absl::StatusCode::kResourceExhausted));
}

TEST(JinjaParserTest, MalformedTemplatesAreRefusedWithTheLine) {
  EXPECT_THAT(ParseTemplate("{% if x %}never closed").status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "missing {% endif %}"));
  EXPECT_THAT(ParseTemplate("ok\n{{ 'open").status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "line 2: unterminated string"));
  EXPECT_THAT(ParseTemplate("{{ x ").status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "no '}}'"));
  EXPECT_THAT(ParseTemplate("{# open").status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "comment"));
  EXPECT_THAT(ParseTemplate("{{ (1 + ] }}").status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "']'"));
  EXPECT_THAT(ParseTemplate("{{ a $ b }}").status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "unexpected character '$'"));
}

}  // namespace
}  // namespace strata::chat::jinja

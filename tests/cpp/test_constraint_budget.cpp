// The structured-output budget (src/grammar/constraint_budget.h): each bound refuses the first value
// past it with an error naming it and admits the value at it; the repetition count follows what
// xgrammar unrolls; through GrammarCompiler a refused constraint never compiles and the schemas the
// budget admits still compile.
#include <gtest/gtest.h>

#include <string>

#include "grammar/constraint_budget.h"
#include "grammar/grammar.h"

namespace nibble::grammar {
namespace {

// A schema of arrays nested `levels` deep around an integer: a document `levels + 1` deep.
std::string nested_arrays(int levels) {
  std::string s = R"({"type":"integer"})";
  for (int i = 0; i < levels; ++i) s = R"({"type":"array","items":)" + s + "}";
  return s;
}

// An object naming n properties, the first `required` of them required.
std::string object_with(int n, int required) {
  std::string props, names;
  for (int i = 0; i < n; ++i) {
    props += (i ? "," : "") + std::string("\"p") + std::to_string(i) + R"(":{"type":"integer"})";
    if (i < required) names += (i ? "," : "") + std::string("\"p") + std::to_string(i) + "\"";
  }
  return R"({"type":"object","properties":{)" + props + R"(},"required":[)" + names + "]}";
}

Status schema(const std::string& text) { return check_budget({ConstraintKind::JSON_SCHEMA, text}); }

TEST(ConstraintBudget, EachBoundAdmitsItsLimitAndRefusesPastIt) {
  const ConstraintBudget b;
  EXPECT_TRUE(schema(nested_arrays(63)).is_ok());  // 64 levels
  const Status deep = schema(nested_arrays(64));
  EXPECT_NE(deep.message().find("nests 65 levels deep (at most 64"), std::string::npos) << deep.message();
  // Brackets inside strings do not nest.
  EXPECT_TRUE(schema(R"({"description":")" + std::string(200, '[') + R"(","type":"string"})").is_ok());

  EXPECT_TRUE(schema(object_with(256, 0)).is_ok());
  const Status optional = schema(object_with(257, 0));
  EXPECT_NE(optional.message().find("an object with 257 optional properties"), std::string::npos) << optional.message();
  EXPECT_TRUE(schema(object_with(2000, 1800)).is_ok()) << "required properties are not optional";
  std::string five = R"({"type":"object","properties":{)";
  for (int i = 0; i < 5; ++i)
    five += (i ? "," : "") + std::string("\"o") + std::to_string(i) + "\":" + object_with(205, 0);
  five += "}}";
  const Status total = schema(five);  // 5 × 205 + the 5 outer ones = 1,030
  EXPECT_NE(total.message().find("more than 1024 optional properties in all"), std::string::npos) << total.message();

  std::string many = R"({"enum":[)";
  for (int i = 0; i < b.max_values - 2; ++i) many += (i ? "," : "") + std::to_string(i);
  EXPECT_TRUE(schema(many + "]}").is_ok()) << "the object, its enum array and its values: the limit";
  const Status values = schema(many + ",0]}");
  EXPECT_NE(values.message().find("more than 10000 JSON values"), std::string::npos) << values.message();

  EXPECT_TRUE(check_budget({ConstraintKind::REGEX, std::string(b.max_text_bytes, 'a')}).is_ok());
  const Status long_regex = check_budget({ConstraintKind::REGEX, std::string(b.max_text_bytes + 1, 'a')});
  EXPECT_NE(long_regex.message().find("the regex is 65537 bytes long"), std::string::npos) << long_regex.message();
  EXPECT_FALSE(check_budget({ConstraintKind::CHOICE, "", {std::string(40000, 'x'), std::string(30000, 'y')}}).is_ok());
  const Status repeated = check_budget({ConstraintKind::REGEX, "(a{100}){100}"});
  EXPECT_NE(repeated.message().find("the regex bounds repetitions of 10000 characters"), std::string::npos)
      << repeated.message();
  EXPECT_FALSE(check_budget({ConstraintKind::EBNF, "root ::= (\"a\"{100}){100}\n"}).is_ok());
  EXPECT_TRUE(schema("not json {{{").is_ok()) << "left to the compiler, which names what is wrong";
  EXPECT_TRUE(check_budget({ConstraintKind::REGEX, R"(\x41\x0010FFFF\x00000000041\xFFFFFFF)"}).is_ok());
  EXPECT_FALSE(check_budget({ConstraintKind::EBNF, R"(root ::= [^V\0-\x88888894])"}).is_ok()) << "fuzz_grammar's";
  EXPECT_TRUE(check_budget({ConstraintKind::EBNF, R"(root ::= "\U0010FFFF\\x123456789")"}).is_ok())
      << "\\\\x is an escaped backslash, then text";
  EXPECT_FALSE(check_budget({ConstraintKind::EBNF, R"(root ::= "\U88888888")"}).is_ok());
  const Status hex = check_budget({ConstraintKind::EBNF, R"(root ::= "\x1234567890")"});
  EXPECT_NE(hex.message().find("10 significant hex digits"), std::string::npos) << hex.message();
  EXPECT_FALSE(schema(R"({"type":"string","pattern":"\\x4142434445464748494a"})").is_ok()) << "inside a pattern";
  EXPECT_FALSE(schema(R"({"type":"string","pattern":"\u005cx4142434445464748494a"})").is_ok()) << "a JSON escape";
}

TEST(ConstraintBudget, RepetitionsCountWhatXgrammarUnrolls) {
  using S = GrammarSyntax;
  EXPECT_EQ(bounded_repetitions("a{5}", S::REGEX), 5);
  EXPECT_EQ(bounded_repetitions("(ab{2}){3}", S::REGEX), 9) << "(1 + 2) characters, 3 times";
  EXPECT_EQ(bounded_repetitions("^[a-z]{1,64}(-[0-9]{1,8}){0,4}$", S::REGEX), 64 + 9 * 4);
  EXPECT_EQ(bounded_repetitions("[a-z]{1000}", S::REGEX), 129) << "past 129 copies a counted repeat";
  EXPECT_EQ(bounded_repetitions("x{2,}", S::REGEX), 2);
  EXPECT_EQ(bounded_repetitions(R"(\{5} [{}]{9} a*b+c?)", S::REGEX), 9) << "an escaped brace, braces in a class, loops";
  EXPECT_EQ(bounded_repetitions("root ::= \"ab\"{0, 3} \"{9}\"\n", S::EBNF), 6) << "a literal's braces are text";
  const std::string items = "root ::= ((\"[\" item{0, 99999} \"]\"))\nitem ::= ((\", \" [0-9]))\n";
  EXPECT_EQ(bounded_repetitions(items, S::EBNF), 0) << "a repeated rule counts where it is defined";
  const std::string chars = "root ::= ((\"\\\"\" c{0, 100} \"\\\"\"))\nc ::= (([^\\\"\\\\\\r\\n]))\n";
  EXPECT_EQ(bounded_repetitions(chars, S::EBNF), 100) << "a repeated character rule counts its copies";
  EXPECT_EQ(
      bounded_repetitions("root ::= \"\\\"\" r1 \"\\\"\"\nr1 ::= Regex(\"[a-z]{1,8}\", json_string=true)\n", S::EBNF),
      8);
  EXPECT_EQ(bounded_repetitions("a\nnibble_string_0_2_0 ::= x\nnibble_string_0_2_1 ::= y\n", S::EBNF), 2)
      << "a chained string's rules, one character each";
}

// Through the compiler: refused constraints are errors before any compile; what the budget admits
// compiles (a maxLength of 256 on two strings shares one chain; a large maxItems is a counted repeat;
// a form of six bounded strings).
TEST(ConstraintBudget, TheCompilerRefusesPastTheBudget) {
  Vocabulary v;
  for (int c = 0; c < 128; ++c) v.token_bytes.push_back(std::string(1, static_cast<char>(c)));
  v.token_bytes.push_back("");
  v.stop_ids = {128};
  GrammarCompiler compiler(v, 1);
  const auto deep = compiler.compile({ConstraintKind::JSON_SCHEMA, nested_arrays(200)});
  ASSERT_FALSE(deep.is_ok());
  EXPECT_NE(deep.status().message().find("nests 201 levels deep"), std::string::npos);
  const auto patterns = compiler.compile(
      {ConstraintKind::JSON_SCHEMA, R"({"type":"object","properties":{"a":{"type":"string","pattern":"[a-z]{1,100}"},)"
                                    R"("b":{"type":"string","pattern":"[a-z]{1,100}(,[0-9]{1,9}){1,100}"}}})"});
  ASSERT_FALSE(patterns.is_ok());
  EXPECT_NE(patterns.status().message().find("bounds repetitions of"), std::string::npos)
      << patterns.status().message();
  EXPECT_FALSE(compiler.compile({ConstraintKind::REGEX, "([a-z]{1,100}[0-9]{1,100}){1,9}"}).is_ok());
  EXPECT_FALSE(compiler.compile({ConstraintKind::EBNF, R"(root ::= ([a-z]{0,100} ","){0,20})"}).is_ok());
  for (
      const char* admitted :
      {R"({"type":"object","properties":{"a":{"type":"string","maxLength":256},"b":{"type":"string","maxLength":256}},)"
       R"("required":["a","b"]})",
       R"({"type":"array","items":{"type":"integer"},"maxItems":100000})",
       // a form's bounds, 21 + 51 + 101 + 201 + 256 + 129 = 759 characters
       R"({"type":"object","properties":{"a":{"type":"string","maxLength":20},"b":{"type":"string","maxLength":50},)"
       R"("c":{"type":"string","maxLength":100},"d":{"type":"string","maxLength":200},)"
       R"("e":{"type":"string","maxLength":255},"f":{"type":"string","maxLength":500}}})",
       R"({"type":"string","pattern":"^[a-z]{1,64}(-[0-9]{1,8}){0,4}$"})"}) {
    const auto g = compiler.compile({ConstraintKind::JSON_SCHEMA, admitted});
    EXPECT_TRUE(g.is_ok()) << admitted << ": " << g.status().message();
  }
}

}  // namespace
}  // namespace nibble::grammar

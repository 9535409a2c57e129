// The grammar wrapper (src/grammar/) on a small byte vocabulary: masks follow JSON schemas, regexes,
// choices and EBNF grammars; bad constraints are errors naming the problem; the cache compiles each
// key once, also under concurrent callers.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/json_strings.h"

namespace nibble::grammar {
namespace {

// Tokens 0..127: the ASCII characters; 128: a multi-character token "true"; 129: "", special (never
// text); 130: the stop token.
constexpr int32_t TRUE_TOKEN = 128, SPECIAL = 129, STOP = 130;

Vocabulary ascii_vocabulary() {
  Vocabulary v;
  for (int c = 0; c < 128; ++c) v.token_bytes.push_back(std::string(1, char(c)));
  v.token_bytes.push_back("true");
  v.token_bytes.push_back("");
  v.token_bytes.push_back("");
  v.stop_ids = {STOP};
  return v;
}

std::vector<int32_t> allowed(Matcher& m, int64_t vocab) {
  std::vector<uint32_t> words(static_cast<size_t>(mask_words(vocab)));
  m.fill_mask(words.data());
  std::vector<int32_t> out;
  for (int32_t t = 0; t < vocab; ++t)
    if (words[t / 32] >> (t % 32) & 1) out.push_back(t);
  return out;
}

bool allows(Matcher& m, int64_t vocab, int32_t token) {
  for (int32_t t : allowed(m, vocab))
    if (t == token) return true;
  return false;
}

// Feeds `text` one character token at a time; false at the first one the grammar refuses.
bool feed(Matcher& m, const std::string& text) {
  for (char c : text)
    if (!m.accept(static_cast<int32_t>(c))) return false;
  return true;
}

TEST(Grammar, JsonSchemaAllowsExactlyTheSchemasText) {
  GrammarCompiler compiler(ascii_vocabulary(), 2);
  auto g = compiler.compile({ConstraintKind::JSON_SCHEMA,
                             R"({"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"],)"
                             R"("additionalProperties":false})",
                             {}});
  ASSERT_TRUE(g.is_ok()) << g.status().message();
  Matcher m(g.value());
  EXPECT_EQ(allowed(m, 131), std::vector<int32_t>{'{'});
  ASSERT_TRUE(feed(m, "{\"ok\": "));
  EXPECT_TRUE(allows(m, 131, TRUE_TOKEN));  // a multi-byte token the grammar allows whole
  EXPECT_TRUE(allows(m, 131, 'f'));
  EXPECT_FALSE(allows(m, 131, '1'));
  EXPECT_FALSE(allows(m, 131, SPECIAL));
  EXPECT_FALSE(allows(m, 131, STOP));
  ASSERT_TRUE(m.accept(TRUE_TOKEN));
  ASSERT_TRUE(m.accept('}'));
  EXPECT_TRUE(m.completed());
  EXPECT_EQ(allowed(m, 131), std::vector<int32_t>{STOP});  // complete: only the stop token
  EXPECT_FALSE(m.accept('x'));
  ASSERT_TRUE(m.accept(STOP));
  EXPECT_TRUE(m.terminated());
}

TEST(Grammar, RegexChoiceAndEbnf) {
  GrammarCompiler compiler(ascii_vocabulary(), 2);
  auto regex = compiler.compile({ConstraintKind::REGEX, "[0-9]{3}-x", {}});
  ASSERT_TRUE(regex.is_ok()) << regex.status().message();
  Matcher r(regex.value());
  EXPECT_FALSE(feed(r, "12a"));
  r = Matcher(regex.value());
  EXPECT_TRUE(feed(r, "123-x"));
  EXPECT_TRUE(r.completed());

  auto choice = compiler.compile({ConstraintKind::CHOICE, "", {"yes", "no", "say \"hi\"\\"}});
  ASSERT_TRUE(choice.is_ok()) << choice.status().message();
  Matcher c(choice.value());
  std::vector<int32_t> first = allowed(c, 131);
  EXPECT_EQ(first, (std::vector<int32_t>{'n', 's', 'y'}));
  EXPECT_TRUE(feed(c, "say \"hi\"\\"));  // quotes and backslashes escaped into the grammar
  EXPECT_TRUE(c.completed());

  auto ebnf = compiler.compile({ConstraintKind::EBNF, "root ::= \"a\" root | \"b\"", {}});
  ASSERT_TRUE(ebnf.is_ok()) << ebnf.status().message();
  Matcher e(ebnf.value());
  EXPECT_TRUE(feed(e, "aaab"));
  EXPECT_TRUE(e.completed());
  e.rollback(1);
  EXPECT_FALSE(e.completed());
  EXPECT_TRUE(allows(e, 131, 'a'));
}

TEST(Grammar, BadConstraintsAreErrorsNamingTheKind) {
  GrammarCompiler compiler(ascii_vocabulary(), 2);
  struct Case {
    Constraint c;
    std::string needle;
  } cases[] = {
      {{ConstraintKind::JSON_SCHEMA, "{not json", {}}, "invalid json_schema"},
      {{ConstraintKind::JSON_SCHEMA, R"({"type":"nonsense"})", {}}, "invalid json_schema"},
      {{ConstraintKind::REGEX, "(unclosed", {}}, "invalid regex"},
      {{ConstraintKind::EBNF, "root ::= undefined_rule", {}}, "invalid ebnf"},
      {{ConstraintKind::CHOICE, "", {}}, "choice list is empty"},
      {{ConstraintKind::CHOICE, "", {"a", ""}}, "empty string"},
  };
  for (const Case& k : cases) {
    auto g = compiler.compile(k.c);
    ASSERT_FALSE(g.is_ok()) << k.c.text;
    EXPECT_NE(g.status().message().find(k.needle), std::string::npos) << g.status().message();
    auto again = compiler.compile(k.c);  // the error is cached too
    ASSERT_FALSE(again.is_ok());
    EXPECT_EQ(again.status().message(), g.status().message());
  }
}

TEST(Grammar, CacheCompilesEachKeyOnceAcrossThreads) {
  GrammarCompiler compiler(ascii_vocabulary(), 2, /*cache_entries=*/4);
  const Constraint c{ConstraintKind::JSON_SCHEMA, R"({"type":"array","items":{"type":"integer"},"maxItems":3})", {}};
  std::vector<std::thread> threads;
  std::vector<const void*> got(8);
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&, i] {
      auto g = compiler.compile(c);
      ASSERT_TRUE(g.is_ok());
      got[i] = g.value().get();
    });
  for (auto& t : threads) t.join();
  for (const void* p : got) EXPECT_EQ(p, got[0]);
  EXPECT_EQ(compiler.stats().misses, 1);
  EXPECT_EQ(compiler.stats().hits, 7);
  // Past the capacity the least recent go; a recompiled one is a new miss.
  for (int i = 0; i < 5; ++i)
    ASSERT_TRUE(compiler.compile({ConstraintKind::REGEX, "a{" + std::to_string(i + 1) + "}", {}}));
  EXPECT_EQ(compiler.stats().entries, 4);
  ASSERT_TRUE(compiler.compile(c));
  EXPECT_EQ(compiler.stats().misses, 7);
}

TEST(Grammar, ToolCallsWrapOneOrMoreCallsOfTheSchema) {
  GrammarCompiler compiler(ascii_vocabulary(), 2);
  Constraint c{ConstraintKind::TOOL_CALLS,
               R"({"type":"object","properties":{"name":{"const":"f"},"arguments":{"type":"object",)"
               R"("properties":{"x":{"type":"integer"}},"required":["x"]}},"required":["name","arguments"]})",
               {}};
  c.call_begin = "<tc>\n", c.call_end = "\n</tc>";
  const std::string call = "<tc>\n{\"name\": \"f\", \"arguments\": {\"x\": 12}}\n</tc>";
  for (const bool repeated : {false, true}) {
    c.repeated_calls = repeated;
    auto g = compiler.compile(c);
    ASSERT_TRUE(g.is_ok()) << g.status().message();
    Matcher m(g.value());
    ASSERT_TRUE(feed(m, call)) << "repeated " << repeated;
    EXPECT_TRUE(m.completed());
    EXPECT_EQ(allows(m, 131, '\n'), repeated);  // another call only when repeated
    if (repeated) EXPECT_TRUE(feed(m, "\n" + call));
  }
  Matcher wrong(compiler.compile(c).value());
  EXPECT_FALSE(feed(wrong, "<tc>\n{\"name\": \"g\""));  // a tool the schema does not name
}

// JSON strings hold no raw control characters (RFC 8259 section 7), also where a length bound makes
// xgrammar 0.2.8's converter write its own character class, in every kind that carries a schema.
TEST(Grammar, JsonStringsRefuseRawControlCharacters) {
  GrammarCompiler compiler(ascii_vocabulary(), 2);
  const std::string properties =
      R"({"b":{"type":"string","maxLength":4},"u":{"type":"string"},"p":{"type":"string","pattern":"a.c"}})";
  const std::string schema = R"({"type":"object","properties":)" + properties + R"(,"required":["b","u","p"]})";
  Constraint tools{ConstraintKind::TOOL_CALLS,
                   R"({"type":"object","properties":{"name":{"const":"f"},"arguments":)" + schema +
                       R"(},"required":["name","arguments"]})",
                   {}};
  tools.call_begin = "<tc>", tools.call_end = "</tc>";
  const Constraint tag{ConstraintKind::STRUCTURAL_TAG,
                       R"({"type":"structural_tag","format":{"type":"triggered_tags","triggers":["<tc>"],"tags":[)"
                       R"({"type":"tag","begin":"<tc>","content":{"type":"json_schema","json_schema":)" +
                           schema + R"(},"end":"</tc>"}]}})",
                       {}};
  const std::vector<std::pair<Constraint, std::string>> cases = {
      {{ConstraintKind::JSON_SCHEMA, schema, {}}, ""},
      {tools, "<tc>{\"name\": \"f\", \"arguments\": "},
      {tag, "<tc>"},
  };
  for (const auto& [c, before] : cases) {
    auto g = compiler.compile(c);
    ASSERT_TRUE(g.is_ok()) << constraint_kind_name(c.kind) << ": " << g.status().message();
    Matcher m(g.value());
    ASSERT_TRUE(feed(m, before + "{\"b\": \"")) << constraint_kind_name(c.kind);
    for (const int control : {0x01, int('\t'), 0x1f})
      EXPECT_FALSE(allows(m, 131, control)) << constraint_kind_name(c.kind);
    ASSERT_TRUE(feed(m, "x y\", \"u\": \"")) << constraint_kind_name(c.kind);
    EXPECT_FALSE(allows(m, 131, '\t')) << constraint_kind_name(c.kind);
    ASSERT_TRUE(feed(m, "\\t\", \"p\": \"a")) << constraint_kind_name(c.kind);  // an escaped tab is JSON
    EXPECT_FALSE(allows(m, 131, '\t')) << constraint_kind_name(c.kind);
    EXPECT_TRUE(feed(m, "bc\"}")) << constraint_kind_name(c.kind);
  }
}

// Length bounds hold exactly, through the chains json_strings_fixed makes of them (and the longest
// past MAX_CHAINED_STRING_LENGTH, left to xgrammar's repetition, holds too).
TEST(Grammar, StringLengthBoundsHoldExactly) {
  GrammarCompiler compiler(ascii_vocabulary(), 2);
  struct Case {
    std::string bounds;
    int min, max;  // max -1: none
  };
  const int past = MAX_CHAINED_STRING_LENGTH + 4;
  for (const Case& k : {Case{R"("minLength":2,"maxLength":4)", 2, 4}, Case{R"("maxLength":1)", 0, 1},
                        Case{R"("minLength":3)", 3, -1}, Case{R"("maxLength":)" + std::to_string(past), 0, past}}) {
    auto g = compiler.compile(
        {ConstraintKind::JSON_SCHEMA,
         R"({"type":"object","properties":{"s":{"type":"string",)" + k.bounds + R"(}},"required":["s"]})",
         {}});
    ASSERT_TRUE(g.is_ok()) << k.bounds << ": " << g.status().message();
    Matcher m(g.value());
    ASSERT_TRUE(feed(m, "{\"s\": \""));
    const int longest = k.max < 0 ? k.min + 6 : k.max;
    for (int n = 0; n <= longest; ++n) {  // n characters in: the quote exactly when n may end it
      EXPECT_EQ(allows(m, 131, '"'), n >= k.min) << k.bounds << " at " << n;
      EXPECT_EQ(allows(m, 131, 'x'), k.max < 0 || n < k.max) << k.bounds << " at " << n;
      if (n < longest) ASSERT_TRUE(m.accept('x')) << k.bounds << " at " << n;
    }
    ASSERT_TRUE(feed(m, "\"}"));
    EXPECT_TRUE(m.completed()) << k.bounds;
  }
}

TEST(Grammar, JsonStringsFixedRewritesOnlyTheConvertersBoundedStrings) {
  const std::string rules =
      "root ::= ((\"{\" \"\\\"s\\\"\" \": \" root_prop_0 \"}\"))\n"
      "root_prop_0 ::= ((\"\\\"\" root_prop_0_characters{1, 2} \"\\\"\"))\n"
      "root_prop_0_characters ::= (([^\\\"\\\\\\r\\n]))\n"
      "other ::= ((\"\\\"\" x{1, 2} \"\\\"\"))\n";  // not a character rule: left as is
  const std::string fixed = json_strings_fixed(rules);
  EXPECT_NE(fixed.find("root_prop_0 ::= ((\"\\\"\" nibble_string_1_2_0))"), std::string::npos) << fixed;
  EXPECT_NE(fixed.find("root_prop_0_characters ::= (([^\\0-\\x1f\\\"\\\\]))"), std::string::npos) << fixed;
  EXPECT_NE(fixed.find("other ::= ((\"\\\"\" x{1, 2} \"\\\"\"))"), std::string::npos) << fixed;
  EXPECT_NE(fixed.find("nibble_string_1_2_0 ::= [^\\0-\\x1f\\\"\\\\] nibble_string_1_2_1\n"), std::string::npos)
      << fixed;
  EXPECT_NE(fixed.find("nibble_string_1_2_1 ::= \"\\\"\" | [^\\0-\\x1f\\\"\\\\] nibble_string_1_2_2\n"),
            std::string::npos)
      << fixed;
  EXPECT_NE(fixed.find("nibble_string_1_2_2 ::= \"\\\"\"\n"), std::string::npos) << fixed;
}

TEST(Grammar, ChoiceGrammarEscapes) {
  EXPECT_EQ(choice_grammar({"a", "b\"c", "d\\", "e\n"}), "root ::= \"a\" | \"b\\\"c\" | \"d\\\\\" | \"e\\u000a\"");
}

}  // namespace
}  // namespace nibble::grammar

// Jinja expressions: a recursive-descent parser with jinja2's operator precedence over one tag's
// tokens (lexer.h), used by the template parser for {{ expressions }} and each statement's parts.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/lexer.h"

namespace nibble::text::jinja {

// How deeply expressions and statements may nest (jinja2 would hit Python's recursion limit).
inline constexpr int MAX_NESTING = 100;

class ExprParser {
 public:
  ExprParser(std::vector<Token> tokens, int line) : t_(std::move(tokens)), line_(line) {}

  Result<ExprPtr> parse_expression();
  bool at_end() const { return t_[p_].kind == Token::END; }
  bool peek_name(const char* n) const { return t_[p_].kind == Token::NAME && t_[p_].text == n; }
  bool peek_op(const char* o) const { return t_[p_].kind == Token::OP && t_[p_].text == o; }
  bool accept_name(const char* n) { return peek_name(n) ? (++p_, true) : false; }
  bool accept_op(const char* o) { return peek_op(o) ? (++p_, true) : false; }
  Result<std::string> expect_name();
  Status expect_op(const char* o) { return accept_op(o) ? Status::ok() : error(std::string("expected '") + o + "'"); }
  Status error(const std::string& what) const;

  // Comma-separated names, as for-loop and set targets: "a" or "a, b".
  Result<std::vector<std::string>> parse_targets();

  Result<ExprPtr> parse_or() { return parse_left_assoc(&ExprParser::parse_and, {"or"}); }

 private:
  ExprPtr make(Expr::Kind kind);
  ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b);
  Result<ExprPtr> parse_conditional();

  // One left-associative binary level: next (op next)*, where op is a name ("and") or an operator.
  Result<ExprPtr> parse_left_assoc(Result<ExprPtr> (ExprParser::*next)(), std::initializer_list<const char*> ops);

  Result<ExprPtr> parse_and() { return parse_left_assoc(&ExprParser::parse_not, {"and"}); }

  Result<ExprPtr> parse_not();
  Result<ExprPtr> parse_compare();

  Result<ExprPtr> parse_math1() { return parse_left_assoc(&ExprParser::parse_concat, {"+", "-"}); }
  Result<ExprPtr> parse_concat() { return parse_left_assoc(&ExprParser::parse_math2, {"~"}); }
  Result<ExprPtr> parse_math2() { return parse_left_assoc(&ExprParser::parse_pow, {"*", "/", "//", "%"}); }
  Result<ExprPtr> parse_pow() { return parse_left_assoc(&ExprParser::parse_filtered_unary, {"**"}); }
  Result<ExprPtr> parse_filtered_unary() { return parse_unary(true); }

  Result<ExprPtr> parse_unary(bool with_filter);
  Status parse_call_args(Expr& e);
  Result<ExprPtr> parse_postfix(ExprPtr node);

  Result<ExprPtr> parse_filters_and_tests(ExprPtr node);
  Result<ExprPtr> parse_primary();

  std::vector<Token> t_;
  size_t p_ = 0;
  int line_;
  int depth_ = 0;
};

}  // namespace nibble::text::jinja

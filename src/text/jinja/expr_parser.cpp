// Jinja expressions: the precedence levels from the conditional down to the primaries, filters and
// tests (jinja2/parser.py's parse_* chain).
#include "text/jinja/expr_parser.h"

namespace nibble::text::jinja {

Result<ExprPtr> ExprParser::parse_expression() {
  // Nesting limit: a hostile or broken template must not exhaust the stack.
  if (++depth_ > MAX_NESTING) return error("expression nested too deeply");
  auto e = parse_conditional();
  --depth_;
  return e;
}

Result<std::string> ExprParser::expect_name() {
  if (t_[p_].kind != Token::NAME) return error("expected a name");
  return t_[p_++].text;
}

Status ExprParser::error(const std::string& what) const {
  return Status::error("line " + std::to_string(line_) + ": " + what +
                       (t_[p_].kind == Token::END ? " at the end of the tag" : " near '" + t_[p_].text + "'"));
}

// Comma-separated names, as for-loop and set targets: "a" or "a, b".
Result<std::vector<std::string>> ExprParser::parse_targets() {
  std::vector<std::string> names;
  const bool paren = accept_op("(");
  do {
    auto n = expect_name();
    if (!n) return n.status();
    std::string name = *n;
    if (accept_op(".")) {  // namespace attribute: ns.attr
      auto attr = expect_name();
      if (!attr) return attr.status();
      name += "." + *attr;
    }
    names.push_back(name);
  } while (accept_op(","));
  if (paren) NIB_RETURN_IF_ERROR(expect_op(")"));
  return names;
}

ExprPtr ExprParser::make(Expr::Kind kind) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line_;
  return e;
}

ExprPtr ExprParser::binary(const std::string& op, ExprPtr a, ExprPtr b) {
  auto e = make(Expr::Kind::BINARY);
  e->name = op;
  e->children.push_back(std::move(a));
  e->children.push_back(std::move(b));
  return e;
}

Result<ExprPtr> ExprParser::parse_conditional() {
  auto value = parse_or();
  if (!value) return value;
  while (accept_name("if")) {
    auto cond = parse_or();
    if (!cond) return cond;
    ExprPtr otherwise;
    if (accept_name("else")) {
      auto o = parse_conditional();
      if (!o) return o;
      otherwise = std::move(*o);
    }
    auto e = make(Expr::Kind::CONDITIONAL);
    e->children.push_back(std::move(*value));
    e->children.push_back(std::move(*cond));
    e->children.push_back(std::move(otherwise));  // may be null: undefined
    value = std::move(e);
  }
  return value;
}

// One left-associative binary level: next (op next)*, where op is a name ("and") or an operator.
Result<ExprPtr> ExprParser::parse_left_assoc(Result<ExprPtr> (ExprParser::*next)(),
                                             std::initializer_list<const char*> ops) {
  auto left = (this->*next)();
  if (!left) return left;
  while (true) {
    const char* matched = nullptr;
    for (const char* op : ops)
      if (std::isalpha(static_cast<unsigned char>(op[0])) ? peek_name(op) : peek_op(op)) matched = op;
    if (!matched) return left;
    ++p_;
    auto right = (this->*next)();
    if (!right) return right;
    left = binary(matched, std::move(*left), std::move(*right));
  }
}

Result<ExprPtr> ExprParser::parse_not() {
  if (accept_name("not")) {
    if (++depth_ > MAX_NESTING) return error("expression nested too deeply");
    auto operand = parse_not();
    --depth_;
    if (!operand) return operand;
    auto e = make(Expr::Kind::UNARY);
    e->name = "not";
    e->children.push_back(std::move(*operand));
    return e;
  }
  return parse_compare();
}

Result<ExprPtr> ExprParser::parse_compare() {
  auto left = parse_math1();
  if (!left) return left;
  while (true) {
    std::string op;
    if (peek_op("==") || peek_op("!=") || peek_op("<") || peek_op(">") || peek_op("<=") || peek_op(">=")) {
      op = t_[p_++].text;
    } else if (accept_name("in")) {
      op = "in";
    } else if (peek_name("not") && t_[p_ + 1].kind == Token::NAME && t_[p_ + 1].text == "in") {
      p_ += 2;
      op = "not in";
    } else {
      return left;
    }
    auto right = parse_math1();
    if (!right) return right;
    left = binary(op, std::move(*left), std::move(*right));
  }
}

Result<ExprPtr> ExprParser::parse_unary(bool with_filter) {
  Result<ExprPtr> node = Status::error("");
  if (peek_op("-") || peek_op("+")) {
    const std::string op = t_[p_++].text;
    if (++depth_ > MAX_NESTING) return error("expression nested too deeply");
    auto operand = parse_unary(false);
    --depth_;
    if (!operand) return operand;
    auto e = make(Expr::Kind::UNARY);
    e->name = op;
    e->children.push_back(std::move(*operand));
    node = std::move(e);
  } else {
    node = parse_primary();
    if (!node) return node;
    node = parse_postfix(std::move(*node));
  }
  if (!node || !with_filter) return node;
  return parse_filters_and_tests(std::move(*node));
}

Status ExprParser::parse_call_args(Expr& e) {
  if (accept_op(")")) return Status::ok();
  do {
    if (peek_op(")")) break;  // trailing comma
    if (t_[p_].kind == Token::NAME && t_[p_ + 1].kind == Token::OP && t_[p_ + 1].text == "=") {
      const std::string key = t_[p_].text;
      p_ += 2;
      auto v = parse_expression();
      if (!v) return v.status();
      e.kwargs.emplace_back(key, std::move(*v));
    } else {
      auto v = parse_expression();
      if (!v) return v.status();
      e.children.push_back(std::move(*v));
    }
  } while (accept_op(","));
  return expect_op(")");
}

Result<ExprPtr> ExprParser::parse_postfix(ExprPtr node) {
  while (true) {
    if (accept_op(".")) {
      if (t_[p_].kind == Token::INT) {  // x.0 is x[0]
        auto e = make(Expr::Kind::ITEM);
        e->children.push_back(std::move(node));
        auto lit = make(Expr::Kind::LITERAL);
        lit->literal = t_[p_++].value;
        e->children.push_back(std::move(lit));
        node = std::move(e);
        continue;
      }
      auto name = expect_name();
      if (!name) return name.status();
      auto e = make(Expr::Kind::ATTR);
      e->name = *name;
      e->children.push_back(std::move(node));
      node = std::move(e);
    } else if (accept_op("[")) {
      ExprPtr parts[3];
      bool is_slice = false;
      for (int k = 0; k < 3; ++k) {
        if (!peek_op(":") && !peek_op("]")) {
          auto v = parse_expression();
          if (!v) return v;
          parts[k] = std::move(*v);
        }
        if (k < 2 && accept_op(":")) {
          is_slice = true;
          continue;
        }
        break;
      }
      NIB_RETURN_IF_ERROR(expect_op("]"));
      if (!is_slice && !parts[0]) return error("empty subscript");
      auto e = make(is_slice ? Expr::Kind::SLICE : Expr::Kind::ITEM);
      e->children.push_back(std::move(node));
      for (auto& part : parts)
        if (is_slice || part) e->children.push_back(std::move(part));
      node = std::move(e);
    } else if (accept_op("(")) {
      auto e = make(Expr::Kind::CALL);
      e->children.push_back(std::move(node));
      NIB_RETURN_IF_ERROR(parse_call_args(*e));
      node = std::move(e);
    } else {
      return node;
    }
  }
}

Result<ExprPtr> ExprParser::parse_filters_and_tests(ExprPtr node) {
  while (true) {
    if (accept_op("|")) {
      auto name = expect_name();
      if (!name) return name.status();
      std::string full = *name;
      while (accept_op(".")) {
        auto part = expect_name();
        if (!part) return part.status();
        full += "." + *part;
      }
      auto e = make(Expr::Kind::FILTER);
      e->name = full;
      e->children.push_back(std::move(node));
      if (accept_op("(")) NIB_RETURN_IF_ERROR(parse_call_args(*e));
      node = std::move(e);
    } else if (accept_name("is")) {
      auto e = make(Expr::Kind::TEST);
      e->negated = accept_name("not");
      auto name = expect_name();
      if (!name) return name.status();
      e->name = *name;
      e->children.push_back(std::move(node));
      if (accept_op("(")) {
        NIB_RETURN_IF_ERROR(parse_call_args(*e));
      } else if (t_[p_].kind == Token::STRING || t_[p_].kind == Token::INT || t_[p_].kind == Token::FLOAT ||
                 peek_op("[") || peek_op("{") ||
                 (t_[p_].kind == Token::NAME && t_[p_].text != "and" && t_[p_].text != "or" && t_[p_].text != "else" &&
                  t_[p_].text != "if" && t_[p_].text != "is")) {
        // One argument without parentheses, as jinja2's parse_test takes it: a primary with its
        // postfix ("x is divisibleby 3", "x is sameas none", "x is in [1, 2]", "x is eq y.z").
        auto arg = parse_primary();
        if (!arg) return arg;
        auto full = parse_postfix(std::move(*arg));
        if (!full) return full;
        e->children.push_back(std::move(*full));
      }
      node = std::move(e);
    } else {
      return node;
    }
  }
}

Result<ExprPtr> ExprParser::parse_primary() {
  const Token& tok = t_[p_];
  if (tok.kind == Token::STRING) {
    std::string s = tok.text;
    ++p_;
    while (t_[p_].kind == Token::STRING) s += t_[p_++].text;  // adjacent literals concatenate
    auto e = make(Expr::Kind::LITERAL);
    e->literal = Value(s);
    return e;
  }
  if (tok.kind == Token::INT || tok.kind == Token::FLOAT) {
    auto e = make(Expr::Kind::LITERAL);
    e->literal = tok.value;
    ++p_;
    return e;
  }
  if (tok.kind == Token::NAME) {
    ++p_;
    auto e = make(Expr::Kind::LITERAL);
    if (tok.text == "true" || tok.text == "True")
      e->literal = Value(true);
    else if (tok.text == "false" || tok.text == "False")
      e->literal = Value(false);
    else if (tok.text == "none" || tok.text == "None")
      e->literal = Value::none();
    else {
      e->kind = Expr::Kind::NAME;
      e->name = tok.text;
    }
    return e;
  }
  if (accept_op("(")) {
    auto first = parse_expression();
    if (!first) return first;
    if (accept_op(")")) return first;
    auto tuple = make(Expr::Kind::TUPLE);
    tuple->children.push_back(std::move(*first));
    while (accept_op(",")) {
      if (peek_op(")")) break;
      auto next = parse_expression();
      if (!next) return next;
      tuple->children.push_back(std::move(*next));
    }
    NIB_RETURN_IF_ERROR(expect_op(")"));
    return tuple;
  }
  if (accept_op("[")) {
    auto list = make(Expr::Kind::LIST);
    while (!accept_op("]")) {
      auto item = parse_expression();
      if (!item) return item;
      list->children.push_back(std::move(*item));
      if (!accept_op(",")) {
        NIB_RETURN_IF_ERROR(expect_op("]"));
        break;
      }
    }
    return list;
  }
  if (accept_op("{")) {
    auto dict = make(Expr::Kind::DICT);
    while (!accept_op("}")) {
      auto key = parse_expression();
      if (!key) return key;
      NIB_RETURN_IF_ERROR(expect_op(":"));
      auto value = parse_expression();
      if (!value) return value;
      dict->children.push_back(std::move(*key));
      dict->children.push_back(std::move(*value));
      if (!accept_op(",")) {
        NIB_RETURN_IF_ERROR(expect_op("}"));
        break;
      }
    }
    return dict;
  }
  return error("expected an expression");
}

}  // namespace nibble::text::jinja

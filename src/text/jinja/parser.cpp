// Jinja parsing: a recursive-descent parser with jinja2's operator precedence builds the tree from
// the lexer's pieces (text, {{ expression }}, {% statement %}) and each tag's tokens (lexer.h).
#include "text/jinja/parser.h"

#include <map>

#include "text/jinja/lexer.h"

namespace nibble::text::jinja {
namespace {

// How deeply expressions and statements may nest (jinja2 would hit Python's recursion limit).
constexpr int MAX_NESTING = 100;

// ---- expression parser ----------------------------------------------------------------------

class ExprParser {
 public:
  ExprParser(std::vector<Token> tokens, int line) : t_(std::move(tokens)), line_(line) {}

  Result<ExprPtr> parse_expression() {
    // Nesting limit: a hostile or broken template must not exhaust the stack.
    if (++depth_ > MAX_NESTING) return error("expression nested too deeply");
    auto e = parse_conditional();
    --depth_;
    return e;
  }
  bool at_end() const { return t_[p_].kind == Token::END; }
  bool peek_name(const char* n) const { return t_[p_].kind == Token::NAME && t_[p_].text == n; }
  bool peek_op(const char* o) const { return t_[p_].kind == Token::OP && t_[p_].text == o; }
  bool accept_name(const char* n) { return peek_name(n) ? (++p_, true) : false; }
  bool accept_op(const char* o) { return peek_op(o) ? (++p_, true) : false; }
  Result<std::string> expect_name() {
    if (t_[p_].kind != Token::NAME) return error("expected a name");
    return t_[p_++].text;
  }
  Status expect_op(const char* o) { return accept_op(o) ? Status::ok() : error(std::string("expected '") + o + "'"); }
  Status error(const std::string& what) const {
    return Status::error("line " + std::to_string(line_) + ": " + what +
                         (t_[p_].kind == Token::END ? " at the end of the tag" : " near '" + t_[p_].text + "'"));
  }

  // Comma-separated names, as for-loop and set targets: "a" or "a, b".
  Result<std::vector<std::string>> parse_targets() {
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

  Result<ExprPtr> parse_or() { return parse_left_assoc(&ExprParser::parse_and, {"or"}); }

 private:
  ExprPtr make(Expr::Kind kind) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line_;
    return e;
  }
  ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b) {
    auto e = make(Expr::Kind::BINARY);
    e->name = op;
    e->children.push_back(std::move(a));
    e->children.push_back(std::move(b));
    return e;
  }

  Result<ExprPtr> parse_conditional() {
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
  Result<ExprPtr> parse_left_assoc(Result<ExprPtr> (ExprParser::*next)(), std::initializer_list<const char*> ops) {
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

  Result<ExprPtr> parse_and() { return parse_left_assoc(&ExprParser::parse_not, {"and"}); }

  Result<ExprPtr> parse_not() {
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

  Result<ExprPtr> parse_compare() {
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

  Result<ExprPtr> parse_math1() { return parse_left_assoc(&ExprParser::parse_concat, {"+", "-"}); }

  Result<ExprPtr> parse_concat() { return parse_left_assoc(&ExprParser::parse_math2, {"~"}); }

  Result<ExprPtr> parse_math2() { return parse_left_assoc(&ExprParser::parse_pow, {"*", "/", "//", "%"}); }

  Result<ExprPtr> parse_pow() { return parse_left_assoc(&ExprParser::parse_filtered_unary, {"**"}); }
  Result<ExprPtr> parse_filtered_unary() { return parse_unary(true); }

  Result<ExprPtr> parse_unary(bool with_filter) {
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

  Status parse_call_args(Expr& e) {
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

  Result<ExprPtr> parse_postfix(ExprPtr node) {
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

  Result<ExprPtr> parse_filters_and_tests(ExprPtr node) {
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
                   (t_[p_].kind == Token::NAME && t_[p_].text != "and" && t_[p_].text != "or" &&
                    t_[p_].text != "else" && t_[p_].text != "if" && t_[p_].text != "is")) {
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

  Result<ExprPtr> parse_primary() {
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

  std::vector<Token> t_;
  size_t p_ = 0;
  int line_;
  int depth_ = 0;
};

// ---- statement parser -----------------------------------------------------------------------

class TemplateParser {
 public:
  explicit TemplateParser(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  // Parses nodes until a statement whose first word is in `stop` (left unconsumed) or the end.
  Result<NodeList> parse_body(const std::vector<std::string>& stop, std::string* stopped_at) {
    if (++depth_ > MAX_NESTING) return Status::error("statements nested too deeply");
    struct Leave {
      int& d;
      ~Leave() { --d; }
    } leave{depth_};
    NodeList nodes;
    while (i_ < pieces_.size()) {
      const Piece& piece = pieces_[i_];
      if (piece.kind == Piece::TEXT) {
        auto n = node(Node::Kind::TEXT, piece.line);
        n->text = piece.content;
        nodes.push_back(std::move(n));
        ++i_;
        continue;
      }
      auto tokens = tokenize(piece.content, piece.line);
      if (!tokens) return tokens.status();
      ExprParser ep(std::move(*tokens), piece.line);
      if (piece.kind == Piece::EXPRESSION) {
        auto e = ep.parse_expression();
        if (!e) return e.status();
        if (!ep.at_end()) return ep.error("unexpected token");
        auto n = node(Node::Kind::OUTPUT, piece.line);
        n->expr = std::move(*e);
        nodes.push_back(std::move(n));
        ++i_;
        continue;
      }
      auto keyword = ep.expect_name();
      if (!keyword) return keyword.status();
      for (const std::string& s : stop) {
        if (*keyword == s) {
          if (stopped_at) *stopped_at = s;
          return nodes;
        }
      }
      ++i_;
      auto n = parse_statement(*keyword, ep, piece.line);
      if (!n) return n.status();
      if (*n) nodes.push_back(std::move(*n));
    }
    if (!stop.empty()) return Status::error("unexpected end of template: missing {% " + stop.back() + " %}");
    return nodes;
  }

 private:
  std::unique_ptr<Node> node(Node::Kind kind, int line) {
    auto n = std::make_unique<Node>();
    n->kind = kind;
    n->line = line;
    return n;
  }

  Result<NodeList> body_until(std::vector<std::string> stop, std::string& stopped_at) {
    return parse_body(stop, &stopped_at);
  }

  // The ExprParser positioned after the keyword of the current (stopping) statement.
  Result<ExprParser> current_statement() {
    const Piece& piece = pieces_[i_];
    auto tokens = tokenize(piece.content, piece.line);
    if (!tokens) return tokens.status();
    ExprParser ep(std::move(*tokens), piece.line);
    auto kw = ep.expect_name();
    if (!kw) return kw.status();
    return ep;
  }

  Result<std::unique_ptr<Node>> parse_statement(const std::string& keyword, ExprParser& ep, int line) {
    if (keyword == "if") {
      auto n = node(Node::Kind::IF, line);
      auto cond = ep.parse_expression();
      if (!cond) return cond.status();
      ExprPtr condition = std::move(*cond);
      while (true) {
        std::string stopped;
        auto body = body_until({"elif", "else", "endif"}, stopped);
        if (!body) return body.status();
        n->branches.emplace_back(std::move(condition), std::move(*body));
        if (stopped == "elif") {
          auto sp = current_statement();
          if (!sp) return sp.status();
          auto c = sp->parse_expression();
          if (!c) return c.status();
          condition = std::move(*c);
          ++i_;
          continue;
        }
        ++i_;
        if (stopped == "else") {
          std::string end;
          auto else_body = body_until({"endif"}, end);
          if (!else_body) return else_body.status();
          n->else_body = std::move(*else_body);
          ++i_;
        }
        return n;
      }
    }
    if (keyword == "for") {
      auto n = node(Node::Kind::FOR, line);
      auto targets = ep.parse_targets();
      if (!targets) return targets.status();
      n->targets = *targets;
      if (!ep.accept_name("in")) return ep.error("expected 'in'");
      auto iter = ep.parse_or();  // not a full expression: "if" here filters the loop
      if (!iter) return iter.status();
      n->expr = std::move(*iter);
      ExprPtr filter;
      if (ep.accept_name("if")) {
        auto f = ep.parse_expression();
        if (!f) return f.status();
        filter = std::move(*f);
      }
      ep.accept_name("recursive");
      std::string stopped;
      auto body = body_until({"else", "endfor"}, stopped);
      if (!body) return body.status();
      n->branches.emplace_back(std::move(filter), std::move(*body));
      ++i_;
      if (stopped == "else") {
        std::string end;
        auto else_body = body_until({"endfor"}, end);
        if (!else_body) return else_body.status();
        n->else_body = std::move(*else_body);
        ++i_;
      }
      return n;
    }
    if (keyword == "set") {
      auto targets = ep.parse_targets();
      if (!targets) return targets.status();
      if (ep.accept_op("=")) {
        auto n = node(Node::Kind::SET, line);
        n->targets = *targets;
        auto value = ep.parse_expression();
        if (!value) return value.status();
        n->expr = std::move(*value);
        // "set a = 1, 2" makes a tuple
        if (ep.accept_op(",")) {
          auto tuple = std::make_unique<Expr>();
          tuple->kind = Expr::Kind::TUPLE;
          tuple->children.push_back(std::move(n->expr));
          do {
            auto v = ep.parse_expression();
            if (!v) return v.status();
            tuple->children.push_back(std::move(*v));
          } while (ep.accept_op(","));
          n->expr = std::move(tuple);
        }
        return n;
      }
      auto n = node(Node::Kind::SET_BLOCK, line);
      n->targets = *targets;
      if (ep.peek_op("|")) {  // {% set x | filter %}: the captured body goes through the filters
        auto filters = block_filters(line);
        if (!filters) return filters.status();
        n->expr = std::move(*filters);
      }
      std::string end;
      auto body = body_until({"endset"}, end);
      if (!body) return body.status();
      n->body = std::move(*body);
      ++i_;
      return n;
    }
    if (keyword == "macro" || keyword == "call") {
      auto n = node(keyword == "macro" ? Node::Kind::MACRO : Node::Kind::CALL_BLOCK, line);
      if (keyword == "call" && ep.accept_op("(")) {  // {% call(args) macro(...) %}
        NIB_RETURN_IF_ERROR(parse_params(ep, n->params));
      }
      if (keyword == "macro") {
        auto name = ep.expect_name();
        if (!name) return name.status();
        n->text = *name;
        NIB_RETURN_IF_ERROR(ep.expect_op("("));
        NIB_RETURN_IF_ERROR(parse_params(ep, n->params));
      } else {
        auto call = ep.parse_expression();
        if (!call) return call.status();
        n->expr = std::move(*call);
      }
      std::string end;
      auto body = body_until({keyword == "macro" ? "endmacro" : "endcall"}, end);
      if (!body) return body.status();
      n->body = std::move(*body);
      ++i_;
      return n;
    }
    if (keyword == "filter") {
      auto n = node(Node::Kind::FILTER_BLOCK, line);
      auto filters = block_filters(line);
      if (!filters) return filters.status();
      n->expr = std::move(*filters);
      std::string end;
      auto body = body_until({"endfilter"}, end);
      if (!body) return body.status();
      n->body = std::move(*body);
      ++i_;
      return n;
    }
    if (keyword == "generation") {  // transformers' AssistantTracker: marks text, renders it as is
      std::string end;
      auto body = body_until({"endgeneration"}, end);
      if (!body) return body.status();
      ++i_;
      auto n = node(Node::Kind::IF, line);  // an always-true if holding the body
      auto t = std::make_unique<Expr>();
      t->kind = Expr::Kind::LITERAL;
      t->literal = Value(true);
      n->branches.emplace_back(std::move(t), std::move(*body));
      return n;
    }
    if (keyword == "break") return node(Node::Kind::BREAK, line);
    if (keyword == "continue") return node(Node::Kind::CONTINUE, line);
    return Status::error("line " + std::to_string(line) + ": unknown statement '" + keyword + "'");
  }

  // The filters of a block tag ("{% filter upper | trim %}", "{% set x | indent(2) %}") as an
  // expression applied to the name BLOCK_INPUT, which the interpreter binds to the block's output.
  Result<ExprPtr> block_filters(int line) {
    const Piece& piece = pieces_[i_ - 1];
    std::string rest = piece.content;
    const size_t start = rest.find_first_not_of(" \t\n");
    rest = rest.substr(start);  // "filter upper(...)" or "set x | f"
    const bool is_filter = rest.compare(0, 6, "filter") == 0;
    const size_t at = is_filter ? 6 : rest.find('|') + 1;
    auto tokens = tokenize(std::string(BLOCK_INPUT) + " | " + rest.substr(at), line);
    if (!tokens) return tokens.status();
    ExprParser fp(std::move(*tokens), line);
    auto e = fp.parse_expression();
    if (!e) return e.status();
    if (!fp.at_end()) return fp.error("unexpected token");
    return e;
  }

  Status parse_params(ExprParser& ep, std::vector<std::pair<std::string, ExprPtr>>& params) {
    if (ep.accept_op(")")) return Status::ok();
    do {
      auto name = ep.expect_name();
      if (!name) return name.status();
      ExprPtr def;
      if (ep.accept_op("=")) {
        auto d = ep.parse_expression();
        if (!d) return d.status();
        def = std::move(*d);
      }
      params.emplace_back(*name, std::move(def));
    } while (ep.accept_op(","));
    return ep.expect_op(")");
  }

  std::vector<Piece> pieces_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

Result<NodeList> parse_template(const std::string& source) {
  auto pieces = split_pieces(source);
  if (!pieces) return pieces.status();
  TemplateParser parser(std::move(*pieces));
  return parser.parse_body({}, nullptr);
}

}  // namespace nibble::text::jinja

// Jinja template parsing: the lexer's pieces (text, {{ expression }}, {% statement %}) into the tree,
// each statement's keyword and body here, its expressions by ExprParser (expr_parser.h).
#include "text/jinja/parser.h"

#include "text/jinja/expr_parser.h"
#include "text/jinja/lexer.h"

namespace nibble::text::jinja {
namespace {

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

// The Jinja interpreter. Semantics follow jinja2 3.x with transformers' chat-template environment
// (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols; tojson =
// json.dumps(ensure_ascii=False)). Values behave as Python's: truthiness, ==, repr, slicing.
#include "text/jinja/render.h"

#include <map>

#include "text/jinja/builtins.h"
#include "text/jinja/parser.h"

namespace nibble::text::jinja {
namespace {

enum class Flow { NORMAL, BREAK, CONTINUE };

// Bounds on one render, so a template cannot hang or exhaust the stack: macro calls nested this
// deep (jinja2 stops at Python's recursion limit) and this many executed statements in all.
constexpr int MAX_CALL_DEPTH = 100;
constexpr int64_t MAX_STEPS = 10'000'000;

class Interpreter {
 public:
  explicit Interpreter(const Dict& variables) {
    scopes_.emplace_back();
    for (const auto& [k, v] : variables) scopes_.back()[k] = v;
  }

  Result<Flow> run(const NodeList& nodes, std::string& out) {
    for (const auto& n : nodes) {
      auto flow = exec(*n, out);
      if (!flow) return flow;
      if (*flow != Flow::NORMAL) return flow;
    }
    return Flow::NORMAL;
  }

  Result<Value> eval(const Expr& e);

 private:
  Status error(int line, const std::string& what) const {
    return Status::error("chat template line " + std::to_string(line) + ": " + what);
  }

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    return global(name);
  }

  void assign(const std::string& name, Value v) { scopes_.back()[name] = std::move(v); }

  Result<Flow> exec(const Node& n, std::string& out);
  Result<Flow> exec_for(const Node& n, std::string& out);
  Result<Value> call_macro(const Node& macro, CallArgs& args, const Value* caller);
  Result<Value> apply_filter(const Expr& e, Value input);
  // Evaluates a block's filter expression with BLOCK_INPUT bound to the block's output.
  Result<Value> filter_block_output(const Expr& filters, const std::string& captured) {
    scopes_.emplace_back();
    assign(BLOCK_INPUT, Value(captured));
    auto v = eval(filters);
    scopes_.pop_back();
    return v;
  }

  std::vector<std::map<std::string, Value>> scopes_;
  int call_depth_ = 0;
  int64_t steps_ = 0;
};

Result<Flow> Interpreter::exec(const Node& n, std::string& out) {
  if (++steps_ > MAX_STEPS) return error(n.line, "template takes too many steps (a runaway loop?)");
  switch (n.kind) {
    case Node::Kind::TEXT:
      out += n.text;
      return Flow::NORMAL;
    case Node::Kind::OUTPUT: {
      auto v = eval(*n.expr);
      if (!v) return v.status();
      out += v->str();
      return Flow::NORMAL;
    }
    case Node::Kind::IF:
      for (const auto& [cond, body] : n.branches) {
        auto c = eval(*cond);
        if (!c) return c.status();
        if (c->truthy()) return run(body, out);
      }
      return run(n.else_body, out);
    case Node::Kind::FOR:
      return exec_for(n, out);
    case Node::Kind::SET: {
      auto v = eval(*n.expr);
      if (!v) return v.status();
      if (n.targets.size() == 1) {
        const std::string& t = n.targets[0];
        const size_t dot = t.find('.');
        if (dot == std::string::npos) {
          assign(t, std::move(*v));
        } else {
          Value ns = lookup(t.substr(0, dot));
          if (ns.kind() != Value::Kind::NAMESPACE)
            return error(n.line, "cannot assign attribute on non-namespace object '" + t.substr(0, dot) + "'");
          ns.set(t.substr(dot + 1), std::move(*v));
        }
        return Flow::NORMAL;
      }
      if (!v->is_list() || v->as_list().size() != n.targets.size())
        return error(n.line,
                     "cannot unpack " + v->type_name() + " into " + std::to_string(n.targets.size()) + " names");
      for (size_t i = 0; i < n.targets.size(); ++i) assign(n.targets[i], v->as_list()[i]);
      return Flow::NORMAL;
    }
    case Node::Kind::SET_BLOCK: {
      std::string captured;
      auto f = run(n.body, captured);
      if (!f) return f;
      auto v = n.expr ? filter_block_output(*n.expr, captured) : Result<Value>(Value(captured));
      if (!v) return v.status();
      assign(n.targets[0], *v);
      return Flow::NORMAL;
    }
    case Node::Kind::MACRO: {
      const Node* macro = &n;
      assign(n.text, Value::function([this, macro](CallArgs& args) { return call_macro(*macro, args, nullptr); }));
      return Flow::NORMAL;
    }
    case Node::Kind::CALL_BLOCK: {
      const Node* block = &n;
      // caller() renders the block body with the call's own parameters.
      Value caller = Value::function([this, block](CallArgs& args) -> Result<Value> {
        scopes_.emplace_back();
        for (size_t i = 0; i < block->params.size(); ++i) {
          const Value* v = args.get(i, block->params[i].first);
          if (v)
            assign(block->params[i].first, *v);
          else if (block->params[i].second) {
            auto d = eval(*block->params[i].second);
            if (!d) return d.status();
            assign(block->params[i].first, *d);
          }
        }
        std::string s;
        auto f = run(block->body, s);
        scopes_.pop_back();
        if (!f) return f.status();
        return Value(s);
      });
      const Expr& call = *n.expr;
      if (call.kind != Expr::Kind::CALL) return error(n.line, "{% call %} needs a macro call");
      scopes_.emplace_back();
      assign("caller", caller);
      auto v = eval(call);
      scopes_.pop_back();
      if (!v) return v.status();
      out += v->str();
      return Flow::NORMAL;
    }
    case Node::Kind::FILTER_BLOCK: {
      std::string captured;
      auto f = run(n.body, captured);
      if (!f) return f;
      auto v = filter_block_output(*n.expr, captured);
      if (!v) return v.status();
      out += v->str();
      return Flow::NORMAL;
    }
    case Node::Kind::BREAK:
      return Flow::BREAK;
    case Node::Kind::CONTINUE:
      return Flow::CONTINUE;
  }
  return Flow::NORMAL;
}

Result<Flow> Interpreter::exec_for(const Node& n, std::string& out) {
  auto iterable = eval(*n.expr);
  if (!iterable) return iterable.status();
  List items;
  if (iterable->is_list())
    items = iterable->as_list();
  else if (iterable->is_dict())
    for (const auto& [k, v] : iterable->as_dict()) items.push_back(Value(k));
  else if (iterable->is_string())
    items = string_chars(iterable->as_string());
  else if (iterable->is_undefined() || iterable->is_none())
    items = {};
  else
    return error(n.line, "'" + iterable->type_name() + "' object is not iterable");

  const Expr* filter = n.branches[0].first.get();
  const NodeList& body = n.branches[0].second;
  scopes_.emplace_back();
  auto bind = [&](const Value& item) -> Status {
    if (n.targets.size() == 1) {
      assign(n.targets[0], item);
      return Status::ok();
    }
    if (!item.is_list() || item.as_list().size() != n.targets.size())
      return error(n.line, "cannot unpack loop item into " + std::to_string(n.targets.size()) + " names");
    for (size_t i = 0; i < n.targets.size(); ++i) assign(n.targets[i], item.as_list()[i]);
    return Status::ok();
  };
  if (filter) {  // "for x in xs if cond": filtering happens before loop indices are counted
    List kept;
    for (const Value& item : items) {
      NIB_RETURN_IF_ERROR(bind(item));
      auto c = eval(*filter);
      if (!c) return c.status();
      if (c->truthy()) kept.push_back(item);
    }
    items = std::move(kept);
  }
  const int64_t length = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < length; ++i) {
    if (++steps_ > MAX_STEPS) {
      scopes_.pop_back();
      return error(n.line, "template takes too many steps (a runaway loop?)");
    }
    NIB_RETURN_IF_ERROR(bind(items[i]));
    Dict loop = {{"index", Value(i + 1)},
                 {"index0", Value(i)},
                 {"revindex", Value(length - i)},
                 {"revindex0", Value(length - i - 1)},
                 {"first", Value(i == 0)},
                 {"last", Value(i == length - 1)},
                 {"length", Value(length)},
                 {"depth", Value(int64_t{1})},
                 {"depth0", Value(int64_t{0})},
                 {"previtem", i > 0 ? items[i - 1] : Value()},
                 {"nextitem", i + 1 < length ? items[i + 1] : Value()}};
    const int64_t index = i;
    loop.emplace_back("cycle", Value::function([index](CallArgs& args) -> Result<Value> {
                        if (args.positional.empty()) return Status::error("loop.cycle needs arguments");
                        return args.positional[static_cast<size_t>(index) % args.positional.size()];
                      }));
    assign("loop", Value(std::move(loop)));
    auto flow = run(body, out);
    if (!flow) {
      scopes_.pop_back();
      return flow;
    }
    if (*flow == Flow::BREAK) break;
  }
  scopes_.pop_back();
  if (length == 0) return run(n.else_body, out);
  return Flow::NORMAL;
}

Result<Value> Interpreter::call_macro(const Node& macro, CallArgs& args, const Value* caller) {
  if (call_depth_ >= MAX_CALL_DEPTH) return error(macro.line, "macro '" + macro.text + "' recurses too deeply");
  ++call_depth_;
  struct Leave {
    int& d;
    ~Leave() { --d; }
  } leave{call_depth_};
  scopes_.emplace_back();
  for (size_t i = 0; i < macro.params.size(); ++i) {
    const auto& [name, def] = macro.params[i];
    const Value* v = args.get(i, name);
    if (v) {
      assign(name, *v);
    } else if (def) {
      auto d = eval(*def);
      if (!d) {
        scopes_.pop_back();
        return d.status();
      }
      assign(name, *d);
    } else {
      assign(name, Value());
    }
  }
  List varargs;
  for (size_t i = macro.params.size(); i < args.positional.size(); ++i) varargs.push_back(args.positional[i]);
  assign("varargs", Value(std::move(varargs)));
  if (caller) assign("caller", *caller);
  std::string out;
  auto flow = run(macro.body, out);
  scopes_.pop_back();
  if (!flow) return flow.status();
  return Value(out);
}

Result<Value> Interpreter::apply_filter(const Expr& e, Value input) {
  CallArgs args;
  args.positional.push_back(std::move(input));
  for (size_t i = 1; i < e.children.size(); ++i) {
    auto v = eval(*e.children[i]);
    if (!v) return v.status();
    args.positional.push_back(std::move(*v));
  }
  for (const auto& [k, ex] : e.kwargs) {
    auto v = eval(*ex);
    if (!v) return v.status();
    args.keyword.emplace_back(k, std::move(*v));
  }
  auto r = call_filter(e.name, args);
  if (!r) return error(e.line, r.status().message());
  return r;
}

Result<Value> Interpreter::eval(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::LITERAL:
      return e.literal;
    case Expr::Kind::NAME:
      return lookup(e.name);
    case Expr::Kind::LIST:
    case Expr::Kind::TUPLE: {
      List l;
      for (const auto& c : e.children) {
        auto v = eval(*c);
        if (!v) return v;
        l.push_back(std::move(*v));
      }
      return e.kind == Expr::Kind::TUPLE ? Value::tuple(std::move(l)) : Value(std::move(l));
    }
    case Expr::Kind::DICT: {
      Value d{Dict{}};
      for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
        auto k = eval(*e.children[i]);
        if (!k) return k;
        auto v = eval(*e.children[i + 1]);
        if (!v) return v;
        d.set(k->str(), std::move(*v));
      }
      return d;
    }
    case Expr::Kind::ATTR: {
      auto obj = eval(*e.children[0]);
      if (!obj) return obj;
      auto r = get_attribute(*obj, e.name);
      if (!r) return error(e.line, r.status().message());
      return r;
    }
    case Expr::Kind::ITEM: {
      auto obj = eval(*e.children[0]);
      if (!obj) return obj;
      auto key = eval(*e.children[1]);
      if (!key) return key;
      auto r = get_item(*obj, *key);
      if (!r) return error(e.line, r.status().message());
      return r;
    }
    case Expr::Kind::SLICE: {
      auto obj = eval(*e.children[0]);
      if (!obj) return obj;
      Value parts[3];
      for (int k = 0; k < 3; ++k) {
        if (!e.children[k + 1]) continue;
        auto v = eval(*e.children[k + 1]);
        if (!v) return v;
        parts[k] = *v;
      }
      auto r = slice(*obj, parts[0], parts[1], parts[2]);
      if (!r) return error(e.line, r.status().message());
      return r;
    }
    case Expr::Kind::CALL: {
      auto callee = eval(*e.children[0]);
      if (!callee) return callee;
      if (!callee->is_callable()) return error(e.line, "'" + callee->type_name() + "' object is not callable");
      CallArgs args;
      for (size_t i = 1; i < e.children.size(); ++i) {
        auto v = eval(*e.children[i]);
        if (!v) return v;
        args.positional.push_back(std::move(*v));
      }
      for (const auto& [k, ex] : e.kwargs) {
        auto v = eval(*ex);
        if (!v) return v;
        args.keyword.emplace_back(k, std::move(*v));
      }
      auto r = callee->as_function()(args);
      if (!r) return error(e.line, r.status().message());
      return r;
    }
    case Expr::Kind::FILTER: {
      auto input = eval(*e.children[0]);
      if (!input) return input;
      return apply_filter(e, std::move(*input));
    }
    case Expr::Kind::TEST: {
      auto v = eval(*e.children[0]);
      if (!v) return v;
      List args;
      for (size_t i = 1; i < e.children.size(); ++i) {
        auto a = eval(*e.children[i]);
        if (!a) return a;
        args.push_back(std::move(*a));
      }
      auto r = run_test(e.name, *v, args);
      if (!r) return error(e.line, r.status().message());
      return Value(*r != e.negated);
    }
    case Expr::Kind::UNARY: {
      auto v = eval(*e.children[0]);
      if (!v) return v;
      if (e.name == "not") return Value(!v->truthy());
      auto r = unary_op(e.name, *v);
      if (!r) return error(e.line, r.status().message());
      return r;
    }
    case Expr::Kind::BINARY: {
      auto a = eval(*e.children[0]);
      if (!a) return a;
      if (e.name == "and") return a->truthy() ? eval(*e.children[1]) : a;
      if (e.name == "or") return a->truthy() ? a : eval(*e.children[1]);
      auto b = eval(*e.children[1]);
      if (!b) return b;
      auto r = binary_op(e.name, *a, *b);
      if (!r) return error(e.line, r.status().message());
      return r;
    }
    case Expr::Kind::CONDITIONAL: {
      auto c = eval(*e.children[1]);
      if (!c) return c;
      if (c->truthy()) return eval(*e.children[0]);
      return e.children[2] ? eval(*e.children[2]) : Result<Value>(Value());
    }
  }
  return Value();
}

}  // namespace

Result<std::string> render(const NodeList& nodes, const Dict& variables) {
  Interpreter interpreter(variables);
  std::string out;
  auto flow = interpreter.run(nodes, out);
  if (!flow) return flow.status();
  return out;
}

}  // namespace nibble::text::jinja

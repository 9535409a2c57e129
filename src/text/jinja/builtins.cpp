// Built-in operations, tests, globals and list/dict methods (jinja2/tests.py, jinja2/defaults.py
// and jinja2/sandbox.py semantics; str methods are in pystr.cpp, filters in filters.cpp).
#include "text/jinja/builtins.h"

#include <algorithm>
#include <cmath>
#include <ctime>

#include "text/jinja/pystr.h"
#include "text/utf8.h"

namespace nibble::text::jinja {
namespace {

bool numeric(const Value& v) { return v.is_number() || v.kind() == Value::Kind::BOOL; }
double number_of(const Value& v) { return v.kind() == Value::Kind::BOOL ? double(v.as_bool()) : v.as_number(); }

// ImmutableSandboxedEnvironment refuses the methods that modify a list or dict (jinja2/sandbox.py
// _mutable_spec); everything else that is not a method is an undefined attribute.
Status refused_mutation(const std::string& type, const std::string& name) {
  return Status::error(
      "access to attribute '" + name + "' of '" + type +
      "' object is unsafe (chat templates run immutable, as in jinja2's ImmutableSandboxedEnvironment)");
}

Result<Value> list_method(const Value& l, const std::string& name) {
  static const char* MUTATING[] = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse"};
  if (std::find(std::begin(MUTATING), std::end(MUTATING), name) != std::end(MUTATING))
    return refused_mutation(l.type_name(), name);
  if (name == "count" || name == "index") {
    return Value::function([l, name](CallArgs& a) -> Result<Value> {
      const Value* x = a.get(0, "value");
      if (!x) return Status::error(name + " needs an argument");
      int64_t n = 0;
      for (size_t i = 0; i < l.as_list().size(); ++i) {
        if (!l.as_list()[i].equals(*x)) continue;
        if (name == "index") return Value(static_cast<int64_t>(i));
        ++n;
      }
      if (name == "index") return Status::error("list.index(x): " + x->repr() + " is not in list");
      return Value(n);
    });
  }
  if (name == "copy" && !l.is_tuple())
    return Value::function([l](CallArgs&) -> Result<Value> { return Value(l.as_list()); });
  return Value();
}

int64_t normalize_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }

// A global jinja2 defines that nibble refuses: calling it is an error naming it.
Value refused_global(const std::string& name, const std::string& why) {
  return Value::function(
      [name, why](CallArgs&) -> Result<Value> { return Status::error(name + "() is not supported: " + why); });
}

}  // namespace

Result<Value> dict_method(const Value& d, const std::string& name) {
  static const char* MUTATING[] = {"update", "pop", "popitem", "setdefault", "clear"};
  if (std::find(std::begin(MUTATING), std::end(MUTATING), name) != std::end(MUTATING))
    return refused_mutation("dict", name);
  if (name == "items" || name == "keys" || name == "values") {
    return Value::function([d, name](CallArgs&) -> Result<Value> {
      List out;
      for (const auto& [k, v] : d.as_dict()) {
        if (name == "items")
          out.push_back(Value::tuple({Value(k), v}));
        else if (name == "keys")
          out.push_back(Value(k));
        else
          out.push_back(v);
      }
      return Value(out);
    });
  }
  if (name == "get") {
    return Value::function([d](CallArgs& a) -> Result<Value> {
      const Value* key = a.get(0, "key");
      if (!key) return Status::error("get needs a key");
      const Value* v = d.find(key->str());
      if (v) return *v;
      const Value* def = a.get(1, "default");
      return def ? *def : Value::none();
    });
  }
  if (name == "copy") return Value::function([d](CallArgs&) -> Result<Value> { return Value(d.as_dict()); });
  if (name == "fromkeys") {
    return Value::function([](CallArgs& a) -> Result<Value> {
      const Value* keys = a.get(0, "iterable");
      if (!keys) return Status::error("fromkeys needs an iterable");
      auto items = as_sequence(*keys, "fromkeys");
      if (!items) return items.status();
      const Value* v = a.get(1, "value");
      Value out{Dict{}};
      for (const Value& k : *items) out.set(k.str(), v ? *v : Value::none());
      return out;
    });
  }
  return Value();
}

Result<Value> compare(const std::string& op, const Value& a, const Value& b) {
  int cmp;
  if (numeric(a) && numeric(b)) {
    const double x = number_of(a), y = number_of(b);
    cmp = x < y ? -1 : x > y ? 1 : 0;
  } else if (a.is_string() && b.is_string()) {
    cmp = a.as_string().compare(b.as_string());  // UTF-8 byte order is code point order
  } else if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    cmp = 0;
    const auto &x = a.as_list(), &y = b.as_list();
    for (size_t i = 0; i < std::min(x.size(), y.size()) && cmp == 0; ++i) {
      if (x[i].equals(y[i])) continue;
      auto lt = compare("<", x[i], y[i]);
      if (!lt) return lt;
      cmp = lt->truthy() ? -1 : 1;
    }
    if (cmp == 0) cmp = x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  } else {
    return Status::error("'" + op + "' not supported between instances of '" + a.type_name() + "' and '" +
                         b.type_name() + "'");
  }
  if (op == "<") return Value(cmp < 0);
  if (op == ">") return Value(cmp > 0);
  if (op == "<=") return Value(cmp <= 0);
  return Value(cmp >= 0);
}

Result<bool> contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string())
      return Status::error("'in <string>' requires string as left operand, not " + item.type_name());
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_list()) {
    for (const Value& v : container.as_list())
      if (v.equals(item)) return true;
    return false;
  }
  if (container.is_dict()) return item.is_string() && container.find(item.as_string()) != nullptr;
  if (container.is_undefined()) return Status::error("argument of type 'Undefined' is not iterable");
  return Status::error("argument of type '" + container.type_name() + "' is not iterable");
}

Result<Value> attribute_of(const Value& item, const std::string& path) {
  Value v = item;
  size_t pos = 0;
  while (pos <= path.size()) {
    const size_t dot = path.find('.', pos);
    const std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    auto next = digits ? get_item(v, Value(static_cast<int64_t>(std::stoll(part)))) : get_item(v, Value(part));
    if (!next) return next;
    v = *next;
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  return v;
}

Result<List> as_sequence(const Value& v, const std::string& filter) {
  if (v.is_list()) return v.as_list();
  if (v.is_string()) return string_chars(v.as_string());
  if (v.is_dict()) {
    List keys;
    for (const auto& [k, x] : v.as_dict()) keys.push_back(Value(k));
    return keys;
  }
  if (v.is_undefined() || v.is_none()) return List{};
  return Status::error(filter + ": '" + v.type_name() + "' object is not iterable");
}

List string_chars(const std::string& s) {
  List out;
  for (uint32_t c : code_points(s)) {
    std::string ch;
    append_utf8(ch, c);
    out.push_back(Value(ch));
  }
  return out;
}

Value global(const std::string& name) {
  if (name == "range") {
    return Value::function([](CallArgs& a) -> Result<Value> {
      int64_t start = 0, stop, step = 1;
      for (const Value& v : a.positional)
        if (v.kind() != Value::Kind::INT)
          return Status::error("range: '" + v.type_name() + "' object cannot be interpreted as an integer");
      if (a.positional.size() == 1)
        stop = a.positional[0].as_int();
      else if (a.positional.size() >= 2) {
        start = a.positional[0].as_int();
        stop = a.positional[1].as_int();
        if (a.positional.size() > 2) step = a.positional[2].as_int();
      } else
        return Status::error("range expected at least 1 argument");
      if (step == 0) return Status::error("range() arg 3 must not be zero");
      List out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        out.push_back(Value(i));
        if (out.size() > 1000000) return Status::error("range too large");
      }
      return Value(out);
    });
  }
  if (name == "namespace" || name == "dict") {
    const bool ns = name == "namespace";
    return Value::function([ns](CallArgs& a) -> Result<Value> {
      Value d{Dict{}};
      for (const Value& p : a.positional)
        if (p.is_dict())
          for (const auto& kv : p.as_dict()) d.set(kv.first, kv.second);
      for (const auto& kv : a.keyword) d.set(kv.first, kv.second);
      return ns ? Value::namespace_object(d.as_dict()) : d;
    });
  }
  if (name == "joiner") {  // jinja2.utils.Joiner: "" the first time, then the separator
    return Value::function([](CallArgs& a) -> Result<Value> {
      const Value* sep = a.get(0, "sep");
      const std::string separator = sep ? sep->str() : ", ";
      auto used = std::make_shared<bool>(false);
      return Value::function([separator, used](CallArgs&) -> Result<Value> {
        if (!*used) {
          *used = true;
          return Value(std::string());
        }
        return Value(separator);
      });
    });
  }
  if (name == "cycler") return refused_global(name, "its .current/.next() state is not modelled (use loop.cycle)");
  if (name == "lipsum") return refused_global(name, "it generates random text; a prompt must be reproducible");
  if (name == "raise_exception") {
    return Value::function([](CallArgs& a) -> Result<Value> {
      return Status::error(a.positional.empty() ? std::string("raise_exception called") : a.positional[0].str());
    });
  }
  if (name == "strftime_now") {
    return Value::function([](CallArgs& a) -> Result<Value> {
      const std::time_t now = std::time(nullptr);
      std::tm local{};
      localtime_r(&now, &local);
      char buf[256];
      const std::string fmt = a.positional.empty() ? "%Y-%m-%d" : a.positional[0].str();
      const size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &local);
      return Value(std::string(buf, n));
    });
  }
  return Value();
}

Result<Value> get_attribute(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) return Status::error("'" + name + "' of an undefined value");
  if (obj.is_dict()) {
    if (const Value* v = obj.find(name)) return *v;
    if (obj.kind() == Value::Kind::DICT) return dict_method(obj, name);
    return Value();
  }
  if (obj.is_tuple())
    if (const Value* v = obj.find(name)) return *v;
  if (obj.is_list()) return list_method(obj, name);
  if (obj.is_string()) return string_method(obj.as_string(), name);
  return Value();
}

Result<Value> get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) return Status::error("cannot index an undefined value");
  if (obj.is_dict()) {
    if (const Value* v = obj.find(key.str())) return *v;
    if (key.is_string() && obj.kind() == Value::Kind::DICT) return dict_method(obj, key.as_string());
    return Value();
  }
  if ((obj.is_list() || obj.is_string()) && key.kind() == Value::Kind::INT) {
    if (obj.is_list()) {
      const int64_t n = static_cast<int64_t>(obj.as_list().size()), i = normalize_index(key.as_int(), n);
      return i >= 0 && i < n ? obj.as_list()[i] : Value();
    }
    const List chars = string_chars(obj.as_string());
    const int64_t n = static_cast<int64_t>(chars.size()), i = normalize_index(key.as_int(), n);
    return i >= 0 && i < n ? chars[i] : Value();
  }
  if (key.is_string()) return get_attribute(obj, key.as_string());
  return Value();
}

Result<Value> slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  List items;
  if (obj.is_list())
    items = obj.as_list();
  else if (obj.is_string())
    items = string_chars(obj.as_string());
  else
    return Status::error("'" + obj.type_name() + "' object is not subscriptable");
  const int64_t n = static_cast<int64_t>(items.size());
  const int64_t st = step.kind() == Value::Kind::INT ? step.as_int() : 1;
  if (st == 0) return Status::error("slice step cannot be zero");
  auto bound = [&](const Value& v, int64_t def) {
    if (v.kind() != Value::Kind::INT) return def;
    int64_t i = v.as_int();
    if (i < 0) i += n;
    return st > 0 ? std::clamp<int64_t>(i, 0, n) : std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t b = bound(start, st > 0 ? 0 : n - 1), e = bound(stop, st > 0 ? n : -1);
  List out;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) out.push_back(items[i]);
  if (obj.is_string()) {
    std::string s;
    for (const Value& c : out) s += c.as_string();
    return Value(s);
  }
  return obj.is_tuple() ? Value::tuple(out) : Value(out);
}

Result<Value> unary_op(const std::string& op, const Value& v) {
  if (!numeric(v)) return Status::error("bad operand type for unary " + op + ": '" + v.type_name() + "'");
  if (v.kind() == Value::Kind::BOOL) return Value(op == "+" ? int64_t{v.as_bool()} : -int64_t{v.as_bool()});
  if (op == "+") return v;
  return v.kind() == Value::Kind::INT ? Value(-v.as_int()) : Value(-v.as_number());
}

Result<Value> binary_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return Value(a.equals(b));
  if (op == "!=") return Value(!a.equals(b));
  if (op == "<" || op == ">" || op == "<=" || op == ">=") return compare(op, a, b);
  if (op == "in" || op == "not in") {
    auto r = contains(b, a);
    if (!r) return r.status();
    return Value(op == "in" ? *r : !*r);
  }
  if (op == "~") return Value(a.str() + b.str());
  if (op == "%" && a.is_string()) {  // printf-style formatting: 'x=%d' % 3, '%s/%s' % (a, b)
    auto r = percent_format(a.as_string(), b);
    if (!r) return r.status();
    return Value(*r);
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      List l = a.as_list();
      l.insert(l.end(), b.as_list().begin(), b.as_list().end());
      return a.is_tuple() ? Value::tuple(l) : Value(l);
    }
  }
  if (op == "*" && ((a.is_string() || a.is_list()) && b.kind() == Value::Kind::INT)) {
    const size_t unit = a.is_string() ? a.as_string().size() : a.as_list().size();
    if (b.as_int() > 0 && unit * static_cast<uint64_t>(b.as_int()) > 10'000'000)
      return Status::error("repetition result too large");
    if (a.is_string()) {
      std::string s;
      for (int64_t i = 0; i < b.as_int(); ++i) s += a.as_string();
      return Value(s);
    }
    List l;
    for (int64_t i = 0; i < b.as_int(); ++i) l.insert(l.end(), a.as_list().begin(), a.as_list().end());
    return a.is_tuple() ? Value::tuple(l) : Value(l);
  }
  if (!numeric(a) || !numeric(b))
    return Status::error("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() +
                         "'");
  auto as_int = [](const Value& v) { return v.kind() == Value::Kind::BOOL ? int64_t{v.as_bool()} : v.as_int(); };
  const bool ints = a.kind() != Value::Kind::FLOAT && b.kind() != Value::Kind::FLOAT;
  const double x = number_of(a), y = number_of(b);
  if (op == "+") return ints ? Value(as_int(a) + as_int(b)) : Value(x + y);
  if (op == "-") return ints ? Value(as_int(a) - as_int(b)) : Value(x - y);
  if (op == "*") return ints ? Value(as_int(a) * as_int(b)) : Value(x * y);
  if (op == "/") {
    if (y == 0) return Status::error("division by zero");
    return Value(x / y);
  }
  if (op == "//" || op == "%") {
    if (y == 0) return Status::error("integer division or modulo by zero");
    if (ints) {
      const int64_t p = as_int(a), q = as_int(b);
      int64_t d = p / q, m = p % q;
      if (m != 0 && ((m < 0) != (q < 0))) --d, m += q;  // Python floors
      return op == "//" ? Value(d) : Value(m);
    }
    const double d = std::floor(x / y);
    return op == "//" ? Value(d) : Value(x - d * y);
  }
  if (op == "**")
    return ints && as_int(b) >= 0 ? Value(static_cast<int64_t>(std::llround(std::pow(x, y)))) : Value(std::pow(x, y));
  return Status::error("unknown operator " + op);
}

Result<bool> run_test(const std::string& name, const Value& v, const List& args) {
  using K = Value::Kind;
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.kind() == K::DICT;
  if (name == "iterable") return v.is_list() || v.is_string() || v.kind() == K::DICT;
  if (name == "sequence") return v.is_list() || v.is_string() || v.kind() == K::DICT;
  if (name == "number") return numeric(v);  // bool is a numbers.Number in Python
  if (name == "integer") return v.kind() == K::INT;
  if (name == "float") return v.kind() == K::FLOAT;
  if (name == "boolean") return v.kind() == K::BOOL;
  if (name == "true") return v.kind() == K::BOOL && v.as_bool();
  if (name == "false") return v.kind() == K::BOOL && !v.as_bool();
  if (name == "callable") return v.is_callable();
  if (name == "escaped") return false;  // no Markup values: nothing is marked as escaped
  if (name == "filter") return v.is_string() && has_filter(v.as_string());
  if (name == "test") {
    static const char* TESTS[] = {
        "boolean",  "callable", "defined",  "divisibleby", "eq",          "equalto", "escaped", "even",
        "false",    "filter",   "float",    "ge",          "greaterthan", "gt",      "in",      "integer",
        "iterable", "le",       "lessthan", "lower",       "lt",          "mapping", "ne",      "none",
        "number",   "odd",      "sameas",   "sequence",    "string",      "test",    "true",    "undefined",
        "upper",    "==",       "!=",       "<",           "<=",          ">",       ">="};
    return v.is_string() && std::find(std::begin(TESTS), std::end(TESTS), v.as_string()) != std::end(TESTS);
  }
  if (name == "odd" || name == "even") {
    if (v.kind() != K::INT && v.kind() != K::BOOL)
      return Status::error("odd/even need an integer, got " + v.type_name());
    const int64_t i = v.kind() == K::BOOL ? int64_t{v.as_bool()} : v.as_int();
    return (i % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    if (args.empty() || !numeric(v) || !numeric(args[0]) || number_of(args[0]) == 0)
      return Status::error("divisibleby needs a non-zero number");
    return std::fmod(number_of(v), number_of(args[0])) == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==" || name == "sameas") return !args.empty() && v.equals(args[0]);
  if (name == "ne" || name == "!=") return args.empty() || !v.equals(args[0]);
  static const std::pair<const char*, const char*> ORDER[] = {
      {"lt", "<"}, {"lessthan", "<"}, {"<", "<"},   {"gt", ">"},  {"greaterthan", ">"},
      {">", ">"},  {"le", "<="},      {"<=", "<="}, {"ge", ">="}, {">=", ">="}};
  for (const auto& [test, op] : ORDER) {
    if (name != test) continue;
    if (args.empty()) return Status::error(name + " needs an argument");
    auto r = compare(op, v, args[0]);
    if (!r) return r.status();
    return r->truthy();
  }
  if (name == "in") {
    if (args.empty()) return Status::error("in needs an argument");
    return contains(args[0], v);
  }
  if (name == "lower" || name == "upper") {  // str(value).islower() / isupper()
    auto m = string_method(v.str(), name == "lower" ? "islower" : "isupper");
    CallArgs none;
    auto r = m->as_function()(none);
    if (!r) return r.status();
    return r->as_bool();
  }
  return Status::error("no test named '" + name + "'");
}

}  // namespace nibble::text::jinja

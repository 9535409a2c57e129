// Built-in operations, filters and tests (jinja2/filters.py, jinja2/tests.py semantics).
#include "text/jinja/builtins.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <set>

#include "text/utf8.h"

namespace nibble::text::jinja {
namespace {

Status type_error(const std::string& what) { return Status::error(what); }

bool is_py_space(uint32_t cp) {
  return cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

std::vector<uint32_t> code_points(const std::string& s) {
  std::vector<uint32_t> cps;
  for (size_t i = 0; i < s.size();) cps.push_back(next_code_point(s, i));
  return cps;
}

std::string from_code_points(const std::vector<uint32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end; ++i) append_utf8(out, cps[i]);
  return out;
}

// str.strip / lstrip / rstrip with optional characters (None: whitespace).
std::string strip(const std::string& s, const Value* chars, bool left, bool right) {
  const auto cps = code_points(s);
  std::set<uint32_t> set;
  const bool whitespace = !chars || chars->is_none() || chars->is_undefined();
  if (!whitespace)
    for (uint32_t c : code_points(chars->str())) set.insert(c);
  auto strip_it = [&](uint32_t c) { return whitespace ? is_py_space(c) : set.count(c) > 0; };
  size_t b = 0, e = cps.size();
  if (left) while (b < e && strip_it(cps[b])) ++b;
  if (right) while (e > b && strip_it(cps[e - 1])) --e;
  return from_code_points(cps, b, e);
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) {  // Python inserts `to` between every character
    std::string out;
    const auto cps = code_points(s);
    int64_t n = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || n++ < count) out += to;
      if (i < cps.size()) append_utf8(out, cps[i]);
    }
    return out;
  }
  std::string out;
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t f = s.find(from, pos);
    if (f == std::string::npos) break;
    out += s.substr(pos, f - pos) + to;
    pos = f + from.size();
    ++n;
  }
  return out + s.substr(pos);
}

List split(const std::string& s, const Value* sep, int64_t maxsplit) {
  List out;
  if (!sep || sep->is_none() || sep->is_undefined()) {  // split on runs of whitespace
    const auto cps = code_points(s);
    size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && is_py_space(cps[i])) ++i;
      if (i >= cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        size_t e = cps.size();
        while (e > i && is_py_space(cps[e - 1])) --e;
        out.push_back(Value(from_code_points(cps, i, e)));
        return out;
      }
      size_t j = i;
      while (j < cps.size() && !is_py_space(cps[j])) ++j;
      out.push_back(Value(from_code_points(cps, i, j)));
      i = j;
    }
    return out;
  }
  const std::string d = sep->str();
  size_t pos = 0;
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    const size_t f = s.find(d, pos);
    if (f == std::string::npos) break;
    out.push_back(Value(s.substr(pos, f - pos)));
    pos = f + d.size();
  }
  out.push_back(Value(s.substr(pos)));
  return out;
}

std::string upper_or_lower(const std::string& s, bool upper) {  // ASCII and Latin-1/Greek/Cyrillic basics
  std::string out;
  for (uint32_t c : code_points(s)) {
    if (upper) {
      if (c >= 'a' && c <= 'z') c -= 32;
      else if ((c >= 0xE0 && c <= 0xFE && c != 0xF7) || (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) || (c >= 0x430 && c <= 0x44F)) c -= 32;
      else if (c >= 0x450 && c <= 0x45F) c -= 80;
    } else {
      if (c >= 'A' && c <= 'Z') c += 32;
      else if ((c >= 0xC0 && c <= 0xDE && c != 0xD7) || (c >= 0x391 && c <= 0x3A9) || (c >= 0x410 && c <= 0x42F)) c += 32;
      else if (c >= 0x400 && c <= 0x40F) c += 80;
    }
    append_utf8(out, c);
  }
  return out;
}

Value method(std::function<Result<Value>(CallArgs&)> f) { return Value::function(std::move(f)); }

int64_t int_arg(const CallArgs& a, size_t i, const std::string& name, int64_t def) {
  const Value* v = a.get(i, name);
  return v && v->kind() == Value::Kind::INT ? v->as_int() : def;
}

Result<Value> string_method(const std::string& s, const std::string& name) {
  if (name == "startswith" || name == "endswith") {
    const bool starts = name == "startswith";
    return method([s, starts](CallArgs& a) -> Result<Value> {
      const Value* p = a.get(0, "prefix");
      if (!p) return type_error("startswith/endswith need an argument");
      List options = p->is_list() ? p->as_list() : List{*p};
      for (const Value& o : options) {
        const std::string t = o.str();
        if (t.size() <= s.size() && (starts ? s.compare(0, t.size(), t) == 0 : s.compare(s.size() - t.size(), t.size(), t) == 0))
          return Value(true);
      }
      return Value(false);
    });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool l = name != "rstrip", r = name != "lstrip";
    return method([s, l, r](CallArgs& a) -> Result<Value> { return Value(strip(s, a.get(0, "chars"), l, r)); });
  }
  if (name == "split" || name == "rsplit") {
    return method([s](CallArgs& a) -> Result<Value> { return Value(split(s, a.get(0, "sep"), int_arg(a, 1, "maxsplit", -1))); });
  }
  if (name == "upper" || name == "lower") {
    const bool up = name == "upper";
    return method([s, up](CallArgs&) -> Result<Value> { return Value(upper_or_lower(s, up)); });
  }
  if (name == "replace") {
    return method([s](CallArgs& a) -> Result<Value> {
      const Value *from = a.get(0, "old"), *to = a.get(1, "new");
      if (!from || !to) return type_error("replace needs two arguments");
      return Value(replace_all(s, from->str(), to->str(), int_arg(a, 2, "count", -1)));
    });
  }
  if (name == "title" || name == "capitalize") {
    const bool title = name == "title";
    return method([s, title](CallArgs&) -> Result<Value> {
      std::string out;
      bool start = true;
      for (uint32_t c : code_points(s)) {
        std::string ch;
        append_utf8(ch, c);
        const bool alpha = std::isalpha(static_cast<int>(c < 128 ? c : 'a')) != 0;
        out += (start && alpha) ? upper_or_lower(ch, true) : upper_or_lower(ch, false);
        start = title ? !alpha : false;
      }
      return Value(out);
    });
  }
  if (name == "find" || name == "count") {
    const bool find = name == "find";
    return method([s, find](CallArgs& a) -> Result<Value> {
      const Value* sub = a.get(0, "sub");
      if (!sub) return type_error("find/count need an argument");
      const std::string t = sub->str();
      if (find) {
        const size_t f = s.find(t);
        return Value(f == std::string::npos ? int64_t{-1} : static_cast<int64_t>(code_points(s.substr(0, f)).size()));
      }
      if (t.empty()) return Value(static_cast<int64_t>(code_points(s).size() + 1));
      int64_t n = 0;
      for (size_t p = s.find(t); p != std::string::npos; p = s.find(t, p + t.size())) ++n;
      return Value(n);
    });
  }
  if (name == "join") {
    return method([s](CallArgs& a) -> Result<Value> {
      const Value* items = a.get(0, "iterable");
      if (!items || !items->is_list()) return type_error("join needs a list");
      std::string out;
      for (size_t i = 0; i < items->as_list().size(); ++i) out += (i ? s : "") + items->as_list()[i].str();
      return Value(out);
    });
  }
  if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isalnum") {
    return method([s, name](CallArgs&) -> Result<Value> {
      if (s.empty()) return Value(false);
      for (uint32_t c : code_points(s)) {
        const bool ok = name == "isdigit" ? (c >= '0' && c <= '9')
                        : name == "isspace" ? is_py_space(c)
                        : name == "isalpha" ? (c > 127 || std::isalpha(static_cast<int>(c)))
                                            : (c > 127 || std::isalnum(static_cast<int>(c)));
        if (!ok) return Value(false);
      }
      return Value(true);
    });
  }
  return Value();  // jinja: an unknown attribute is undefined
}

Result<Value> dict_method(const Value& d, const std::string& name) {
  if (name == "items" || name == "keys" || name == "values") {
    return method([d, name](CallArgs&) -> Result<Value> {
      List out;
      for (const auto& [k, v] : d.as_dict()) {
        if (name == "items") out.push_back(Value(List{Value(k), v}));
        else if (name == "keys") out.push_back(Value(k));
        else out.push_back(v);
      }
      return Value(out);
    });
  }
  if (name == "get") {
    return method([d](CallArgs& a) -> Result<Value> {
      const Value* key = a.get(0, "key");
      if (!key) return type_error("get needs a key");
      const Value* v = d.find(key->str());
      if (v) return *v;
      const Value* def = a.get(1, "default");
      return def ? *def : Value::none();
    });
  }
  return Value();
}

int64_t normalize_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }

Result<Value> compare(const std::string& op, const Value& a, const Value& b) {
  int cmp;
  if (a.is_number() && b.is_number()) {
    const double x = a.as_number(), y = b.as_number();
    cmp = x < y ? -1 : x > y ? 1 : 0;
  } else if (a.is_string() && b.is_string()) {
    cmp = a.as_string().compare(b.as_string());
  } else if (a.is_list() && b.is_list()) {
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
    return type_error("'" + op + "' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() + "'");
  }
  if (op == "<") return Value(cmp < 0);
  if (op == ">") return Value(cmp > 0);
  if (op == "<=") return Value(cmp <= 0);
  return Value(cmp >= 0);
}

Result<bool> contains(const Value& container, const Value& item) {
  if (container.is_string()) return container.as_string().find(item.str()) != std::string::npos && item.is_string();
  if (container.is_list()) {
    for (const Value& v : container.as_list())
      if (v.equals(item)) return true;
    return false;
  }
  if (container.is_dict()) return item.is_string() && container.find(item.as_string()) != nullptr;
  if (container.is_undefined()) return type_error("argument of type 'Undefined' is not iterable");
  return type_error("argument of type '" + container.type_name() + "' is not iterable");
}

Result<Value> attribute_of(const Value& item, const std::string& path) {
  Value v = item;
  size_t pos = 0;
  while (pos <= path.size()) {
    const size_t dot = path.find('.', pos);
    const std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    auto next = get_attribute(v, part);
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
  return type_error(filter + ": '" + v.type_name() + "' object is not iterable");
}

std::string indent_text(const std::string& s, const std::string& pad, bool first, bool blank) {
  std::string out;
  size_t pos = 0;
  bool is_first = true;
  while (pos <= s.size()) {
    const size_t nl = s.find('\n', pos);
    const std::string line = s.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    if (!is_first) out += "\n";
    const bool pad_it = is_first ? first : (blank || !line.empty());
    out += (pad_it && (!line.empty() || blank) ? pad : "") + line;
    is_first = false;
    if (nl == std::string::npos) break;
    pos = nl + 1;
  }
  return out;
}

}  // namespace

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
    return method([](CallArgs& a) -> Result<Value> {
      int64_t start = 0, stop, step = 1;
      if (a.positional.size() == 1) stop = a.positional[0].as_int();
      else if (a.positional.size() >= 2) {
        start = a.positional[0].as_int();
        stop = a.positional[1].as_int();
        if (a.positional.size() > 2) step = a.positional[2].as_int();
      } else return type_error("range expected at least 1 argument");
      if (step == 0) return type_error("range() arg 3 must not be zero");
      List out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        out.push_back(Value(i));
        if (out.size() > 1000000) return type_error("range too large");
      }
      return Value(out);
    });
  }
  if (name == "namespace" || name == "dict") {
    const bool ns = name == "namespace";
    return method([ns](CallArgs& a) -> Result<Value> {
      Dict d;
      for (const Value& p : a.positional)
        if (p.is_dict()) for (const auto& kv : p.as_dict()) d.push_back(kv);
      for (const auto& kv : a.keyword) d.push_back(kv);
      return ns ? Value::namespace_object(std::move(d)) : Value(std::move(d));
    });
  }
  if (name == "raise_exception") {
    return method([](CallArgs& a) -> Result<Value> {
      return Status::error(a.positional.empty() ? std::string("raise_exception called") : a.positional[0].str());
    });
  }
  if (name == "strftime_now") {
    return method([](CallArgs& a) -> Result<Value> {
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
  if (obj.is_undefined()) return type_error("'" + name + "' of an undefined value");
  if (obj.is_dict()) {
    if (const Value* v = obj.find(name)) return *v;
    if (obj.kind() == Value::Kind::DICT) return dict_method(obj, name);
    return Value();
  }
  if (obj.is_string()) return string_method(obj.as_string(), name);
  return Value();
}

Result<Value> get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) return type_error("cannot index an undefined value");
  if (obj.is_dict()) {
    if (const Value* v = obj.find(key.str())) return *v;
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
  if (obj.is_list()) items = obj.as_list();
  else if (obj.is_string()) items = string_chars(obj.as_string());
  else return type_error("'" + obj.type_name() + "' object is not subscriptable");
  const int64_t n = static_cast<int64_t>(items.size());
  const int64_t st = step.kind() == Value::Kind::INT ? step.as_int() : 1;
  if (st == 0) return type_error("slice step cannot be zero");
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
  return Value(out);
}

Result<Value> unary_op(const std::string& op, const Value& v) {
  if (!v.is_number()) return type_error("bad operand type for unary " + op + ": '" + v.type_name() + "'");
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
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
    if (a.is_list() && b.is_list()) {
      List l = a.as_list();
      l.insert(l.end(), b.as_list().begin(), b.as_list().end());
      return Value(l);
    }
  }
  if (op == "*" && ((a.is_string() || a.is_list()) && b.kind() == Value::Kind::INT)) {
    const size_t unit = a.is_string() ? a.as_string().size() : a.as_list().size();
    if (b.as_int() > 0 && unit * static_cast<uint64_t>(b.as_int()) > 10'000'000)
      return type_error("repetition result too large");
    if (a.is_string()) {
      std::string s;
      for (int64_t i = 0; i < b.as_int(); ++i) s += a.as_string();
      return Value(s);
    }
    List l;
    for (int64_t i = 0; i < b.as_int(); ++i) l.insert(l.end(), a.as_list().begin(), a.as_list().end());
    return Value(l);
  }
  const bool a_num = a.is_number() || a.kind() == Value::Kind::BOOL, b_num = b.is_number() || b.kind() == Value::Kind::BOOL;
  if (!a_num || !b_num)
    return type_error("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
  auto as_int = [](const Value& v) { return v.kind() == Value::Kind::BOOL ? int64_t{v.as_bool()} : v.as_int(); };
  const bool ints = a.kind() != Value::Kind::FLOAT && b.kind() != Value::Kind::FLOAT;
  const double x = a.kind() == Value::Kind::BOOL ? a.as_bool() : a.as_number();
  const double y = b.kind() == Value::Kind::BOOL ? b.as_bool() : b.as_number();
  if (op == "+") return ints ? Value(as_int(a) + as_int(b)) : Value(x + y);
  if (op == "-") return ints ? Value(as_int(a) - as_int(b)) : Value(x - y);
  if (op == "*") return ints ? Value(as_int(a) * as_int(b)) : Value(x * y);
  if (op == "/") {
    if (y == 0) return type_error("division by zero");
    return Value(x / y);
  }
  if (op == "//" || op == "%") {
    if (y == 0) return type_error("integer division or modulo by zero");
    if (ints) {
      const int64_t p = as_int(a), q = as_int(b);
      int64_t d = p / q, m = p % q;
      if (m != 0 && ((m < 0) != (q < 0))) --d, m += q;  // Python floors
      return op == "//" ? Value(d) : Value(m);
    }
    const double d = std::floor(x / y);
    return op == "//" ? Value(d) : Value(x - d * y);
  }
  if (op == "**") return ints && as_int(b) >= 0 ? Value(static_cast<int64_t>(std::llround(std::pow(x, y)))) : Value(std::pow(x, y));
  return type_error("unknown operator " + op);
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
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind() == K::INT;
  if (name == "float") return v.kind() == K::FLOAT;
  if (name == "boolean") return v.kind() == K::BOOL;
  if (name == "true") return v.kind() == K::BOOL && v.as_bool();
  if (name == "false") return v.kind() == K::BOOL && !v.as_bool();
  if (name == "callable") return v.is_callable();
  if (name == "odd" || name == "even") {
    if (v.kind() != K::INT) return type_error("odd/even need an integer");
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    if (args.empty() || v.kind() != K::INT || args[0].kind() != K::INT || args[0].as_int() == 0)
      return type_error("divisibleby needs integers");
    return v.as_int() % args[0].as_int() == 0;
  }
  if (name == "eq" || name == "equalto" || name == "sameas") return !args.empty() && v.equals(args[0]);
  if (name == "ne") return args.empty() || !v.equals(args[0]);
  if (name == "lt" || name == "gt" || name == "le" || name == "ge") {
    if (args.empty()) return type_error(name + " needs an argument");
    const std::string op = name == "lt" ? "<" : name == "gt" ? ">" : name == "le" ? "<=" : ">=";
    auto r = compare(op, v, args[0]);
    if (!r) return r.status();
    return r->truthy();
  }
  if (name == "in") {
    if (args.empty()) return type_error("in needs an argument");
    return contains(args[0], v);
  }
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return false;
    return upper_or_lower(v.as_string(), name == "upper") == v.as_string();
  }
  return type_error("no test named '" + name + "'");
}

Result<Value> call_filter(const std::string& name, CallArgs& a) {
  const Value& v = a.positional[0];
  auto arg = [&](size_t i, const std::string& key) { return a.get(i, key); };  // i counts the input
  if (name == "tojson") {
    // transformers: json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)
    const Value* indent = arg(1, "indent");
    const Value* sort_keys = arg(2, "sort_keys");
    auto json = v.to_json(indent && indent->kind() == Value::Kind::INT ? static_cast<int>(indent->as_int()) : -1,
                          sort_keys && sort_keys->truthy());
    if (!json) return json.status();
    return Value(*json);
  }
  if (name == "trim") return Value(strip(v.str(), arg(1, "chars"), true, true));
  if (name == "length" || name == "count") {
    if (v.is_string()) return Value(static_cast<int64_t>(code_points(v.as_string()).size()));
    if (v.is_list()) return Value(static_cast<int64_t>(v.as_list().size()));
    if (v.is_dict()) return Value(static_cast<int64_t>(v.as_dict().size()));
    if (v.is_undefined()) return Value(int64_t{0});
    return type_error("object of type '" + v.type_name() + "' has no len()");
  }
  if (name == "upper" || name == "lower") return Value(upper_or_lower(v.str(), name == "upper"));
  if (name == "capitalize" || name == "title") {
    auto m = string_method(v.str(), name);
    CallArgs none;
    return m->as_function()(none);
  }
  if (name == "replace") {
    const Value *from = arg(1, "old"), *to = arg(2, "new");
    if (!from || !to) return type_error("replace needs two arguments");
    return Value(replace_all(v.str(), from->str(), to->str(), a.get(3, "count") ? a.get(3, "count")->as_int() : -1));
  }
  if (name == "join") {
    auto items = as_sequence(v, "join");
    if (!items) return items.status();
    const Value* sep = arg(1, "d");
    const Value* attribute = arg(2, "attribute");
    std::string out;
    for (size_t i = 0; i < items->size(); ++i) {
      Value item = (*items)[i];
      if (attribute) {
        auto x = attribute_of(item, attribute->str());
        if (!x) return x.status();
        item = *x;
      }
      out += (i && sep ? sep->str() : "") + item.str();
    }
    return Value(out);
  }
  if (name == "default" || name == "d") {
    const Value* def = arg(1, "default_value");
    const Value* boolean = arg(2, "boolean");
    const bool use_default = v.is_undefined() || (boolean && boolean->truthy() && !v.truthy());
    return use_default ? (def ? *def : Value(std::string())) : v;
  }
  if (name == "first" || name == "last") {
    auto items = as_sequence(v, name);
    if (!items) return items.status();
    if (items->empty()) return Value();
    return name == "first" ? items->front() : items->back();
  }
  if (name == "list") {
    auto items = as_sequence(v, "list");
    if (!items) return items.status();
    return Value(*items);
  }
  if (name == "items") {
    if (!v.is_dict()) return v.is_undefined() ? Value(List{}) : Result<Value>(type_error("items needs a mapping"));
    List out;
    for (const auto& [k, x] : v.as_dict()) out.push_back(Value(List{Value(k), x}));
    return Value(out);
  }
  if (name == "reverse") {
    if (v.is_string()) return slice(v, Value(), Value(), Value(int64_t{-1}));
    auto items = as_sequence(v, "reverse");
    if (!items) return items.status();
    std::reverse(items->begin(), items->end());
    return Value(*items);
  }
  if (name == "map" || name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    auto items = as_sequence(v, name);
    if (!items) return items.status();
    List out;
    for (const Value& item : *items) {
      if (name == "map") {
        if (const Value* attribute = a.keyword_arg("attribute")) {
          auto x = attribute_of(item, attribute->str());
          if (!x) return x.status();
          if (x->is_undefined()) {
            const Value* def = a.keyword_arg("default");
            out.push_back(def ? *def : *x);
          } else {
            out.push_back(*x);
          }
          continue;
        }
        if (a.positional.size() < 2) return type_error("map needs a filter name or attribute=");
        CallArgs inner;
        inner.positional.push_back(item);
        inner.positional.insert(inner.positional.end(), a.positional.begin() + 2, a.positional.end());
        auto x = call_filter(a.positional[1].str(), inner);
        if (!x) return x;
        out.push_back(*x);
        continue;
      }
      const bool by_attr = name == "selectattr" || name == "rejectattr";
      Value subject = item;
      size_t test_at = 1;
      if (by_attr) {
        if (a.positional.size() < 2) return type_error(name + " needs an attribute");
        auto x = attribute_of(item, a.positional[1].str());
        if (!x) return x.status();
        subject = *x;
        test_at = 2;
      }
      bool pass;
      if (a.positional.size() > test_at) {
        List test_args(a.positional.begin() + static_cast<long>(test_at) + 1, a.positional.end());
        auto t = run_test(a.positional[test_at].str(), subject, test_args);
        if (!t) return t.status();
        pass = *t;
      } else {
        pass = subject.truthy();
      }
      if (pass == (name == "select" || name == "selectattr")) out.push_back(item);
    }
    return Value(out);
  }
  if (name == "unique") {
    auto items = as_sequence(v, "unique");
    if (!items) return items.status();
    List out;
    for (const Value& item : *items)
      if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return o.equals(item); })) out.push_back(item);
    return Value(out);
  }
  if (name == "indent") {
    const Value* width = arg(1, "width");
    const Value* first = arg(2, "first");
    const Value* blank = arg(3, "blank");
    std::string pad = width && width->is_string() ? width->as_string()
                                                  : std::string(width ? static_cast<size_t>(width->as_int()) : 4, ' ');
    return Value(indent_text(v.str(), pad, first && first->truthy(), blank && blank->truthy()));
  }
  if (name == "string") return Value(v.str());
  if (name == "safe" || name == "e" || name == "escape") {
    if (name == "safe") return v;
    std::string out;
    for (char c : v.str()) {
      if (c == '&') out += "&amp;";
      else if (c == '<') out += "&lt;";
      else if (c == '>') out += "&gt;";
      else if (c == '"') out += "&#34;";
      else if (c == '\'') out += "&#39;";
      else out += c;
    }
    return Value(out);
  }
  if (name == "int") {
    const Value* def = arg(1, "default");
    if (v.kind() == Value::Kind::INT) return v;
    if (v.kind() == Value::Kind::FLOAT) return Value(static_cast<int64_t>(v.as_number()));
    if (v.kind() == Value::Kind::BOOL) return Value(int64_t{v.as_bool()});
    if (v.is_string()) {
      try {
        size_t used = 0;
        const std::string s = strip(v.as_string(), nullptr, true, true);
        const int64_t i = std::stoll(s, &used);
        if (used == s.size()) return Value(i);
        return Value(static_cast<int64_t>(std::stod(s)));
      } catch (...) {
      }
    }
    return def ? *def : Value(int64_t{0});
  }
  if (name == "float") {
    if (v.is_number()) return Value(v.as_number());
    try {
      return Value(std::stod(v.str()));
    } catch (...) {
      return Value(0.0);
    }
  }
  if (name == "abs") return v.kind() == Value::Kind::INT ? Value(std::abs(v.as_int())) : Value(std::fabs(v.as_number()));
  if (name == "sum" || name == "min" || name == "max") {
    auto items = as_sequence(v, name);
    if (!items) return items.status();
    if (name == "sum") {
      Value total(int64_t{0});
      for (const Value& x : *items) {
        auto t = binary_op("+", total, x);
        if (!t) return t;
        total = *t;
      }
      return total;
    }
    if (items->empty()) return Value();
    Value best = items->front();
    for (const Value& x : *items) {
      auto lt = compare("<", x, best);
      if (!lt) return lt;
      if (lt->truthy() == (name == "min")) best = x;
    }
    return best;
  }
  if (name == "dictsort" || name == "sort") {
    List items;
    if (name == "dictsort") {
      if (!v.is_dict()) return type_error("dictsort needs a mapping");
      for (const auto& [k, x] : v.as_dict()) items.push_back(Value(List{Value(k), x}));
    } else {
      auto seq = as_sequence(v, "sort");
      if (!seq) return seq.status();
      items = *seq;
    }
    const Value* reverse = arg(name == "sort" ? 1 : 2, "reverse");
    const Value* attribute = a.keyword_arg("attribute");
    Status failure;
    auto key = [&](const Value& x) -> Value {
      if (name == "dictsort") return x.as_list()[0];
      if (attribute) {
        auto r = attribute_of(x, attribute->str());
        return r ? *r : Value();
      }
      return x;
    };
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      auto lt = compare("<", key(x), key(y));
      if (!lt) {
        failure = lt.status();
        return false;
      }
      return lt->truthy();
    });
    NIB_RETURN_IF_ERROR(failure);
    if (reverse && reverse->truthy()) std::reverse(items.begin(), items.end());
    return Value(items);
  }
  if (name == "wordcount") return Value(static_cast<int64_t>(split(v.str(), nullptr, -1).size()));
  if (name == "center" || name == "format" || name == "round") {
    if (name == "round") {
      const int64_t precision = int_arg(a, 1, "precision", 0);
      const double scale = std::pow(10.0, static_cast<double>(precision));
      return Value(std::nearbyint(v.as_number() * scale) / scale);
    }
    return type_error("filter '" + name + "' is not supported");
  }
  return type_error("no filter named '" + name + "'");
}

}  // namespace nibble::text::jinja

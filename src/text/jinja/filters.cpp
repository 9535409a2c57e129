// Jinja's built-in filters with jinja2/filters.py semantics (jinja2 3.1), and tojson as
// transformers overrides it; those over sequences are in filters_sequence.cpp. Four filters whose
// output is random or layout heuristics are refused with an error naming them.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "text/jinja/builtins.h"
#include "text/jinja/pystr.h"
#include "text/utf8.h"

namespace nibble::text::jinja {
namespace {

const char* const FILTERS[] = {"abs",    "attr",       "batch",       "capitalize", "center",   "count",
                               "d",      "default",    "dictsort",    "e",          "escape",   "filesizeformat",
                               "first",  "float",      "forceescape", "format",     "groupby",  "indent",
                               "int",    "items",      "join",        "last",       "length",   "list",
                               "lower",  "map",        "max",         "min",        "pprint",   "random",
                               "reject", "rejectattr", "replace",     "reverse",    "round",    "safe",
                               "select", "selectattr", "slice",       "sort",       "string",   "striptags",
                               "sum",    "title",      "tojson",      "trim",       "truncate", "unique",
                               "upper",  "urlencode",  "urlize",      "wordcount",  "wordwrap", "xmlattr"};

std::string escape_html(const std::string& s) {  // markupsafe.escape
  std::string out;
  for (char c : s) {
    if (c == '&')
      out += "&amp;";
    else if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '"')
      out += "&#34;";
    else if (c == '\'')
      out += "&#39;";
    else
      out += c;
  }
  return out;
}

// html.unescape for numeric references and the entities markup commonly holds; other named
// entities stay as written (Python knows all 2,231 HTML5 names).
std::string unescape_html(const std::string& s) {
  static const std::pair<const char*, const char*> NAMED[] = {{"amp", "&"},   {"lt", "<"},   {"gt", ">"},
                                                              {"quot", "\""}, {"apos", "'"}, {"nbsp", "\xc2\xa0"}};
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '&') {
      const size_t semi = s.find(';', i);
      if (semi != std::string::npos && semi - i <= 10) {
        const std::string name = s.substr(i + 1, semi - i - 1);
        if (name.size() > 1 && name[0] == '#') {
          const bool hex = name[1] == 'x' || name[1] == 'X';
          char* end = nullptr;
          const long cp = std::strtol(name.c_str() + (hex ? 2 : 1), &end, hex ? 16 : 10);
          if (*end == 0 && cp > 0 && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF)) {
            append_utf8(out, static_cast<uint32_t>(cp));
            i = semi;
            continue;
          }
        }
        bool found = false;
        for (const auto& [n, text] : NAMED)
          if (name == n) out += text, i = semi, found = true;
        if (found) continue;
      }
    }
    out += s[i];
  }
  return out;
}

std::string url_quote(const std::string& s, bool for_query) {  // urllib.parse.quote_from_bytes
  static const char* HEX = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '_' || c == '.' || c == '-' || c == '~' || (!for_query && c == '/'))
      out += static_cast<char>(c);
    else if (for_query && c == ' ')
      out += '+';
    else
      out += std::string("%") + HEX[c >> 4] + HEX[c & 15];
  }
  return out;
}

// indent: jinja2 appends "\n" and uses str.splitlines, so every line-break kind becomes "\n".
std::string indent_text(const std::string& s, const std::string& pad, bool first, bool blank) {
  auto m = string_method(s + "\n", "splitlines");
  CallArgs none;
  const List lines = m->as_function()(none)->as_list();
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i].as_string();
    if (i > 0) out += "\n" + ((blank || !line.empty()) ? pad : std::string());
    out += line;
  }
  return first ? pad + out : out;
}

Result<Value> round_value(const Value& v, int64_t precision, const std::string& how) {
  if (!v.is_number() && v.kind() != Value::Kind::BOOL)
    return Status::error("round: a number is required, not " + v.type_name());
  const double x = v.kind() == Value::Kind::BOOL ? double(v.as_bool()) : v.as_number();
  if (how == "ceil" || how == "floor") {
    const double scale = std::pow(10.0, static_cast<double>(precision));
    return Value((how == "ceil" ? std::ceil(x * scale) : std::floor(x * scale)) / scale);
  }
  if (how != "common") return Status::error("round: method must be common, ceil or floor");
  if (v.kind() != Value::Kind::FLOAT && precision >= 0)
    return v.kind() == Value::Kind::BOOL ? Value(int64_t{v.as_bool()}) : v;
  if (precision < 0) {  // round(1234.5, -2) == 1200.0: half-even at a power of ten
    const double scale = std::pow(10.0, static_cast<double>(-precision));
    return Value(std::nearbyint(x / scale) * scale);
  }
  // Python's round(x, n): the exact binary value rounded half-even to n decimals, which printf does too.
  char buf[512];
  std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(std::clamp<int64_t>(precision, 0, 300)), x);
  return Value(std::strtod(buf, nullptr));
}

std::string filesize(double bytes, bool binary) {
  const double base = binary ? 1024 : 1000;
  static const char* DECIMAL[] = {"kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"};
  static const char* BINARY[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"};
  char buf[64];
  if (bytes == 1) return "1 Byte";
  if (bytes < base) {
    std::snprintf(buf, sizeof buf, "%lld Bytes", static_cast<long long>(bytes));
    return buf;
  }
  double unit = base;
  for (int i = 0; i < 8; ++i) {
    unit *= base;
    if (bytes < unit || i == 7) {
      std::snprintf(buf, sizeof buf, "%.1f %s", base * bytes / unit, binary ? BINARY[i] : DECIMAL[i]);
      return buf;
    }
  }
  return buf;
}

}  // namespace

bool bool_arg(const CallArgs& a, size_t i, const std::string& name, bool def) {
  const Value* v = a.get(i, name);
  return v ? v->truthy() : def;
}

bool has_filter(const std::string& name) {
  return std::find(std::begin(FILTERS), std::end(FILTERS), name) != std::end(FILTERS);
}

Result<Value> call_filter(const std::string& name, CallArgs& a) {
  const Value& v = a.positional[0];
  auto arg = [&](size_t i, const std::string& key) { return a.get(i, key); };  // i counts the input
  auto int_arg = [&](size_t i, const std::string& key, int64_t def) -> int64_t {
    const Value* x = arg(i, key);
    return x && x->kind() == Value::Kind::INT ? x->as_int() : def;
  };
  if (name == "tojson") {
    // transformers' override: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
    // = json.dumps with those arguments.
    Value::JsonStyle style;
    style.ensure_ascii = bool_arg(a, 1, "ensure_ascii", false);
    const Value* indent = arg(2, "indent");
    if (indent && indent->kind() == Value::Kind::INT) style.indent = static_cast<int>(indent->as_int());
    if (const Value* sep = arg(3, "separators"); sep && sep->is_list()) {
      if (sep->as_list().size() != 2 || !sep->as_list()[0].is_string() || !sep->as_list()[1].is_string())
        return Status::error("tojson: separators must be an (item_separator, key_separator) pair of strings");
      style.custom_separators = true;
      style.item_sep = sep->as_list()[0].as_string();
      style.key_sep = sep->as_list()[1].as_string();
    }
    style.sort_keys = bool_arg(a, 4, "sort_keys", false);
    auto json = v.to_json(style);
    if (!json) return json.status();
    return Value(*json);
  }
  if (name == "trim") return Value(py_strip(v.str(), arg(1, "chars"), true, true));
  if (name == "length" || name == "count") {
    if (v.is_string()) return Value(py_len(v.as_string()));
    if (v.is_list()) return Value(static_cast<int64_t>(v.as_list().size()));
    if (v.is_dict()) return Value(static_cast<int64_t>(v.as_dict().size()));
    if (v.is_undefined()) return Value(int64_t{0});
    return Status::error("object of type '" + v.type_name() + "' has no len()");
  }
  if (name == "upper") return Value(py_upper(v.str()));
  if (name == "lower") return Value(py_lower(v.str()));
  if (name == "capitalize") {
    CallArgs none;
    return string_method(v.str(), "capitalize")->as_function()(none);
  }
  if (name == "title") {  // jinja2 splits words at runs of [-\s({\[<], unlike str.title
    const auto cps = code_points(v.str());
    std::string out;
    bool word_start = true;
    for (uint32_t c : cps) {
      const bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_isspace(c);
      std::string ch = from_code_points({c}, 0, 1);
      out += sep ? ch : word_start ? py_upper(ch) : py_lower(ch);
      word_start = sep;
    }
    return Value(out);
  }
  if (name == "replace") {
    const Value *from = arg(1, "old"), *to = arg(2, "new");
    if (!from || !to) return Status::error("replace needs two arguments");
    return Value(py_replace(v.str(), from->str(), to->str(), int_arg(3, "count", -1)));
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
    const bool use_default = v.is_undefined() || (bool_arg(a, 2, "boolean", false) && !v.truthy());
    return use_default ? (def ? *def : Value(std::string())) : v;
  }
  if (auto r = call_sequence_filter(name, a)) return std::move(*r);
  if (name == "indent") {
    const Value* width = arg(1, "width");
    const std::string pad =
        width && width->is_string()
            ? width->as_string()
            : std::string(static_cast<size_t>(std::max<int64_t>(0, width ? width->as_int() : 4)), ' ');
    return Value(indent_text(v.str(), pad, bool_arg(a, 2, "first", false), bool_arg(a, 3, "blank", false)));
  }
  if (name == "string") return Value(v.str());
  if (name == "safe") return v;
  if (name == "e" || name == "escape" || name == "forceescape") return Value(escape_html(v.str()));
  if (name == "striptags") {  // markupsafe: drop comments, then tags, collapse whitespace, unescape
    std::string s = v.str();
    for (const auto& [open, close] : {std::pair<std::string, std::string>{"<!--", "-->"}, {"<", ">"}}) {
      while (true) {
        const size_t start = s.find(open);
        if (start == std::string::npos) break;
        const size_t end = s.find(close, start);
        if (end == std::string::npos) break;
        s = s.substr(0, start) + s.substr(end + close.size());
      }
    }
    std::string joined;
    for (const Value& word : py_split(s, nullptr, -1, false)) joined += (joined.empty() ? "" : " ") + word.as_string();
    return Value(unescape_html(joined));
  }
  if (name == "xmlattr") {
    if (!v.is_dict()) return Status::error("xmlattr needs a mapping");
    std::string out;
    for (const auto& [k, x] : v.as_dict()) {
      if (x.is_none() || x.is_undefined()) continue;
      if (k.find_first_of(" \t\n\r\f\v/>=") != std::string::npos)
        return Status::error("xmlattr: Invalid character in attribute name: '" + k + "'");
      out += (out.empty() ? "" : " ") + escape_html(k) + "=\"" + escape_html(x.str()) + "\"";
    }
    return Value(!out.empty() && bool_arg(a, 1, "autospace", true) ? " " + out : out);
  }
  if (name == "urlencode") {
    if (v.is_string() || !(v.is_list() || v.is_dict())) return Value(url_quote(v.str(), false));
    std::string out;
    auto add = [&](const Value& k, const Value& x) {
      out += (out.empty() ? "" : "&") + url_quote(k.str(), true) + "=" + url_quote(x.str(), true);
    };
    if (v.is_dict()) {
      for (const auto& [k, x] : v.as_dict()) add(Value(k), x);
    } else {
      for (const Value& pair : v.as_list()) {
        if (!pair.is_list() || pair.as_list().size() != 2)
          return Status::error("urlencode: a list needs (key, value) pairs");
        add(pair.as_list()[0], pair.as_list()[1]);
      }
    }
    return Value(out);
  }
  if (name == "int") {
    const Value* def = arg(1, "default");
    const int64_t base = int_arg(2, "base", 10);
    const Value fallback = def ? *def : Value(int64_t{0});
    if (v.kind() == Value::Kind::INT) return v;
    if (v.kind() == Value::Kind::BOOL) return Value(int64_t{v.as_bool()});
    if (v.kind() == Value::Kind::FLOAT) {
      if (!std::isfinite(v.as_number())) return Status::error("int: cannot convert float infinity or NaN to integer");
      return Value(static_cast<int64_t>(v.as_number()));
    }
    if (!v.is_string()) return fallback;
    std::string s = py_strip(v.as_string(), nullptr, true, true);
    s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
    char* end = nullptr;
    errno = 0;
    const long long i = s.empty() ? 0 : std::strtoll(s.c_str(), &end, static_cast<int>(base));
    if (!s.empty() && *end == 0 && errno == 0) return Value(static_cast<int64_t>(i));
    end = nullptr;
    const double d = s.empty() ? 0 : std::strtod(s.c_str(), &end);  // "42.23"|int gives 42
    if (!s.empty() && *end == 0 && std::isfinite(d) && s.find_first_of("xXpP") == std::string::npos)
      return Value(static_cast<int64_t>(d));
    return fallback;
  }
  if (name == "float") {
    const Value* def = arg(1, "default");
    if (v.is_number() || v.kind() == Value::Kind::BOOL)
      return Value(v.kind() == Value::Kind::BOOL ? double(v.as_bool()) : v.as_number());
    if (v.is_string()) {
      const std::string s = py_strip(v.as_string(), nullptr, true, true);
      char* end = nullptr;
      const double d = s.empty() ? 0 : std::strtod(s.c_str(), &end);
      if (!s.empty() && *end == 0 && s.find_first_of("xXpP") == std::string::npos) return Value(d);
    }
    return def ? *def : Value(0.0);
  }
  if (name == "abs") {
    if (v.kind() == Value::Kind::INT) return Value(std::abs(v.as_int()));
    if (v.kind() == Value::Kind::BOOL) return Value(int64_t{v.as_bool()});
    if (v.kind() == Value::Kind::FLOAT) return Value(std::fabs(v.as_number()));
    return Status::error("bad operand type for abs(): '" + v.type_name() + "'");
  }
  if (name == "round") {
    const Value* method = arg(2, "method");
    return round_value(v, int_arg(1, "precision", 0), method ? method->str() : "common");
  }
  if (name == "sum") {
    auto items = as_sequence(v, name);
    if (!items) return items.status();
    const Value* attribute = arg(1, "attribute");
    const Value* start = arg(2, "start");
    Value total = start ? *start : Value(int64_t{0});
    for (const Value& x : *items) {
      Value term = x;
      if (attribute) {
        auto t = attribute_of(x, attribute->str());
        if (!t) return t;
        term = *t;
      }
      auto t = binary_op("+", total, term);
      if (!t) return t;
      total = *t;
    }
    return total;
  }
  if (name == "center") {
    CallArgs width;
    width.positional.push_back(Value(int_arg(1, "width", 80)));
    return string_method(v.str(), "center")->as_function()(width);
  }
  if (name == "format") {  // soft_str(value) % (kwargs or args)
    if (a.positional.size() > 1 && !a.keyword.empty())
      return Status::error("format: can't handle positional and keyword arguments at the same time");
    Value args = a.keyword.empty() ? Value::tuple(List(a.positional.begin() + 1, a.positional.end()))
                                   : Value(Dict(a.keyword.begin(), a.keyword.end()));
    auto r = percent_format(v.str(), args);
    if (!r) return r.status();
    return Value(*r);
  }
  if (name == "truncate") {
    const std::string s = v.str();
    const int64_t length = int_arg(1, "length", 255), leeway = int_arg(4, "leeway", 5);
    const Value* end_arg = arg(3, "end");
    const std::string end = end_arg ? end_arg->str() : "...";
    if (length < py_len(end)) return Status::error("truncate: expected length >= " + std::to_string(py_len(end)));
    if (py_len(s) <= length + leeway) return Value(s);
    const auto cps = code_points(s);
    const std::string head = from_code_points(cps, 0, static_cast<size_t>(length - py_len(end)));
    if (bool_arg(a, 2, "killwords", false)) return Value(head + end);
    Value space(" ");
    return Value(py_split(head, &space, 1, true)[0].as_string() + end);
  }
  if (name == "wordcount") {  // len(re.findall(r"\w+", s))
    int64_t n = 0;
    bool in_word = false;
    for (uint32_t c : code_points(v.str())) {
      const bool w = py_isword(c);
      n += w && !in_word;
      in_word = w;
    }
    return Value(n);
  }
  if (name == "filesizeformat") {
    if (!v.is_number() && !v.is_string()) return Status::error("filesizeformat needs a number");
    const double bytes = v.is_string() ? std::strtod(v.as_string().c_str(), nullptr) : v.as_number();
    return Value(filesize(bytes, bool_arg(a, 1, "binary", false)));
  }
  if (name == "attr") {  // getattr only: a dict's keys are not attributes
    const Value* attribute = arg(1, "name");
    if (!attribute) return Status::error("attr needs a name");
    if (v.kind() == Value::Kind::DICT) return dict_method(v, attribute->str());
    return get_attribute(v, attribute->str());
  }
  if (name == "random" || name == "pprint" || name == "urlize" || name == "wordwrap")
    return Status::error(
        "filter '" + name + "' is not supported in chat templates (" +
        (name == "random"
             ? std::string("a prompt must be reproducible")
             : std::string("its output follows Python's text layout heuristics, which nibble does not reproduce")) +
        ")");
  return Status::error("no filter named '" + name + "'");
}

}  // namespace nibble::text::jinja

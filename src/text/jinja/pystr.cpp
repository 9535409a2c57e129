// Python str semantics (CPython 3 Objects/unicodeobject.c and the format mini-language docs) for
// the Jinja interpreter; Unicode classes come from utf8proc's tables.
#include "text/jinja/pystr.h"

#include <utf8proc.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <set>

#include "text/utf8.h"

namespace nibble::text::jinja {
namespace {

utf8proc_category_t category(uint32_t cp) { return utf8proc_category(static_cast<utf8proc_int32_t>(cp)); }
bool is_upper_cat(uint32_t cp) { return category(cp) == UTF8PROC_CATEGORY_LU; }
bool is_lower_cat(uint32_t cp) { return category(cp) == UTF8PROC_CATEGORY_LL; }
bool is_title_cat(uint32_t cp) { return category(cp) == UTF8PROC_CATEGORY_LT; }
bool is_cased(uint32_t cp) { return is_upper_cat(cp) || is_lower_cat(cp) || is_title_cat(cp); }

std::string upper_cp(uint32_t c) {
  std::string out;
  // Full mappings CPython applies that have no one-to-one form (SpecialCasing.txt).
  if (c == 0xDF) return "SS";
  if (c >= 0xFB00 && c <= 0xFB06) {
    static const char* LIGATURES[] = {"FF", "FI", "FL", "FFI", "FFL", "ST", "ST"};
    return LIGATURES[c - 0xFB00];
  }
  append_utf8(out, static_cast<uint32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c))));
  return out;
}

std::string lower_cp(uint32_t c) {
  std::string out;
  if (c == 0x130) return "i\xcc\x87";  // İ → i + combining dot above
  append_utf8(out, static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
  return out;
}

std::string title_cp(uint32_t c) {
  if (c == 0xDF) return "Ss";
  if (c >= 0xFB00 && c <= 0xFB06) {
    static const char* LIGATURES[] = {"Ff", "Fi", "Fl", "Ffi", "Ffl", "St", "St"};
    return LIGATURES[c - 0xFB00];
  }
  std::string out;
  append_utf8(out, static_cast<uint32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c))));
  return out;
}

int64_t int_arg(const CallArgs& a, size_t i, const std::string& name, int64_t def) {
  const Value* v = a.get(i, name);
  return v && v->kind() == Value::Kind::INT ? v->as_int() : def;
}

Value method(std::function<Result<Value>(CallArgs&)> f) { return Value::function(std::move(f)); }

// Python slice bounds [start, end) from optional arguments, clamped to n.
std::pair<int64_t, int64_t> span_args(const CallArgs& a, size_t first, int64_t n) {
  auto bound = [n](const Value* v, int64_t def) {
    if (!v || v->kind() != Value::Kind::INT) return def;
    int64_t i = v->as_int();
    if (i < 0) i += n;
    return std::clamp<int64_t>(i, 0, n);
  };
  return {bound(a.get(first, "start"), 0), bound(a.get(first + 1, "end"), n)};
}

// Index of needle in hay[start, end), searching from the left or the right; -1 when absent.
int64_t find_cps(const std::vector<uint32_t>& hay, const std::vector<uint32_t>& needle, int64_t start, int64_t end,
                 bool from_right) {
  if (end - start < static_cast<int64_t>(needle.size())) return -1;
  const int64_t last = end - static_cast<int64_t>(needle.size());
  for (int64_t k = 0; k <= last - start; ++k) {
    const int64_t i = from_right ? last - k : start + k;
    if (std::equal(needle.begin(), needle.end(), hay.begin() + i)) return i;
  }
  return -1;
}

// ---- the format mini-language, shared by `%` and str.format ----
struct Spec {
  std::string fill = " ";
  char align = 0;  // '<', '>', '^', '=' or 0 (the type's default)
  char sign = '-';
  bool alternate = false;
  int64_t width = 0;
  char grouping = 0;
  int64_t precision = -1;
  char type = 0;
};

std::string group_digits(const std::string& digits, char sep, int every) {
  std::string out;
  const int n = static_cast<int>(digits.size());
  for (int i = 0; i < n; ++i) {
    if (i > 0 && (n - i) % every == 0) out += sep;
    out += digits[i];
  }
  return out;
}

// sign + prefix + body padded to spec.width ('=' pads between the sign/prefix and the body).
std::string pad_number(const std::string& sign, const std::string& prefix, const std::string& body, const Spec& spec) {
  const int64_t len = py_len(sign + prefix + body);
  const char align = spec.align ? spec.align : '>';
  if (len >= spec.width) return sign + prefix + body;
  if (align == '=') {
    std::string fill;
    for (int64_t i = 0; i < spec.width - len; ++i) fill += spec.fill;
    return sign + prefix + fill + body;
  }
  return py_pad(sign + prefix + body, spec.width, spec.fill, align);
}

std::string sign_of(bool negative, char sign) {
  if (negative) return "-";
  return sign == '+' ? "+" : sign == ' ' ? " " : "";
}

Result<std::string> format_float(double v, Spec spec) {
  char type = spec.type;
  std::string suffix;
  if (type == '%') {
    v *= 100;
    type = 'f';
    suffix = "%";
  }
  const bool negative = std::signbit(v) && !std::isnan(v);
  const double a = std::fabs(v);
  std::string body;
  if (type == 0 && spec.precision < 0) {
    body = python_float_repr(a);  // str(float)
  } else {
    const int precision = static_cast<int>(spec.precision < 0 ? 6 : spec.precision);
    const char c = type == 0 || type == 'n' ? 'g' : type;
    char fmt[16], buf[512];
    std::snprintf(fmt, sizeof fmt, "%%%s.*%c", spec.alternate ? "#" : "", c);
    std::snprintf(buf, sizeof buf, fmt, precision, a);
    body = buf;
    // Python's general format without a type keeps a decimal point in fixed notation ("1.0", not "1").
    if (type == 0 && std::isfinite(a) && body.find_first_of(".e") == std::string::npos) body += ".0";
  }
  if (spec.grouping && std::isfinite(a)) {
    const size_t end = body.find_first_not_of("0123456789");
    body = group_digits(body.substr(0, end), spec.grouping, 3) + (end == std::string::npos ? "" : body.substr(end));
  }
  return pad_number(sign_of(negative, spec.sign), "", body + suffix, spec);
}

Result<std::string> format_int(int64_t v, const Spec& spec) {
  const bool negative = v < 0;
  const uint64_t a = negative ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  std::string body, prefix;
  switch (spec.type) {
    case 0:
    case 'd':
    case 'n':
    case 'i':
    case 'u': body = std::to_string(a); break;
    case 'x':
    case 'X':
    case 'o':
    case 'b': {
      const int base = spec.type == 'o' ? 8 : spec.type == 'b' ? 2 : 16;
      const char* digits = spec.type == 'X' ? "0123456789ABCDEF" : "0123456789abcdef";
      uint64_t x = a;
      do {
        body.insert(body.begin(), digits[x % base]);
        x /= base;
      } while (x);
      if (spec.alternate) prefix = std::string("0") + (spec.type == 'X' ? 'X' : spec.type);
      break;
    }
    case 'c': {
      if (v < 0 || v > 0x10FFFF) return Status::error("%c arg not in range(0x110000)");
      append_utf8(body, static_cast<uint32_t>(v));
      return py_pad(body, spec.width, spec.fill, spec.align ? spec.align : '<');
    }
    default: return format_float(static_cast<double>(v), spec);
  }
  if (spec.grouping) body = group_digits(body, spec.grouping, spec.type == 0 || spec.type == 'd' || spec.type == 'n' ? 3 : 4);
  return pad_number(sign_of(negative, spec.sign), prefix, body, spec);
}

// One value under a spec, as format(value, spec) does for str, int, bool and float.
Result<std::string> format_value(const Value& v, const Spec& spec, const char* style) {
  const bool numeric_type = spec.type && std::string("bcdoxXneEfFgG%").find(spec.type) != std::string::npos;
  if (v.kind() == Value::Kind::INT || (v.kind() == Value::Kind::BOOL && numeric_type))
    return format_int(v.kind() == Value::Kind::BOOL ? int64_t{v.as_bool()} : v.as_int(), spec);
  if (v.kind() == Value::Kind::FLOAT) {
    if (spec.type && std::string("eEfFgGn%").find(spec.type) == std::string::npos)
      return Status::error(std::string(style) + ": unknown format code '" + spec.type + "' for object of type 'float'");
    return format_float(v.as_number(), spec);
  }
  if (spec.type && spec.type != 's')
    return Status::error(std::string(style) + ": unknown format code '" + spec.type + "' for object of type '" +
                         v.type_name() + "'");
  std::string s = v.str();
  if (spec.precision >= 0) {
    const auto cps = code_points(s);
    s = from_code_points(cps, 0, std::min<size_t>(cps.size(), static_cast<size_t>(spec.precision)));
  }
  return py_pad(s, spec.width, spec.fill, spec.align ? spec.align : '<');
}

// Parses [[fill]align][sign][#][0][width][,|_][.precision][type].
Result<Spec> parse_spec(const std::string& text) {
  Spec spec;
  const auto cps = code_points(text);
  size_t i = 0;
  auto is_align = [](uint32_t c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (cps.size() >= 2 && is_align(cps[1])) {
    spec.fill = from_code_points(cps, 0, 1);
    spec.align = static_cast<char>(cps[1]);
    i = 2;
  } else if (!cps.empty() && is_align(cps[0])) {
    spec.align = static_cast<char>(cps[0]);
    i = 1;
  }
  if (i < cps.size() && (cps[i] == '+' || cps[i] == '-' || cps[i] == ' ')) spec.sign = static_cast<char>(cps[i++]);
  if (i < cps.size() && cps[i] == '#') spec.alternate = true, ++i;
  if (i < cps.size() && cps[i] == '0') {
    if (!spec.align) spec.fill = "0", spec.align = '=';
    ++i;
  }
  while (i < cps.size() && cps[i] >= '0' && cps[i] <= '9') spec.width = spec.width * 10 + (cps[i++] - '0');
  if (i < cps.size() && (cps[i] == ',' || cps[i] == '_')) spec.grouping = static_cast<char>(cps[i++]);
  if (i < cps.size() && cps[i] == '.') {
    ++i;
    spec.precision = 0;
    if (i >= cps.size() || cps[i] < '0' || cps[i] > '9') return Status::error("format: format specifier missing precision");
    while (i < cps.size() && cps[i] >= '0' && cps[i] <= '9') spec.precision = spec.precision * 10 + (cps[i++] - '0');
  }
  if (i < cps.size()) spec.type = static_cast<char>(cps[i++]);
  if (i != cps.size()) return Status::error("format: invalid format specifier '" + text + "'");
  return spec;
}

}  // namespace

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

int64_t py_len(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool py_isspace(uint32_t cp) {
  return cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

bool py_isalpha(uint32_t cp) {
  const auto c = category(cp);
  return c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
}

bool py_isdecimal(uint32_t cp) { return category(cp) == UTF8PROC_CATEGORY_ND; }

bool py_isdigit(uint32_t cp) {
  if (py_isdecimal(cp)) return true;
  // Numeric_Type=Digit outside Nd: superscripts, subscripts, circled and parenthesized digits.
  return cp == 0xB2 || cp == 0xB3 || cp == 0xB9 || (cp >= 0x2070 && cp <= 0x2079 && cp != 0x2071 && cp != 0x2072 && cp != 0x2073) ||
         (cp >= 0x2080 && cp <= 0x2089) || (cp >= 0x2460 && cp <= 0x2468) || (cp >= 0x2474 && cp <= 0x247C) ||
         (cp >= 0x2488 && cp <= 0x2490) || cp == 0x24EA || (cp >= 0x24F5 && cp <= 0x24FD) || cp == 0x24FF ||
         (cp >= 0x2776 && cp <= 0x277E) || (cp >= 0x2780 && cp <= 0x2788) || (cp >= 0x278A && cp <= 0x2792) ||
         (cp >= 0x1369 && cp <= 0x1371) || cp == 0x19DA || (cp >= 0x1F100 && cp <= 0x1F10A);
}

bool py_isnumeric(uint32_t cp) {
  const auto c = category(cp);
  if (c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO) return true;
  // Han numerals (Numeric_Type=Numeric in Unihan) that templates may meet: 〇一二三四五六七八九十百千万亿.
  static const std::set<uint32_t> HAN = {0x3007, 0x4E00, 0x4E8C, 0x4E09, 0x56DB, 0x4E94, 0x516D, 0x4E03,
                                         0x516B, 0x4E5D, 0x5341, 0x767E, 0x5343, 0x4E07, 0x4EBF, 0x5104, 0x96F6};
  return HAN.count(cp) > 0;
}

bool py_isalnum(uint32_t cp) { return py_isalpha(cp) || py_isnumeric(cp); }
bool py_isword(uint32_t cp) { return cp == '_' || py_isalnum(cp); }

std::string py_upper(const std::string& s) {
  std::string out;
  for (uint32_t c : code_points(s)) out += upper_cp(c);
  return out;
}

std::string py_lower(const std::string& s) {
  const auto cps = code_points(s);
  std::string out;
  for (size_t i = 0; i < cps.size(); ++i) {
    // CPython's Final_Sigma rule: Σ after a cased letter and not before one lowers to ς.
    if (cps[i] == 0x3A3 && i > 0 && is_cased(cps[i - 1]) && (i + 1 == cps.size() || !is_cased(cps[i + 1]))) {
      out += "\xcf\x82";
      continue;
    }
    out += lower_cp(cps[i]);
  }
  return out;
}

std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  const auto cps = code_points(s);
  std::set<uint32_t> set;
  const bool whitespace = !chars || chars->is_none() || chars->is_undefined();
  if (!whitespace)
    for (uint32_t c : code_points(chars->str())) set.insert(c);
  auto strip_it = [&](uint32_t c) { return whitespace ? py_isspace(c) : set.count(c) > 0; };
  size_t b = 0, e = cps.size();
  if (left) while (b < e && strip_it(cps[b])) ++b;
  if (right) while (e > b && strip_it(cps[e - 1])) --e;
  return from_code_points(cps, b, e);
}

List py_split(const std::string& s, const Value* sep, int64_t maxsplit, bool from_right) {
  List out;
  const auto cps = code_points(s);
  const int64_t n = static_cast<int64_t>(cps.size());
  auto piece = [&](int64_t b, int64_t e) { return Value(from_code_points(cps, static_cast<size_t>(b), static_cast<size_t>(e))); };
  auto limited = [&] { return maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit; };
  if (!sep || sep->is_none() || sep->is_undefined()) {  // runs of whitespace; no empty pieces
    if (!from_right) {
      int64_t i = 0;
      while (true) {
        while (i < n && py_isspace(cps[i])) ++i;
        if (i >= n) break;
        if (limited()) {  // the rest, trailing whitespace included (CPython keeps it)
          out.push_back(piece(i, n));
          break;
        }
        int64_t j = i;
        while (j < n && !py_isspace(cps[j])) ++j;
        out.push_back(piece(i, j));
        i = j;
      }
    } else {
      int64_t e = n;
      while (true) {
        while (e > 0 && py_isspace(cps[e - 1])) --e;
        if (e <= 0) break;
        if (limited()) {  // the rest, leading whitespace included
          out.insert(out.begin(), piece(0, e));
          break;
        }
        int64_t b = e;
        while (b > 0 && !py_isspace(cps[b - 1])) --b;
        out.insert(out.begin(), piece(b, e));
        e = b;
      }
    }
    return out;
  }
  const auto d = code_points(sep->str());
  const int64_t m = static_cast<int64_t>(d.size());
  if (!from_right) {
    int64_t pos = 0;
    while (!limited()) {
      const int64_t f = find_cps(cps, d, pos, n, false);
      if (f < 0) break;
      out.push_back(piece(pos, f));
      pos = f + m;
    }
    out.push_back(piece(pos, n));
  } else {
    int64_t end = n;
    while (!limited()) {
      const int64_t f = find_cps(cps, d, 0, end, true);
      if (f < 0) break;
      out.insert(out.begin(), piece(f + m, end));
      end = f;
    }
    out.insert(out.begin(), piece(0, end));
  }
  return out;
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  int64_t n = 0;
  if (from.empty()) {  // Python inserts `to` before every character and at the end
    const auto cps = code_points(s);
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || n++ < count) out += to;
      if (i < cps.size()) append_utf8(out, cps[i]);
    }
    return out;
  }
  size_t pos = 0;
  while (count < 0 || n < count) {
    const size_t f = s.find(from, pos);
    if (f == std::string::npos) break;
    out += s.substr(pos, f - pos) + to;
    pos = f + from.size();
    ++n;
  }
  return out + s.substr(pos);
}

std::string py_pad(const std::string& s, int64_t width, const std::string& fill, char align) {
  const int64_t margin = width - py_len(s);
  if (margin <= 0) return s;
  // format()'s '^' puts the odd extra character on the right (str.center differs: see string_method).
  const int64_t left = align == '>' ? margin : align == '^' ? margin / 2 : 0;
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (int64_t i = 0; i < margin - left; ++i) out += fill;
  return out;
}

Result<std::string> percent_format(const std::string& format, const Value& args) {
  const bool mapping = args.kind() == Value::Kind::DICT;
  List positional;
  if (args.is_list() && args.as_bool()) positional = args.as_list();  // a tuple spreads; a list is one value
  else if (!mapping) positional = {args};
  size_t next = 0;
  bool used_mapping = false;
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out += format[i];
      continue;
    }
    if (++i >= format.size()) return Status::error("format: incomplete format");
    const Value* value = nullptr;
    if (format[i] == '(') {
      const size_t close = format.find(')', i);
      if (close == std::string::npos) return Status::error("format: incomplete format key");
      if (!mapping) return Status::error("format: format requires a mapping");
      value = args.find(format.substr(i + 1, close - i - 1));
      if (!value) return Status::error("format: KeyError: '" + format.substr(i + 1, close - i - 1) + "'");
      used_mapping = true;
      i = close + 1;
    }
    Spec spec;
    spec.align = '>';
    for (; i < format.size() && std::string("-+ #0").find(format[i]) != std::string::npos; ++i) {
      if (format[i] == '-') spec.align = '<';
      else if (format[i] == '+') spec.sign = '+';
      else if (format[i] == ' ' && spec.sign != '+') spec.sign = ' ';
      else if (format[i] == '#') spec.alternate = true;
      else if (spec.align != '<') spec.fill = "0", spec.align = '=';
    }
    auto take_number = [&](int64_t& field) -> Status {
      if (i < format.size() && format[i] == '*') {
        if (next >= positional.size() || positional[next].kind() != Value::Kind::INT)
          return Status::error("format: * wants int");
        field = positional[next++].as_int();
        ++i;
        return Status::ok();
      }
      while (i < format.size() && format[i] >= '0' && format[i] <= '9') field = field * 10 + (format[i++] - '0');
      return Status::ok();
    };
    NIB_RETURN_IF_ERROR(take_number(spec.width));
    if (i < format.size() && format[i] == '.') {
      ++i;
      spec.precision = 0;
      NIB_RETURN_IF_ERROR(take_number(spec.precision));
    }
    while (i < format.size() && (format[i] == 'h' || format[i] == 'l' || format[i] == 'L')) ++i;
    if (i >= format.size()) return Status::error("format: incomplete format");
    const char type = format[i];
    if (type == '%') {
      out += '%';
      continue;
    }
    if (!value) {
      if (mapping) return Status::error("format: format requires a mapping");
      if (next >= positional.size()) return Status::error("format: not enough arguments for format string");
      value = &positional[next++];
    }
    const Value& v = *value;
    const bool number = v.is_number() || v.kind() == Value::Kind::BOOL;
    const double as_double = v.kind() == Value::Kind::BOOL ? double(v.as_bool()) : number ? v.as_number() : 0.0;
    std::string piece;
    if (type == 's' || type == 'r' || type == 'a') {
      Spec s = spec;
      s.fill = " ";
      if (s.align == '=') s.align = '>';
      std::string text = type == 's' ? v.str() : v.repr();
      if (spec.precision >= 0) {
        const auto cps = code_points(text);
        text = from_code_points(cps, 0, std::min<size_t>(cps.size(), static_cast<size_t>(spec.precision)));
      }
      piece = py_pad(text, s.width, " ", s.align);
    } else if (std::string("diuxXoc").find(type) != std::string::npos) {
      if (type == 'c' && v.is_string()) {
        if (py_len(v.as_string()) != 1) return Status::error("format: %c requires an int or a unicode character");
        piece = py_pad(v.as_string(), spec.width, " ", spec.align == '<' ? '<' : '>');
      } else {
        if (!number || (v.kind() == Value::Kind::FLOAT && std::string("xXoc").find(type) != std::string::npos))
          return Status::error(std::string("format: %") + type + " format: an integer is required, not " + v.type_name());
        spec.type = type == 'i' || type == 'u' ? 'd' : type;
        if (spec.alternate && type == 'o') spec.type = 'o';
        const int64_t x = v.kind() == Value::Kind::INT ? v.as_int() : static_cast<int64_t>(as_double);
        if (spec.precision > 0) {  // %.5d: at least that many digits
          Spec digits = spec;
          digits.width = 0;
          digits.sign = '-';
          digits.alternate = false;
          digits.align = '>';
          auto d = format_int(x < 0 ? -x : x, digits);
          if (!d) return d;
          std::string body = std::string(static_cast<size_t>(std::max<int64_t>(0, spec.precision - py_len(*d))), '0') + *d;
          piece = pad_number(sign_of(x < 0, spec.sign), "", body, spec);
        } else {
          auto r = format_int(x, spec);
          if (!r) return r;
          piece = *r;
        }
      }
    } else if (std::string("eEfFgG").find(type) != std::string::npos) {
      if (!number) return Status::error(std::string("format: %") + type + " format: must be real number, not " + v.type_name());
      spec.type = type;
      auto r = format_float(as_double, spec);
      if (!r) return r;
      piece = *r;
    } else {
      return Status::error(std::string("format: unsupported format character '") + type + "'");
    }
    out += piece;
  }
  if (!mapping && next < positional.size()) return Status::error("format: not all arguments converted during string formatting");
  (void)used_mapping;
  return out;
}

Result<std::string> brace_format(const std::string& format, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    const char c = format[i];
    if (c == '}') {
      if (i + 1 < format.size() && format[i + 1] == '}') {
        out += '}';
        ++i;
        continue;
      }
      return Status::error("format: Single '}' encountered in format string");
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < format.size() && format[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    const size_t close = format.find('}', i);
    if (close == std::string::npos) return Status::error("format: Single '{' encountered in format string");
    const std::string field = format.substr(i + 1, close - i - 1);
    i = close;
    if (field.find('{') != std::string::npos) return Status::error("format: nested replacement fields are not supported");
    size_t colon = field.find(':'), bang = field.find('!');
    if (bang != std::string::npos && colon != std::string::npos && bang > colon) bang = std::string::npos;
    const std::string name = field.substr(0, std::min(bang, colon));
    const char conversion = bang != std::string::npos && bang + 1 < field.size() ? field[bang + 1] : 0;
    const std::string spec_text = colon == std::string::npos ? "" : field.substr(colon + 1);
    // arg_name ("." attribute | "[" key "]")*
    size_t end = name.find_first_of(".[");
    const std::string arg_name = name.substr(0, end);
    Value v;
    if (arg_name.empty() || std::all_of(arg_name.begin(), arg_name.end(), ::isdigit)) {
      const size_t index = arg_name.empty() ? auto_index++ : std::stoul(arg_name);
      if (index >= args.positional.size())
        return Status::error("format: Replacement index " + std::to_string(index) + " out of range for positional args tuple");
      v = args.positional[index];
    } else {
      const Value* k = args.keyword_arg(arg_name);
      if (!k) return Status::error("format: KeyError: '" + arg_name + "'");
      v = *k;
    }
    while (end != std::string::npos && end < name.size()) {
      const bool item = name[end] == '[';
      const size_t stop = item ? name.find(']', end) : name.find_first_of(".[", end + 1);
      if (item && stop == std::string::npos) return Status::error("format: Missing ']' in format string");
      const std::string key = name.substr(end + 1, (stop == std::string::npos ? name.size() : stop) - end - 1);
      const Value* found = nullptr;
      Value element;
      if (v.is_list() && !key.empty() && std::all_of(key.begin(), key.end(), ::isdigit)) {
        const size_t k = std::stoul(key);
        if (k < v.as_list().size()) element = v.as_list()[k], found = &element;
      } else {
        found = v.find(key);
      }
      if (!found) return Status::error("format: no element or attribute '" + key + "' in the replacement field '" + name + "'");
      v = *found;
      end = item ? (stop + 1 < name.size() ? stop + 1 : std::string::npos) : stop;
    }
    if (conversion == 'r' || conversion == 'a') v = Value(v.repr());
    else if (conversion == 's') v = Value(v.str());
    else if (conversion) return Status::error(std::string("format: Unknown conversion specifier ") + conversion);
    auto spec = parse_spec(spec_text);
    if (!spec) return spec.status();
    auto piece = format_value(v, *spec, "format");
    if (!piece) return piece;
    out += *piece;
  }
  return out;
}

Result<Value> string_method(const std::string& s, const std::string& name) {
  if (name == "startswith" || name == "endswith") {
    const bool starts = name == "startswith";
    return method([s, starts](CallArgs& a) -> Result<Value> {
      const Value* p = a.get(0, "prefix");
      if (!p) return Status::error(std::string(starts ? "startswith" : "endswith") + " needs an argument");
      const auto cps = code_points(s);
      const auto [b, e] = span_args(a, 1, static_cast<int64_t>(cps.size()));
      const std::string part = from_code_points(cps, static_cast<size_t>(b), static_cast<size_t>(std::max(b, e)));
      for (const Value& o : p->is_list() ? p->as_list() : List{*p}) {
        if (!o.is_string()) return Status::error("startswith/endswith: expected str or a tuple of str, not " + o.type_name());
        const std::string& t = o.as_string();
        if (t.size() <= part.size() &&
            (starts ? part.compare(0, t.size(), t) == 0 : part.compare(part.size() - t.size(), t.size(), t) == 0))
          return Value(true);
      }
      return Value(false);
    });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool l = name != "rstrip", r = name != "lstrip";
    return method([s, l, r](CallArgs& a) -> Result<Value> { return Value(py_strip(s, a.get(0, "chars"), l, r)); });
  }
  if (name == "split" || name == "rsplit") {
    const bool right = name == "rsplit";
    return method([s, right](CallArgs& a) -> Result<Value> {
      const Value* sep = a.get(0, "sep");
      if (sep && sep->is_string() && sep->as_string().empty()) return Status::error("split: empty separator");
      return Value(py_split(s, sep, int_arg(a, 1, "maxsplit", -1), right));
    });
  }
  if (name == "splitlines") {
    return method([s](CallArgs& a) -> Result<Value> {
      const Value* keep = a.get(0, "keepends");
      const bool keepends = keep && keep->truthy();
      const auto cps = code_points(s);
      List out;
      size_t start = 0;
      for (size_t i = 0; i < cps.size(); ++i) {
        const uint32_t c = cps[i];
        const bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
                         c == 0x85 || c == 0x2028 || c == 0x2029;
        if (!brk) continue;
        size_t stop = i + 1;
        if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++stop;
        out.push_back(Value(from_code_points(cps, start, keepends ? stop : i)));
        start = stop;
        i = stop - 1;
      }
      if (start < cps.size()) out.push_back(Value(from_code_points(cps, start, cps.size())));
      return Value(out);
    });
  }
  if (name == "upper" || name == "lower" || name == "casefold" || name == "swapcase" || name == "title" ||
      name == "capitalize") {
    return method([s, name](CallArgs&) -> Result<Value> {
      if (name == "upper") return Value(py_upper(s));
      if (name == "lower") return Value(py_lower(s));
      if (name == "casefold") return Value(py_replace(py_lower(s), "\xc3\x9f", "ss", -1));
      std::string out;
      bool previous_cased = false, first = true;
      for (uint32_t c : code_points(s)) {
        if (name == "swapcase") out += is_upper_cat(c) ? lower_cp(c) : is_lower_cat(c) ? upper_cp(c) : lower_cp(c);
        else if (name == "capitalize") out += first ? title_cp(c) : lower_cp(c);
        else out += previous_cased ? lower_cp(c) : title_cp(c);  // title: a word starts after any uncased character
        previous_cased = is_cased(c);
        first = false;
      }
      return Value(out);
    });
  }
  if (name == "replace") {
    return method([s](CallArgs& a) -> Result<Value> {
      const Value *from = a.get(0, "old"), *to = a.get(1, "new");
      if (!from || !to || !from->is_string() || !to->is_string()) return Status::error("replace needs two str arguments");
      return Value(py_replace(s, from->as_string(), to->as_string(), int_arg(a, 2, "count", -1)));
    });
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    return method([s, name](CallArgs& a) -> Result<Value> {
      const Value* sub = a.get(0, "sub");
      if (!sub || !sub->is_string()) return Status::error(name + " needs a str argument");
      const auto cps = code_points(s), needle = code_points(sub->as_string());
      const auto [b, e] = span_args(a, 1, static_cast<int64_t>(cps.size()));
      if (name == "count") {
        if (needle.empty()) return Value(e >= b ? e - b + 1 : int64_t{0});
        int64_t n = 0;
        for (int64_t p = find_cps(cps, needle, b, e, false); p >= 0; p = find_cps(cps, needle, p + static_cast<int64_t>(needle.size()), e, false)) ++n;
        return Value(n);
      }
      const int64_t f = find_cps(cps, needle, b, e, name[0] == 'r');
      if (f < 0 && name.find("index") != std::string::npos) return Status::error(name + ": substring not found");
      return Value(f);
    });
  }
  if (name == "partition" || name == "rpartition") {
    const bool right = name == "rpartition";
    return method([s, right](CallArgs& a) -> Result<Value> {
      const Value* sep = a.get(0, "sep");
      if (!sep || !sep->is_string() || sep->as_string().empty()) return Status::error("partition needs a non-empty str separator");
      const std::string& d = sep->as_string();
      const size_t f = right ? s.rfind(d) : s.find(d);
      if (f == std::string::npos) return Value::tuple(right ? List{Value(""), Value(""), Value(s)} : List{Value(s), Value(""), Value("")});
      return Value::tuple({Value(s.substr(0, f)), Value(d), Value(s.substr(f + d.size()))});
    });
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const bool prefix = name == "removeprefix";
    return method([s, prefix](CallArgs& a) -> Result<Value> {
      const Value* p = a.get(0, prefix ? "prefix" : "suffix");
      if (!p || !p->is_string()) return Status::error("removeprefix/removesuffix need a str argument");
      const std::string& t = p->as_string();
      if (prefix && s.compare(0, t.size(), t) == 0) return Value(s.substr(t.size()));
      if (!prefix && t.size() <= s.size() && s.compare(s.size() - t.size(), t.size(), t) == 0)
        return Value(s.substr(0, s.size() - t.size()));
      return Value(s);
    });
  }
  if (name == "center" || name == "ljust" || name == "rjust") {
    const char align = name == "center" ? '^' : name == "ljust" ? '<' : '>';
    return method([s, align](CallArgs& a) -> Result<Value> {
      const Value* width = a.get(0, "width");
      const Value* fill = a.get(1, "fillchar");
      if (!width || width->kind() != Value::Kind::INT) return Status::error("center/ljust/rjust need an int width");
      if (fill && (!fill->is_string() || py_len(fill->as_string()) != 1))
        return Status::error("The fill character must be exactly one character long");
      // str.center rounds like CPython's pad(): extra character on the left for an odd width.
      const int64_t margin = width->as_int() - py_len(s);
      const std::string f = fill ? fill->as_string() : " ";
      if (align != '^' || margin <= 0) return Value(py_pad(s, width->as_int(), f, align));
      const int64_t left = margin / 2 + (margin & width->as_int() & 1);
      std::string out;
      for (int64_t i = 0; i < left; ++i) out += f;
      out += s;
      for (int64_t i = 0; i < margin - left; ++i) out += f;
      return Value(out);
    });
  }
  if (name == "zfill") {
    return method([s](CallArgs& a) -> Result<Value> {
      const int64_t width = int_arg(a, 0, "width", 0), margin = width - py_len(s);
      if (margin <= 0) return Value(s);
      const bool sign = !s.empty() && (s[0] == '+' || s[0] == '-');
      return Value((sign ? s.substr(0, 1) : "") + std::string(static_cast<size_t>(margin), '0') + (sign ? s.substr(1) : s));
    });
  }
  if (name == "expandtabs") {
    return method([s](CallArgs& a) -> Result<Value> {
      const int64_t tab = int_arg(a, 0, "tabsize", 8);
      std::string out;
      int64_t column = 0;
      for (uint32_t c : code_points(s)) {
        if (c == '\t') {
          const int64_t n = tab > 0 ? tab - column % tab : 0;
          out += std::string(static_cast<size_t>(n), ' ');
          column += n;
        } else {
          append_utf8(out, c);
          column = (c == '\n' || c == '\r') ? 0 : column + 1;
        }
      }
      return Value(out);
    });
  }
  if (name == "join") {
    return method([s](CallArgs& a) -> Result<Value> {
      const Value* items = a.get(0, "iterable");
      if (!items) return Status::error("join needs an iterable");
      List list = items->is_list() ? items->as_list() : items->is_string() ? List{} : List{};
      if (items->is_string())
        for (uint32_t c : code_points(items->as_string())) list.push_back(Value(from_code_points({c}, 0, 1)));
      else if (items->is_dict())
        for (const auto& kv : items->as_dict()) list.push_back(Value(kv.first));
      else if (!items->is_list()) return Status::error("join: can only join an iterable");
      std::string out;
      for (size_t i = 0; i < list.size(); ++i) {
        if (!list[i].is_string())
          return Status::error("join: sequence item " + std::to_string(i) + ": expected str instance, " + list[i].type_name() + " found");
        out += (i ? s : "") + list[i].as_string();
      }
      return Value(out);
    });
  }
  if (name == "format" || name == "format_map") {
    const bool map = name == "format_map";
    return method([s, map](CallArgs& a) -> Result<Value> {
      CallArgs spread;
      if (map) {
        if (a.positional.empty() || !a.positional[0].is_dict()) return Status::error("format_map needs a mapping");
        for (const auto& kv : a.positional[0].as_dict()) spread.keyword.push_back(kv);
      }
      auto r = brace_format(s, map ? spread : a);
      if (!r) return r.status();
      return Value(*r);
    });
  }
  static const char* PREDICATES[] = {"isdigit", "isdecimal", "isnumeric", "isspace", "isalpha", "isalnum", "isascii",
                                     "islower", "isupper", "istitle", "isidentifier", "isprintable"};
  if (std::find(std::begin(PREDICATES), std::end(PREDICATES), name) != std::end(PREDICATES)) {
    return method([s, name](CallArgs&) -> Result<Value> {
      const auto cps = code_points(s);
      if (name == "isascii") return Value(std::all_of(cps.begin(), cps.end(), [](uint32_t c) { return c < 128; }));
      if (name == "isprintable")
        return Value(std::all_of(cps.begin(), cps.end(), [](uint32_t c) {
          const auto k = category(c);
          return c == ' ' || !(k == UTF8PROC_CATEGORY_CN || (k >= UTF8PROC_CATEGORY_ZS && k <= UTF8PROC_CATEGORY_CO));
        }));
      if (cps.empty()) return Value(false);
      if (name == "islower" || name == "isupper") {
        bool cased = false;
        for (uint32_t c : cps) {
          if (is_title_cat(c) || (name == "islower" ? is_upper_cat(c) : is_lower_cat(c))) return Value(false);
          cased = cased || is_cased(c);
        }
        return Value(cased);
      }
      if (name == "istitle") {
        bool cased = false, previous_cased = false;
        for (uint32_t c : cps) {
          if (is_upper_cat(c) || is_title_cat(c)) {
            if (previous_cased) return Value(false);
            previous_cased = cased = true;
          } else if (is_lower_cat(c)) {
            if (!previous_cased) return Value(false);
            previous_cased = cased = true;
          } else {
            previous_cased = false;
          }
        }
        return Value(cased);
      }
      if (name == "isidentifier") {
        auto start = [](uint32_t c) { return c == '_' || py_isalpha(c) || category(c) == UTF8PROC_CATEGORY_NL; };
        auto rest = [&](uint32_t c) {
          const auto k = category(c);
          return start(c) || k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_MC || k == UTF8PROC_CATEGORY_ND ||
                 k == UTF8PROC_CATEGORY_PC;
        };
        return Value(start(cps[0]) && std::all_of(cps.begin() + 1, cps.end(), rest));
      }
      bool (*test)(uint32_t) = name == "isdigit"     ? py_isdigit
                               : name == "isdecimal" ? py_isdecimal
                               : name == "isnumeric" ? py_isnumeric
                               : name == "isspace"   ? py_isspace
                               : name == "isalpha"   ? py_isalpha
                                                     : py_isalnum;
      return Value(std::all_of(cps.begin(), cps.end(), test));
    });
  }
  if (name == "encode" || name == "translate" || name == "maketrans")
    return Status::error("str." + name + " is not supported in chat templates (bytes and translation tables have no "
                         "place in a prompt)");
  return Value();  // jinja: an unknown attribute is undefined
}

}  // namespace nibble::text::jinja

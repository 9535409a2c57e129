// Python's format mini-language for the Jinja interpreter: printf-style `%` formatting (the
// `format` filter and the operator) and str.format, with CPython's rules for str, int, bool and
// float (docs.python.org "printf-style String Formatting" and "Format Specification Mini-Language").
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "text/jinja/pystr.h"
#include "text/utf8.h"

namespace nibble::text::jinja {
namespace {

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
    case 'u':
      body = std::to_string(a);
      break;
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
    default:
      return format_float(static_cast<double>(v), spec);
  }
  if (spec.grouping)
    body = group_digits(body, spec.grouping, spec.type == 0 || spec.type == 'd' || spec.type == 'n' ? 3 : 4);
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
    if (i >= cps.size() || cps[i] < '0' || cps[i] > '9')
      return Status::error("format: format specifier missing precision");
    while (i < cps.size() && cps[i] >= '0' && cps[i] <= '9') spec.precision = spec.precision * 10 + (cps[i++] - '0');
  }
  if (i < cps.size()) spec.type = static_cast<char>(cps[i++]);
  if (i != cps.size()) return Status::error("format: invalid format specifier '" + text + "'");
  return spec;
}

}  // namespace

Result<std::string> percent_format(const std::string& format, const Value& args) {
  const bool mapping = args.kind() == Value::Kind::DICT;
  List positional;
  if (args.is_list() && args.as_bool())
    positional = args.as_list();  // a tuple spreads; a list is one value
  else if (!mapping)
    positional = {args};
  size_t next = 0;
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
      i = close + 1;
    }
    Spec spec;
    spec.align = '>';
    for (; i < format.size() && std::string("-+ #0").find(format[i]) != std::string::npos; ++i) {
      if (format[i] == '-')
        spec.align = '<';
      else if (format[i] == '+')
        spec.sign = '+';
      else if (format[i] == ' ' && spec.sign != '+')
        spec.sign = ' ';
      else if (format[i] == '#')
        spec.alternate = true;
      else if (spec.align != '<')
        spec.fill = "0", spec.align = '=';
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
          return Status::error(std::string("format: %") + type + " format: an integer is required, not " +
                               v.type_name());
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
          std::string body =
              std::string(static_cast<size_t>(std::max<int64_t>(0, spec.precision - py_len(*d))), '0') + *d;
          piece = pad_number(sign_of(x < 0, spec.sign), "", body, spec);
        } else {
          auto r = format_int(x, spec);
          if (!r) return r;
          piece = *r;
        }
      }
    } else if (std::string("eEfFgG").find(type) != std::string::npos) {
      if (!number)
        return Status::error(std::string("format: %") + type + " format: must be real number, not " + v.type_name());
      spec.type = type;
      auto r = format_float(as_double, spec);
      if (!r) return r;
      piece = *r;
    } else {
      return Status::error(std::string("format: unsupported format character '") + type + "'");
    }
    out += piece;
  }
  if (!mapping && next < positional.size())
    return Status::error("format: not all arguments converted during string formatting");
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
    if (field.find('{') != std::string::npos)
      return Status::error("format: nested replacement fields are not supported");
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
        return Status::error("format: Replacement index " + std::to_string(index) +
                             " out of range for positional args tuple");
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
      if (!found)
        return Status::error("format: no element or attribute '" + key + "' in the replacement field '" + name + "'");
      v = *found;
      end = item ? (stop + 1 < name.size() ? stop + 1 : std::string::npos) : stop;
    }
    if (conversion == 'r' || conversion == 'a')
      v = Value(v.repr());
    else if (conversion == 's')
      v = Value(v.str());
    else if (conversion)
      return Status::error(std::string("format: Unknown conversion specifier ") + conversion);
    auto spec = parse_spec(spec_text);
    if (!spec) return spec.status();
    auto piece = format_value(v, *spec, "format");
    if (!piece) return piece;
    out += *piece;
  }
  return out;
}

}  // namespace nibble::text::jinja

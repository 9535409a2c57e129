// Jinja value semantics: truthiness, str/repr and json.dumps as CPython 3 prints them.
#include "text/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "text/utf8.h"

namespace nibble::text::jinja {

Value Value::none() {
  Value v;
  v.kind_ = Kind::NONE;
  return v;
}
Value::Value(bool b) : kind_(Kind::BOOL), b_(b) {}
Value::Value(int64_t i) : kind_(Kind::INT), i_(i) {}
Value::Value(double d) : kind_(Kind::FLOAT), d_(d) {}
Value::Value(std::string s) : kind_(Kind::STRING), s_(std::make_shared<std::string>(std::move(s))) {}
Value::Value(List l) : kind_(Kind::LIST), list_(std::make_shared<List>(std::move(l))) {}
Value::Value(Dict d) : kind_(Kind::DICT), dict_(std::make_shared<Dict>(std::move(d))) {}

Value Value::tuple(List l) {
  Value v(std::move(l));
  v.b_ = true;
  return v;
}

Value Value::named_tuple(List l, const std::vector<std::string>& fields) {
  Value v = tuple(std::move(l));
  Dict index;
  for (size_t i = 0; i < fields.size(); ++i) index.emplace_back(fields[i], Value(static_cast<int64_t>(i)));
  v.dict_ = std::make_shared<Dict>(std::move(index));
  return v;
}

Value Value::function(Function f) {
  Value v;
  v.kind_ = Kind::FUNCTION;
  v.fn_ = std::make_shared<Function>(std::move(f));
  return v;
}

Value Value::namespace_object(Dict attributes) {
  Value v(std::move(attributes));
  v.kind_ = Kind::NAMESPACE;
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      for (const auto& e : j) l.push_back(from_json(e));
      return Value(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (const auto& [k, e] : j.items()) d.emplace_back(k, from_json(e));
      return Value(std::move(d));
    }
    default:
      return Value();
  }
}

const Value* Value::find(const std::string& key) const {
  if (is_tuple() && dict_) {
    for (const auto& [k, index] : *dict_)
      if (k == key) return &(*list_)[static_cast<size_t>(index.as_int())];
    return nullptr;
  }
  if (!is_dict()) return nullptr;
  for (const auto& [k, v] : *dict_)
    if (k == key) return &v;
  return nullptr;
}

void Value::set(const std::string& key, Value v) {
  for (auto& [k, existing] : *dict_) {
    if (k == key) {
      existing = std::move(v);
      return;
    }
  }
  dict_->emplace_back(key, std::move(v));
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::UNDEFINED:
    case Kind::NONE:
      return false;
    case Kind::BOOL:
      return b_;
    case Kind::INT:
      return i_ != 0;
    case Kind::FLOAT:
      return d_ != 0.0;
    case Kind::STRING:
      return !s_->empty();
    case Kind::LIST:
      return !list_->empty();
    case Kind::DICT:
      return !dict_->empty();
    default:
      return true;
  }
}

std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, end);  // shortest round-trip digits: d.ddde±XX
  const size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  const int exponent = std::stoi(sci.substr(e + 1));
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits += c;
  std::string out;
  if (exponent < -4 || exponent >= 16) {  // Python switches to exponent notation here
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp[16];
    std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += exp;
  } else if (exponent < 0) {
    out = "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
  } else {
    const size_t int_digits = static_cast<size_t>(exponent) + 1;
    if (digits.size() <= int_digits)
      out = digits + std::string(int_digits - digits.size(), '0') + ".0";
    else
      out = digits.substr(0, int_digits) + "." + digits.substr(int_digits);
  }
  return negative ? "-" + out : out;
}

namespace {

std::string quote_python(const std::string& s) {
  // repr(str): single quotes unless the string has ' and no ".
  const bool use_double = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = use_double ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == static_cast<unsigned char>(q))
      out += std::string("\\") + q;
    else if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else
      out += static_cast<char>(c);
  }
  return out + q;
}

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (ensure_ascii && c >= 0x80) {  // a \u escape of 4 hex digits; astral code points as surrogate pairs (json.dumps)
      const uint32_t cp = text::next_code_point(s, i);
      char buf[16];
      if (cp >= 0x10000) {
        const uint32_t v = cp - 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      }
      out += buf;
      continue;
    }
    ++i;
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || (c == 0x7F && ensure_ascii)) {  // json.dumps: DEL is escaped only for ASCII output
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

Status json_dump(const Value& v, std::string& out, const Value::JsonStyle& style, int depth) {
  const int indent = style.indent;
  const bool sort_keys = style.sort_keys;
  const std::string item_sep = style.custom_separators ? style.item_sep : indent >= 0 ? "," : ", ";
  const std::string key_sep = style.custom_separators ? style.key_sep : ": ";
  auto newline = [&](int d) {
    if (indent >= 0) out += "\n" + std::string(static_cast<size_t>(indent * d), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::NONE:
      out += "null";
      return Status::ok();
    case Value::Kind::BOOL:
      out += v.as_bool() ? "true" : "false";
      return Status::ok();
    case Value::Kind::INT:
      out += std::to_string(v.as_int());
      return Status::ok();
    case Value::Kind::FLOAT: {
      const double d = v.as_number();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : python_float_repr(d);
      return Status::ok();
    }
    case Value::Kind::STRING:
      json_string(out, v.as_string(), style.ensure_ascii);
      return Status::ok();
    case Value::Kind::LIST: {
      if (v.as_list().empty()) {
        out += "[]";
        return Status::ok();
      }
      out += "[";
      bool first = true;
      for (const Value& e : v.as_list()) {
        if (!first) out += item_sep;
        first = false;
        newline(depth + 1);
        NIB_RETURN_IF_ERROR(json_dump(e, out, style, depth + 1));
      }
      newline(depth);
      out += "]";
      return Status::ok();
    }
    case Value::Kind::DICT:
    case Value::Kind::NAMESPACE: {
      if (v.as_dict().empty()) {
        out += "{}";
        return Status::ok();
      }
      Dict items = v.as_dict();
      if (sort_keys) std::stable_sort(items.begin(), items.end(), [](auto& a, auto& b) { return a.first < b.first; });
      out += "{";
      bool first = true;
      for (const auto& [k, e] : items) {
        if (!first) out += item_sep;
        first = false;
        newline(depth + 1);
        json_string(out, k, style.ensure_ascii);
        out += key_sep;
        NIB_RETURN_IF_ERROR(json_dump(e, out, style, depth + 1));
      }
      newline(depth);
      out += "}";
      return Status::ok();
    }
    default:
      return Status::error("tojson: Object of type " + v.type_name() + " is not JSON serializable");
  }
}

}  // namespace

std::string Value::str() const {
  switch (kind_) {
    case Kind::UNDEFINED:
      return "";
    case Kind::NONE:
      return "None";
    case Kind::BOOL:
      return b_ ? "True" : "False";
    case Kind::INT:
      return std::to_string(i_);
    case Kind::FLOAT:
      return python_float_repr(d_);
    case Kind::STRING:
      return *s_;
    case Kind::LIST: {
      std::string out = b_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) out += (i ? ", " : "") + (*list_)[i].repr();
      return out + (b_ ? (list_->size() == 1 ? ",)" : ")") : "]");
    }
    case Kind::DICT: {
      std::string out = "{";
      for (size_t i = 0; i < dict_->size(); ++i)
        out += (i ? ", " : "") + quote_python((*dict_)[i].first) + ": " + (*dict_)[i].second.repr();
      return out + "}";
    }
    case Kind::NAMESPACE:
      return "<Namespace>";
    default:
      return "<function>";
  }
}

std::string Value::repr() const { return kind_ == Kind::STRING ? quote_python(*s_) : str(); }

Result<std::string> Value::to_json(const JsonStyle& style) const {
  std::string out;
  NIB_RETURN_IF_ERROR(json_dump(*this, out, style, 0));
  return out;
}

bool Value::equals(const Value& o) const {
  if (is_number() && o.is_number()) {
    if (kind_ == Kind::INT && o.kind_ == Kind::INT) return i_ == o.i_;
    return as_number() == o.as_number();
  }
  if ((kind_ == Kind::BOOL && o.is_number()) || (o.kind_ == Kind::BOOL && is_number())) {
    const double a = kind_ == Kind::BOOL ? (b_ ? 1.0 : 0.0) : as_number();
    const double b = o.kind_ == Kind::BOOL ? (o.b_ ? 1.0 : 0.0) : o.as_number();
    return a == b;
  }
  if (kind_ != o.kind_ || (kind_ == Kind::LIST && b_ != o.b_)) return false;  // (1, 2) != [1, 2]
  switch (kind_) {
    case Kind::UNDEFINED:
    case Kind::NONE:
      return true;
    case Kind::BOOL:
      return b_ == o.b_;
    case Kind::STRING:
      return *s_ == *o.s_;
    case Kind::LIST:
      if (list_->size() != o.list_->size()) return false;
      for (size_t i = 0; i < list_->size(); ++i)
        if (!(*list_)[i].equals((*o.list_)[i])) return false;
      return true;
    case Kind::DICT:
    case Kind::NAMESPACE:
      if (dict_->size() != o.dict_->size()) return false;
      for (const auto& [k, v] : *dict_) {
        const Value* other = o.find(k);
        if (!other || !v.equals(*other)) return false;
      }
      return true;
    default:
      return fn_ == o.fn_;
  }
}

std::string Value::type_name() const {
  if (is_tuple()) return "tuple";
  static const char* NAMES[] = {"Undefined", "NoneType", "bool", "int",      "float",
                                "str",       "list",     "dict", "function", "Namespace"};
  return NAMES[static_cast<int>(kind_)];
}

const Value* CallArgs::get(size_t index, const std::string& name) const {
  for (const auto& [k, v] : keyword)
    if (k == name) return &v;
  return index < positional.size() ? &positional[index] : nullptr;
}

const Value* CallArgs::keyword_arg(const std::string& name) const {
  for (const auto& [k, v] : keyword)
    if (k == name) return &v;
  return nullptr;
}

}  // namespace nibble::text::jinja

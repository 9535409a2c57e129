// Python str semantics (CPython 3 Objects/unicodeobject.c) for the Jinja interpreter: character
// classes from utf8proc's tables, case mapping, strip/split/replace, padding and the str methods
// (the format mini-language is in pyformat.cpp).
#include "text/jinja/pystr.h"

#include <utf8proc.h>

#include <algorithm>
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
  return cp == 0xB2 || cp == 0xB3 || cp == 0xB9 ||
         (cp >= 0x2070 && cp <= 0x2079 && cp != 0x2071 && cp != 0x2072 && cp != 0x2073) ||
         (cp >= 0x2080 && cp <= 0x2089) || (cp >= 0x2460 && cp <= 0x2468) || (cp >= 0x2474 && cp <= 0x247C) ||
         (cp >= 0x2488 && cp <= 0x2490) || cp == 0x24EA || (cp >= 0x24F5 && cp <= 0x24FD) || cp == 0x24FF ||
         (cp >= 0x2776 && cp <= 0x277E) || (cp >= 0x2780 && cp <= 0x2788) || (cp >= 0x278A && cp <= 0x2792) ||
         (cp >= 0x1369 && cp <= 0x1371) || cp == 0x19DA || (cp >= 0x1F100 && cp <= 0x1F10A);
}

bool py_isnumeric(uint32_t cp) {
  const auto c = category(cp);
  if (c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO) return true;
  // Han numerals (Numeric_Type=Numeric in Unihan) that templates may meet: 〇一二三四五六七八九十百千万亿.
  static const std::set<uint32_t> HAN = {0x3007, 0x4E00, 0x4E8C, 0x4E09, 0x56DB, 0x4E94, 0x516D, 0x4E03, 0x516B,
                                         0x4E5D, 0x5341, 0x767E, 0x5343, 0x4E07, 0x4EBF, 0x5104, 0x96F6};
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
  if (left)
    while (b < e && strip_it(cps[b])) ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1])) --e;
  return from_code_points(cps, b, e);
}

List py_split(const std::string& s, const Value* sep, int64_t maxsplit, bool from_right) {
  List out;
  const auto cps = code_points(s);
  const int64_t n = static_cast<int64_t>(cps.size());
  auto piece = [&](int64_t b, int64_t e) {
    return Value(from_code_points(cps, static_cast<size_t>(b), static_cast<size_t>(e)));
  };
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

Result<Value> string_method(const std::string& s, const std::string& name) {
  if (name == "startswith" || name == "endswith") {
    const bool starts = name == "startswith";
    return Value::function([s, starts](CallArgs& a) -> Result<Value> {
      const Value* p = a.get(0, "prefix");
      if (!p) return Status::error(std::string(starts ? "startswith" : "endswith") + " needs an argument");
      const auto cps = code_points(s);
      const auto [b, e] = span_args(a, 1, static_cast<int64_t>(cps.size()));
      const std::string part = from_code_points(cps, static_cast<size_t>(b), static_cast<size_t>(std::max(b, e)));
      for (const Value& o : p->is_list() ? p->as_list() : List{*p}) {
        if (!o.is_string())
          return Status::error("startswith/endswith: expected str or a tuple of str, not " + o.type_name());
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
    return Value::function(
        [s, l, r](CallArgs& a) -> Result<Value> { return Value(py_strip(s, a.get(0, "chars"), l, r)); });
  }
  if (name == "split" || name == "rsplit") {
    const bool right = name == "rsplit";
    return Value::function([s, right](CallArgs& a) -> Result<Value> {
      const Value* sep = a.get(0, "sep");
      if (sep && sep->is_string() && sep->as_string().empty()) return Status::error("split: empty separator");
      return Value(py_split(s, sep, int_arg(a, 1, "maxsplit", -1), right));
    });
  }
  if (name == "splitlines") {
    return Value::function([s](CallArgs& a) -> Result<Value> {
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
    return Value::function([s, name](CallArgs&) -> Result<Value> {
      if (name == "upper") return Value(py_upper(s));
      if (name == "lower") return Value(py_lower(s));
      if (name == "casefold") return Value(py_replace(py_lower(s), "\xc3\x9f", "ss", -1));
      std::string out;
      bool previous_cased = false, first = true;
      for (uint32_t c : code_points(s)) {
        if (name == "swapcase")
          out += is_upper_cat(c) ? lower_cp(c) : is_lower_cat(c) ? upper_cp(c) : lower_cp(c);
        else if (name == "capitalize")
          out += first ? title_cp(c) : lower_cp(c);
        else
          out += previous_cased ? lower_cp(c) : title_cp(c);  // title: a word starts after any uncased character
        previous_cased = is_cased(c);
        first = false;
      }
      return Value(out);
    });
  }
  if (name == "replace") {
    return Value::function([s](CallArgs& a) -> Result<Value> {
      const Value *from = a.get(0, "old"), *to = a.get(1, "new");
      if (!from || !to || !from->is_string() || !to->is_string())
        return Status::error("replace needs two str arguments");
      return Value(py_replace(s, from->as_string(), to->as_string(), int_arg(a, 2, "count", -1)));
    });
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    return Value::function([s, name](CallArgs& a) -> Result<Value> {
      const Value* sub = a.get(0, "sub");
      if (!sub || !sub->is_string()) return Status::error(name + " needs a str argument");
      const auto cps = code_points(s), needle = code_points(sub->as_string());
      const auto [b, e] = span_args(a, 1, static_cast<int64_t>(cps.size()));
      if (name == "count") {
        if (needle.empty()) return Value(e >= b ? e - b + 1 : int64_t{0});
        int64_t n = 0;
        for (int64_t p = find_cps(cps, needle, b, e, false); p >= 0;
             p = find_cps(cps, needle, p + static_cast<int64_t>(needle.size()), e, false))
          ++n;
        return Value(n);
      }
      const int64_t f = find_cps(cps, needle, b, e, name[0] == 'r');
      if (f < 0 && name.find("index") != std::string::npos) return Status::error(name + ": substring not found");
      return Value(f);
    });
  }
  if (name == "partition" || name == "rpartition") {
    const bool right = name == "rpartition";
    return Value::function([s, right](CallArgs& a) -> Result<Value> {
      const Value* sep = a.get(0, "sep");
      if (!sep || !sep->is_string() || sep->as_string().empty())
        return Status::error("partition needs a non-empty str separator");
      const std::string& d = sep->as_string();
      const size_t f = right ? s.rfind(d) : s.find(d);
      if (f == std::string::npos)
        return Value::tuple(right ? List{Value(""), Value(""), Value(s)} : List{Value(s), Value(""), Value("")});
      return Value::tuple({Value(s.substr(0, f)), Value(d), Value(s.substr(f + d.size()))});
    });
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const bool prefix = name == "removeprefix";
    return Value::function([s, prefix](CallArgs& a) -> Result<Value> {
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
    return Value::function([s, align](CallArgs& a) -> Result<Value> {
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
    return Value::function([s](CallArgs& a) -> Result<Value> {
      const int64_t width = int_arg(a, 0, "width", 0), margin = width - py_len(s);
      if (margin <= 0) return Value(s);
      const bool sign = !s.empty() && (s[0] == '+' || s[0] == '-');
      return Value((sign ? s.substr(0, 1) : "") + std::string(static_cast<size_t>(margin), '0') +
                   (sign ? s.substr(1) : s));
    });
  }
  if (name == "expandtabs") {
    return Value::function([s](CallArgs& a) -> Result<Value> {
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
    return Value::function([s](CallArgs& a) -> Result<Value> {
      const Value* items = a.get(0, "iterable");
      if (!items) return Status::error("join needs an iterable");
      List list = items->is_list() ? items->as_list() : items->is_string() ? List{} : List{};
      if (items->is_string())
        for (uint32_t c : code_points(items->as_string())) list.push_back(Value(from_code_points({c}, 0, 1)));
      else if (items->is_dict())
        for (const auto& kv : items->as_dict()) list.push_back(Value(kv.first));
      else if (!items->is_list())
        return Status::error("join: can only join an iterable");
      std::string out;
      for (size_t i = 0; i < list.size(); ++i) {
        if (!list[i].is_string())
          return Status::error("join: sequence item " + std::to_string(i) + ": expected str instance, " +
                               list[i].type_name() + " found");
        out += (i ? s : "") + list[i].as_string();
      }
      return Value(out);
    });
  }
  if (name == "format" || name == "format_map") {
    const bool map = name == "format_map";
    return Value::function([s, map](CallArgs& a) -> Result<Value> {
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
  static const char* PREDICATES[] = {"isdigit", "isdecimal", "isnumeric", "isspace", "isalpha",      "isalnum",
                                     "isascii", "islower",   "isupper",   "istitle", "isidentifier", "isprintable"};
  if (std::find(std::begin(PREDICATES), std::end(PREDICATES), name) != std::end(PREDICATES)) {
    return Value::function([s, name](CallArgs&) -> Result<Value> {
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
    return Status::error("str." + name +
                         " is not supported in chat templates (bytes and translation tables have no "
                         "place in a prompt)");
  return Value();  // jinja: an unknown attribute is undefined
}

}  // namespace nibble::text::jinja

// Python str semantics for the Jinja interpreter: code points, character classes (utf8proc's
// Unicode tables), strip/split/replace, case mapping, padding, printf-style `%` formatting and
// str.format — CPython's behaviour is the reference for each.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "text/jinja/value.h"

namespace nibble::text::jinja {

std::vector<uint32_t> code_points(const std::string& s);
std::string from_code_points(const std::vector<uint32_t>& cps, size_t begin, size_t end);
int64_t py_len(const std::string& s);  // length in code points

// Character classes as str.isspace / isalpha / isdecimal / isdigit / isnumeric / isalnum define them.
bool py_isspace(uint32_t cp);
bool py_isalpha(uint32_t cp);
bool py_isdecimal(uint32_t cp);
bool py_isdigit(uint32_t cp);
bool py_isnumeric(uint32_t cp);
bool py_isalnum(uint32_t cp);
bool py_isword(uint32_t cp);  // regex \w: alphanumeric or '_'

// Simple (one-to-one) Unicode case mappings; Python's full mappings (ß → SS) differ on a few characters.
std::string py_upper(const std::string& s);
std::string py_lower(const std::string& s);

// chars == nullptr, none or undefined strips whitespace.
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right);
// str.split / str.rsplit (sep null: runs of whitespace; maxsplit < 0: no limit).
List py_split(const std::string& s, const Value* sep, int64_t maxsplit, bool from_right);
std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count);
// str.center / ljust / rjust with a one-character fill.
std::string py_pad(const std::string& s, int64_t width, const std::string& fill, char align);

// `format % args` (printf style): args is one value, a tuple of values, or a mapping for %(name)s.
Result<std::string> percent_format(const std::string& format, const Value& args);
// str.format(*positional, **keyword).
Result<std::string> brace_format(const std::string& format, const CallArgs& args);

// A bound str method (undefined when the name is not one; an error when it is one nibble refuses).
Result<Value> string_method(const std::string& s, const std::string& name);

}  // namespace nibble::text::jinja

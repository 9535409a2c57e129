// Jinja built-ins with Python semantics: operators, attribute and item access, slicing, filters,
// tests, string/dict/list methods, and the globals chat templates call.
#pragma once

#include <optional>
#include <string>

#include "text/jinja/value.h"

namespace nibble::text::jinja {

Value global(const std::string& name);    // range, namespace, dict, joiner, raise_exception, strftime_now
List string_chars(const std::string& s);  // a str iterated: one item per code point
Result<Value> get_attribute(const Value& obj, const std::string& name);
Result<Value> get_item(const Value& obj, const Value& key);
Result<Value> slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
Result<Value> unary_op(const std::string& op, const Value& v);
Result<Value> binary_op(const std::string& op, const Value& a, const Value& b);
Result<Value> call_filter(const std::string& name, CallArgs& args);  // args.positional[0] = input
bool has_filter(const std::string& name);
Result<bool> run_test(const std::string& name, const Value& v, const List& args);

// Shared by the filters: Python's <, >, <=, >= ; `item in container`; jinja2's attribute getter
// ("a.b.0": attributes or items, digits as indexes); a value iterated as a list (str: characters,
// dict: keys, none/undefined: empty).
Result<Value> compare(const std::string& op, const Value& a, const Value& b);
Result<bool> contains(const Value& container, const Value& item);
Result<Value> attribute_of(const Value& item, const std::string& path);
Result<List> as_sequence(const Value& v, const std::string& filter);
Result<Value> dict_method(const Value& d, const std::string& name);  // a bound dict method or undefined
// A filter argument by position or keyword, as a bool (def where absent).
bool bool_arg(const CallArgs& a, size_t i, const std::string& name, bool def);
// The filters over sequences and mappings (filters_sequence.cpp); nullopt where name is none of them.
std::optional<Result<Value>> call_sequence_filter(const std::string& name, CallArgs& args);

}  // namespace nibble::text::jinja

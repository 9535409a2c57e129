// Jinja built-ins with Python semantics: operators, attribute and item access, slicing, filters,
// tests, string/dict/list methods, and the globals chat templates call.
#pragma once

#include <string>

#include "text/jinja/value.h"

namespace nibble::text::jinja {

Value global(const std::string& name);  // range, namespace, dict, raise_exception, strftime_now
List string_chars(const std::string& s);  // a str iterated: one item per code point
Result<Value> get_attribute(const Value& obj, const std::string& name);
Result<Value> get_item(const Value& obj, const Value& key);
Result<Value> slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
Result<Value> unary_op(const std::string& op, const Value& v);
Result<Value> binary_op(const std::string& op, const Value& a, const Value& b);
Result<Value> call_filter(const std::string& name, CallArgs& args);  // args.positional[0] = input
Result<bool> run_test(const std::string& name, const Value& v, const List& args);

}  // namespace nibble::text::jinja

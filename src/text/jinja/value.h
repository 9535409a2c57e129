// Jinja values with Python semantics (the reference is jinja2 as transformers runs it): none,
// undefined, bool, int, float, str, list, dict (insertion-ordered), callables, namespace objects.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace nibble::text::jinja {

class Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // keys are strings, order kept

struct CallArgs;
using Function = std::function<Result<Value>(CallArgs&)>;

class Value {
 public:
  enum class Kind { UNDEFINED, NONE, BOOL, INT, FLOAT, STRING, LIST, DICT, FUNCTION, NAMESPACE };

  Value() = default;  // undefined
  static Value none();
  Value(bool b);
  Value(int64_t i);
  Value(int i) : Value(static_cast<int64_t>(i)) {}
  Value(double d);
  Value(std::string s);
  Value(const char* s) : Value(std::string(s)) {}
  Value(List l);
  Value(Dict d);
  static Value tuple(List l);  // a list that prints as a Python tuple
  // A tuple whose items are also attributes (groupby's (grouper, list) pairs).
  static Value named_tuple(List l, const std::vector<std::string>& fields);
  static Value function(Function f);
  static Value namespace_object(Dict attributes);
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::UNDEFINED; }
  bool is_none() const { return kind_ == Kind::NONE; }
  bool is_string() const { return kind_ == Kind::STRING; }
  bool is_number() const { return kind_ == Kind::INT || kind_ == Kind::FLOAT; }
  bool is_list() const { return kind_ == Kind::LIST; }  // lists and tuples
  bool is_tuple() const { return kind_ == Kind::LIST && b_; }
  bool is_dict() const { return kind_ == Kind::DICT || kind_ == Kind::NAMESPACE; }
  bool is_callable() const { return kind_ == Kind::FUNCTION; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_number() const { return kind_ == Kind::INT ? static_cast<double>(i_) : d_; }
  const std::string& as_string() const { return *s_; }
  const List& as_list() const { return *list_; }
  const Dict& as_dict() const { return *dict_; }
  const Function& as_function() const { return *fn_; }

  // Dict lookup (or a named tuple's field); nullptr when absent.
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value v);

  bool truthy() const;
  // str(x) as Python prints it (strings as they are, containers with repr of elements).
  std::string str() const;
  // repr(x): strings quoted.
  std::string repr() const;
  // json.dumps(x, ensure_ascii=..., indent=indent (< 0: None), separators=(item_sep, key_sep) when
  // custom_separators (else json.dumps' defaults for the indent), sort_keys=...).
  struct JsonStyle {
    int indent = -1;
    bool sort_keys = false;
    bool ensure_ascii = false;
    bool custom_separators = false;
    std::string item_sep, key_sep;
  };
  Result<std::string> to_json(const JsonStyle& style) const;
  // Python ==.
  bool equals(const Value& other) const;
  std::string type_name() const;

 private:
  Kind kind_ = Kind::UNDEFINED;
  bool b_ = false;  // BOOL value; for LIST: printed as a tuple
  int64_t i_ = 0;
  double d_ = 0;
  std::shared_ptr<std::string> s_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;  // DICT/NAMESPACE entries; a named tuple's field → index
  std::shared_ptr<Function> fn_;
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  const Value* get(size_t index, const std::string& name) const;  // positional index or keyword
  const Value* keyword_arg(const std::string& name) const;        // keyword only
};

// Python's repr of a float (shortest round-trip digits, exponent outside 1e-4..1e16).
std::string python_float_repr(double d);

}  // namespace nibble::text::jinja

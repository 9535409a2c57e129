// Jinja's filters over sequences and mappings with jinja2/filters.py semantics (jinja2 3.1):
// first, last, list, items, reverse, map, select/reject(attr), unique, min, max, sort, dictsort,
// groupby, batch, slice. The other filters and the dispatch are in filters.cpp.
#include <algorithm>
#include <functional>
#include <optional>

#include "text/jinja/builtins.h"
#include "text/jinja/pystr.h"

namespace nibble::text::jinja {
namespace {

// A sort/unique/groupby key: the attribute (if any), lower-cased strings unless case_sensitive.
Result<Value> sort_key(const Value& item, const Value* attribute, bool case_sensitive) {
  Value key = item;
  if (attribute && !attribute->is_none()) {
    auto k = attribute_of(item, attribute->str());
    if (!k) return k;
    key = *k;
  }
  if (!case_sensitive && key.is_string()) key = Value(py_lower(key.as_string()));
  return key;
}

Result<List> sorted_by(List items, const std::function<Result<Value>(const Value&)>& key, bool reverse) {
  std::vector<std::pair<Value, Value>> keyed;
  for (Value& item : items) {
    auto k = key(item);
    if (!k) return k.status();
    keyed.emplace_back(std::move(*k), std::move(item));
  }
  Status failure;
  // Python's sort with reverse=True is stable too (equal keys keep their order).
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    auto lt = compare("<", reverse ? y.first : x.first, reverse ? x.first : y.first);
    if (!lt) failure = lt.status();
    return lt && lt->truthy();
  });
  NIB_RETURN_IF_ERROR(failure);
  List out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return out;
}

Result<Value> select_or_map(const std::string& name, CallArgs& a, const List& items) {
  List out;
  for (const Value& item : items) {
    if (name == "map") {
      if (const Value* attribute = a.keyword_arg("attribute")) {
        auto x = attribute_of(item, attribute->str());
        if (!x) return x.status();
        const Value* def = a.keyword_arg("default");
        out.push_back(x->is_undefined() && def ? *def : *x);
        continue;
      }
      if (a.positional.size() < 2) return Status::error("map needs a filter name or attribute=");
      CallArgs inner;
      inner.positional.push_back(item);
      inner.positional.insert(inner.positional.end(), a.positional.begin() + 2, a.positional.end());
      inner.keyword = a.keyword;
      auto x = call_filter(a.positional[1].str(), inner);
      if (!x) return x;
      out.push_back(*x);
      continue;
    }
    const bool by_attr = name == "selectattr" || name == "rejectattr";
    Value subject = item;
    size_t test_at = 1;
    if (by_attr) {
      if (a.positional.size() < 2) return Status::error(name + " needs an attribute");
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

}  // namespace

std::optional<Result<Value>> call_sequence_filter(const std::string& name, CallArgs& a) {
  const Value& v = a.positional[0];
  auto arg = [&](size_t i, const std::string& key) { return a.get(i, key); };  // i counts the input
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
    if (v.is_undefined()) return Value(List{});
    if (!v.is_dict()) return Status::error("items: can only get item pairs from a mapping");
    List out;
    for (const auto& [k, x] : v.as_dict()) out.push_back(Value::tuple({Value(k), x}));
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
    return select_or_map(name, a, *items);
  }
  if (name == "unique" || name == "min" || name == "max") {
    auto items = as_sequence(v, name);
    if (!items) return items.status();
    const bool case_sensitive = bool_arg(a, 1, "case_sensitive", false);
    const Value* attribute = arg(2, "attribute");
    List out;
    std::vector<Value> keys;
    for (const Value& item : *items) {
      auto k = sort_key(item, attribute, case_sensitive);
      if (!k) return k;
      if (name == "unique") {
        if (std::none_of(keys.begin(), keys.end(), [&](const Value& o) { return o.equals(*k); })) {
          keys.push_back(*k);
          out.push_back(item);
        }
        continue;
      }
      if (keys.empty()) {
        keys.push_back(*k);
        out.push_back(item);
        continue;
      }
      auto better = compare(name == "min" ? "<" : ">", *k, keys[0]);
      if (!better) return better;
      if (better->truthy()) keys[0] = *k, out[0] = item;
    }
    if (name == "unique") return Value(out);
    return out.empty() ? Value() : out[0];  // jinja2: undefined ("No first item, sequence was empty")
  }
  if (name == "sort") {
    auto items = as_sequence(v, "sort");
    if (!items) return items.status();
    const bool case_sensitive = bool_arg(a, 2, "case_sensitive", false);
    const Value* attribute = arg(3, "attribute");
    std::vector<std::string> attributes;  // "a,b": sort by several attributes
    if (attribute && attribute->is_string()) {
      size_t pos = 0;
      const std::string& text = attribute->as_string();
      while (pos <= text.size()) {
        const size_t comma = text.find(',', pos);
        attributes.push_back(text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
    } else if (attribute && !attribute->is_none()) {
      attributes.push_back(attribute->str());
    }
    auto key = [&](const Value& item) -> Result<Value> {
      if (attributes.size() <= 1) {
        Value name_value = attributes.empty() ? Value() : Value(attributes[0]);
        return sort_key(item, attributes.empty() ? nullptr : &name_value, case_sensitive);
      }
      List parts;
      for (const std::string& attr : attributes) {
        Value name_value(attr);
        auto k = sort_key(item, &name_value, case_sensitive);
        if (!k) return k;
        parts.push_back(*k);
      }
      return Value(parts);
    };
    auto sorted = sorted_by(*items, key, bool_arg(a, 1, "reverse", false));
    if (!sorted) return sorted.status();
    return Value(*sorted);
  }
  if (name == "dictsort") {
    if (!v.is_dict()) return Status::error("dictsort: a mapping is required, not " + v.type_name());
    const bool case_sensitive = bool_arg(a, 1, "case_sensitive", false);
    const Value* by = arg(2, "by");
    const std::string by_name = by ? by->str() : "key";
    if (by_name != "key" && by_name != "value")
      return Status::error("dictsort: You can only sort by either 'key' or 'value'");
    List pairs;
    for (const auto& [k, x] : v.as_dict()) pairs.push_back(Value::tuple({Value(k), x}));
    auto key = [&](const Value& pair) -> Result<Value> {
      return sort_key(pair.as_list()[by_name == "key" ? 0 : 1], nullptr, case_sensitive);
    };
    auto sorted = sorted_by(pairs, key, bool_arg(a, 3, "reverse", false));
    if (!sorted) return sorted.status();
    return Value(*sorted);
  }
  if (name == "groupby") {
    auto items = as_sequence(v, "groupby");
    if (!items) return items.status();
    const Value* attribute = arg(1, "attribute");
    if (!attribute) return Status::error("groupby needs an attribute");
    const Value* def = arg(2, "default");
    const bool case_sensitive = bool_arg(a, 3, "case_sensitive", false);
    auto real_key = [&](const Value& item) -> Result<Value> {
      auto k = attribute_of(item, attribute->str());
      if (!k) return k;
      return k->is_undefined() && def ? *def : *k;
    };
    auto key = [&](const Value& item) -> Result<Value> {
      auto k = real_key(item);
      if (!k) return k;
      return !case_sensitive && k->is_string() ? Value(py_lower(k->as_string())) : *k;
    };
    auto sorted = sorted_by(*items, key, false);
    if (!sorted) return sorted.status();
    List groups;
    Value current_key;
    for (const Value& item : *sorted) {
      auto k = key(item);
      if (!k) return k;
      if (groups.empty() || !k->equals(current_key)) {
        auto shown = case_sensitive ? k : real_key(item);  // the real key of the group's first item
        if (!shown) return shown;
        groups.push_back(Value::named_tuple({*shown, Value(List{})}, {"grouper", "list"}));
        current_key = *k;
      }
      List members = groups.back().as_list()[1].as_list();
      members.push_back(item);
      groups.back() = Value::named_tuple({groups.back().as_list()[0], Value(members)}, {"grouper", "list"});
    }
    return Value(groups);
  }
  if (name == "batch" || name == "slice") {
    auto items = as_sequence(v, name);
    if (!items) return items.status();
    const Value* count = arg(1, name == "batch" ? "linecount" : "slices");
    if (!count || count->kind() != Value::Kind::INT || count->as_int() <= 0)
      return Status::error(name + " needs a positive integer");
    const Value* fill = arg(2, "fill_with");
    const bool filling = fill && !fill->is_none();
    const int64_t n = count->as_int(), len = static_cast<int64_t>(items->size());
    List out;
    if (name == "batch") {
      for (int64_t i = 0; i < len; i += n) {
        List chunk(items->begin() + i, items->begin() + std::min(len, i + n));
        while (filling && static_cast<int64_t>(chunk.size()) < n) chunk.push_back(*fill);
        out.push_back(Value(chunk));
      }
    } else {  // jinja2 do_slice: n columns, the first len % n one longer
      const int64_t per = len / n, extra = len % n;
      int64_t offset = 0;
      for (int64_t s = 0; s < n; ++s) {
        const int64_t start = offset + s * per;
        if (s < extra) ++offset;
        const int64_t end = offset + (s + 1) * per;
        List chunk(items->begin() + start, items->begin() + end);
        if (filling && s >= extra) chunk.push_back(*fill);
        out.push_back(Value(chunk));
      }
    }
    return Value(out);
  }
  return std::nullopt;
}

}  // namespace nibble::text::jinja

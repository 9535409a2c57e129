// check_budget (constraint_budget.h): one linear scan for the nesting (so no parser recurses into a
// document that is too deep), then a walk of the parsed document with a stack of its own;
// bounded_repetitions: one scan of the grammar text with a stack of its groups.
#include "grammar/constraint_budget.h"
#include "grammar/json_strings.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace nibble::grammar {
namespace {

// The deepest nesting of arrays and objects in `text`, brackets inside strings not counted.
int64_t json_depth(const std::string& text) {
  int64_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char ch : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (ch == '\\')
        escaped = true;
      else if (ch == '"')
        in_string = false;
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (ch == ']' || ch == '}') {
      --depth;
    }
  }
  return deepest;
}

// How many properties an object that names some ("properties": {…}) leaves out of "required".
int64_t optional_properties(const nlohmann::json& object) {
  const auto properties = object.find("properties");
  if (properties == object.end() || !properties->is_object()) return 0;
  int64_t optional = static_cast<int64_t>(properties->size());
  const auto required = object.find("required");
  if (required != object.end() && required->is_array())
    for (const nlohmann::json& name : *required)
      if (name.is_string() && properties->contains(name.get_ref<const std::string&>())) --optional;
  return optional;
}

// xgrammar reads the hex digits of a \x escape (however many) or a \U escape (eight) into an int:
// signed overflow (undefined behaviour, found by fuzz_grammar under UBSan) from the eighth digit
// after the leading zeros. A code point has at most six.
Status check_hex_escapes(const std::string& text) {
  for (size_t at = text.find('\\'); at != std::string::npos; at = text.find('\\', at + 2)) {
    if (at + 1 >= text.size() || (text[at + 1] != 'x' && text[at + 1] != 'U')) continue;  // (\\: skipped whole)
    const size_t end = text[at + 1] == 'U' ? std::min(text.size(), at + 10) : text.size();
    size_t p = at + 2, significant = 0;
    while (p < end && text[p] == '0') ++p;
    while (p < end && std::isxdigit(static_cast<unsigned char>(text[p]))) ++p, ++significant;
    if (significant > 7)
      return Status::error(std::string("a \\") + text[at + 1] + " escape has " + std::to_string(significant) +
                           " significant hex digits (a code point has at most 6)");
  }
  return Status::ok();
}

Status check_document(const std::string& text, const char* what, const ConstraintBudget& b) {
  const int64_t depth = json_depth(text);
  if (depth > b.max_depth)
    return Status::error(std::string(what) + " nests " + std::to_string(depth) + " levels deep (at most " +
                         std::to_string(b.max_depth) + " are compiled)");
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return Status::ok();
  int64_t values = 0, optional_total = 0;
  std::vector<const nlohmann::json*> stack = {&doc};
  while (!stack.empty()) {
    const nlohmann::json& v = *stack.back();
    stack.pop_back();
    if (++values > b.max_values)
      return Status::error(std::string(what) + " has more than " + std::to_string(b.max_values) +
                           " JSON values (objects, arrays, strings, numbers, …), the most that is compiled");
    if (v.is_object()) {
      const int64_t optional = optional_properties(v);
      if (optional > b.max_optional_properties)
        return Status::error(std::string(what) + " has an object with " + std::to_string(optional) +
                             " optional properties (named in \"properties\", not in \"required\"; at most " +
                             std::to_string(b.max_optional_properties) + " an object are compiled)");
      if ((optional_total += optional) > b.max_total_optional_properties)
        return Status::error(std::string(what) + " has more than " + std::to_string(b.max_total_optional_properties) +
                             " optional properties in all (named in \"properties\", not in \"required\"), the most "
                             "that is compiled");
    }
    if (v.is_string()) NIB_RETURN_IF_ERROR(check_hex_escapes(v.get_ref<const std::string&>()));  // as decoded
    if (v.is_structured())
      for (const nlohmann::json& child : v) stack.push_back(&child);
  }
  return Status::ok();
}

Status check_text(size_t bytes, const char* what, const ConstraintBudget& b) {
  if (static_cast<int64_t>(bytes) <= b.max_text_bytes) return Status::ok();
  return Status::error(std::string(what) + " is " + std::to_string(bytes) + " bytes long (at most " +
                       std::to_string(b.max_text_bytes) + " are compiled)");
}

constexpr int64_t SATURATED = int64_t(1) << 40;
// xgrammar 0.2.8 unrolls a repetition up to this many copies and leaves the rest to a counted repeat
// whose compile cost does not grow with the count (its RepetitionRangeExpander, kUnzipThreshold 128).
constexpr int64_t UNROLLED_REPEATS = 129;
int64_t saturating_add(int64_t a, int64_t b) { return std::min(SATURATED, a + b); }
int64_t saturating_mul(int64_t a, int64_t b) {
  return b != 0 && a > SATURATED / b ? SATURATED : std::min(SATURATED, a * b);
}

// bounded_repetitions' scan. Each atom (a character, a class, a literal, a group, an EBNF rule whose
// body is one character class) has a size — its characters, its repeated ones included — and the
// part of it that bounded repetitions make; an atom followed by {m,n} makes n times its size (at most
// UNROLLED_REPEATS times). Other rules' references are size 0 (their own definitions are counted where
// they stand), so a repeated rule of many characters (an array's items) costs what its definition
// does, as it does xgrammar.
class RepetitionCount {
 public:
  RepetitionCount(const std::string& text, GrammarSyntax syntax) : text_(text), syntax_(syntax) {
    if (syntax == GrammarSyntax::EBNF) find_character_rules();
    frames_.push_back({});
    scan();
  }
  int64_t total() const { return total_; }

 private:
  struct Frame {
    int64_t size = 0, repeated = 0;
  };
  struct Atom {
    bool present = false;
    int64_t size = 0, repeated = 0;
  };

  // Rules printed as `NAME ::= (([...]))`: one character each (the converter's string characters).
  void find_character_rules() {
    size_t line = 0;
    while (line < text_.size()) {
      size_t end = text_.find('\n', line);
      if (end == std::string::npos) end = text_.size();
      const std::string l = text_.substr(line, end - line);
      const size_t def = l.find(" ::= (([");
      if (def != std::string::npos && l.size() >= 3 && l.compare(l.size() - 3, 3, "]))") == 0 &&
          l.find("] ", def) == std::string::npos && l.find("|", def) == std::string::npos)
        character_rules_.insert(l.substr(0, def));
      line = end + 1;
    }
  }

  // The pending atom joins the innermost frame as it is (no bounded repetition follows it).
  void commit() {
    if (!atom_.present) return;
    Frame& f = frames_.back();
    f.size = saturating_add(f.size, atom_.size), f.repeated = saturating_add(f.repeated, atom_.repeated);
    atom_ = {};
  }
  void set_atom(int64_t size, int64_t repeated) {
    commit();
    atom_ = {true, size, repeated};
  }
  // Quantifier at `at` ({m}, {m,}, {m,n}, {m, -1}); its bound (m where open) into `bound`, `at` past it.
  bool quantifier(size_t& at, int64_t& bound) {
    size_t p = at + 1;
    auto spaces = [&] {
      while (p < text_.size() && text_[p] == ' ') ++p;
    };
    auto number = [&](int64_t& value) {
      const size_t start = p;
      value = 0;
      while (p < text_.size() && text_[p] >= '0' && text_[p] <= '9')
        value = std::min(SATURATED, value * 10 + (text_[p++] - '0'));
      return p > start;
    };
    int64_t low = 0, high = 0;
    spaces();
    if (!number(low)) return false;
    spaces();
    high = low;
    if (p < text_.size() && text_[p] == ',') {
      ++p;
      spaces();
      const bool negative = p < text_.size() && text_[p] == '-';
      if (negative) ++p;
      if (!number(high) || negative) high = -1;
      spaces();
    }
    if (p >= text_.size() || text_[p] != '}') return false;
    bound = high < 0 ? low : high;
    at = p;
    return true;
  }
  // The literal or class from `at` (its opening character) to its close; `at` on the close.
  std::string enclosed(size_t& at, char close) {
    std::string content;
    for (++at; at < text_.size() && text_[at] != close; ++at) {
      if (text_[at] == '\\' && at + 1 < text_.size()) {
        if (close == '"' && (text_[at + 1] == '"' || text_[at + 1] == '\\')) {
          content += text_[++at];
          continue;
        }
        content += text_[at++];
      }
      content += text_[at];
    }
    return content;
  }

  void scan() {
    const bool ebnf = syntax_ == GrammarSyntax::EBNF;
    for (size_t at = 0; at < text_.size(); ++at) {
      const char ch = text_[at];
      int64_t bound = 0;
      if (ch == '{' && atom_.present && quantifier(at, bound)) {
        const int64_t made = saturating_mul(atom_.size, std::min(bound, UNROLLED_REPEATS));
        atom_ = {true, made, made};
        commit();
      } else if (ch == '(') {
        commit();
        frames_.push_back({});
        if (!ebnf && at + 2 < text_.size() && text_[at + 1] == '?') at += 2;  // (?: (?= (?! …
      } else if (ch == ')') {
        commit();
        if (frames_.size() > 1) {
          const Frame inner = frames_.back();
          frames_.pop_back();
          atom_ = {true, inner.size, inner.repeated};
        }
      } else if (ch == '[') {
        enclosed(at, ']');
        set_atom(1, 0);
      } else if (ch == '"' && ebnf) {
        set_atom(static_cast<int64_t>(enclosed(at, '"').size()), 0);
      } else if (ch == '\\' && !ebnf) {
        ++at;
        set_atom(1, 0);
      } else if (ebnf && (std::isalpha(static_cast<unsigned char>(ch)) || ch == '_')) {
        size_t end = at;
        while (end < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[end])) || text_[end] == '_')) ++end;
        const std::string name = text_.substr(at, end - at);
        at = end - 1;
        if (name == "Regex" && end + 1 < text_.size() && text_[end] == '(' && text_[end + 1] == '"') {
          size_t p = end + 1;
          const int64_t inner = RepetitionCount(enclosed(p, '"'), GrammarSyntax::REGEX).total();
          set_atom(std::max<int64_t>(inner, 1), inner);
          at = p;
        } else {
          set_atom(character_rules_.count(name) ? 1 : 0, 0);
        }
      } else if (ebnf && ch == ':' && text_.compare(at, 3, "::=") == 0) {
        atom_ = {}, frames_.assign(1, {});  // a new rule: what its name scanned as counts nothing
        at += 2;
      } else if (ch == '\n' && ebnf) {
        commit();
        total_ = saturating_add(total_, frames_.front().repeated);
        frames_.assign(1, {});
        if (text_.compare(at + 1, CHAINED_STRING_RULE.size(), CHAINED_STRING_RULE) == 0)
          total_ = saturating_add(total_, 1);  // a chained string's character
      } else if (ch == '|' || ch == ' ' || ch == '^' || ch == '$' || ch == '=' || ch == ',') {
        commit();
      } else {
        set_atom(1, 0);  // a character (regex), or punctuation that stands for one
      }
    }
    commit();
    while (frames_.size() > 1) {
      const Frame inner = frames_.back();
      frames_.pop_back();
      frames_.back().repeated = saturating_add(frames_.back().repeated, inner.repeated);
    }
    total_ = saturating_add(total_, frames_.front().repeated);
  }

  const std::string& text_;
  GrammarSyntax syntax_;
  std::set<std::string> character_rules_;
  std::vector<Frame> frames_;
  Atom atom_;
  int64_t total_ = 0;
};

}  // namespace

int64_t bounded_repetitions(const std::string& text, GrammarSyntax syntax) {
  return RepetitionCount(text, syntax).total();
}

Status check_repetitions(const std::string& text, GrammarSyntax syntax, const char* what,
                         const ConstraintBudget& budget) {
  const int64_t chars = bounded_repetitions(text, syntax);
  if (chars <= budget.max_repeated_chars) return Status::ok();
  return Status::error(std::string(what) + " bounds repetitions of " + std::to_string(chars) +
                       " characters in all (maxLength, {m,n}; at most " + std::to_string(budget.max_repeated_chars) +
                       " are compiled)");
}

Status check_budget(const Constraint& c, const ConstraintBudget& budget) {
  switch (c.kind) {
    case ConstraintKind::JSON_SCHEMA:
    case ConstraintKind::TOOL_CALLS:
      return check_document(c.text, "the JSON schema", budget);
    case ConstraintKind::STRUCTURAL_TAG:
      return check_document(c.text, "the structural tag", budget);
    case ConstraintKind::REGEX:
    case ConstraintKind::EBNF: {
      const bool regex = c.kind == ConstraintKind::REGEX;
      const char* what = regex ? "the regex" : "the EBNF grammar";
      NIB_RETURN_IF_ERROR(check_hex_escapes(c.text));
      NIB_RETURN_IF_ERROR(check_text(c.text.size(), what, budget));
      return check_repetitions(c.text, regex ? GrammarSyntax::REGEX : GrammarSyntax::EBNF, what, budget);
    }
    case ConstraintKind::CHOICE: {
      size_t bytes = 0;
      for (const std::string& s : c.choices) bytes += s.size();
      return check_text(bytes, "the choice list", budget);
    }
    case ConstraintKind::JSON_OBJECT:
      break;
  }
  return Status::ok();
}

}  // namespace nibble::grammar

// json_strings_fixed (json_strings.h): a scan of the converter's printed rules, no general EBNF parse;
// what does not match its exact shapes is left as it was.
#include "grammar/json_strings.h"

#include <cctype>
#include <set>
#include <utility>

namespace nibble::grammar {
namespace {

const std::string LOOSE = R"([^\"\\\r\n])", JSON = R"([^\0-\x1f\"\\])";
const std::string QUOTE = R"("\"")";  // the EBNF literal of one double quote

// The integer at text[at...] (an optional '-'), advancing `at`; false where there is none.
bool read_int(const std::string& text, size_t& at, long& value) {
  const size_t start = at;
  if (at < text.size() && text[at] == '-') ++at;
  if (at >= text.size() || !std::isdigit(static_cast<unsigned char>(text[at]))) return false;
  while (at < text.size() && std::isdigit(static_cast<unsigned char>(text[at]))) ++at;
  value = std::stol(text.substr(start, at - start));
  return true;
}

bool read_literal(const std::string& text, size_t& at, const std::string& literal) {
  if (text.compare(at, literal.size(), literal) != 0) return false;
  at += literal.size();
  return true;
}

// The chain of a string of min..max characters (max -1: unbounded) after its opening quote: rule i
// has consumed i characters; it closes the string once i >= min, and takes another character while
// i < max (the last rule of an unbounded one loops on itself).
std::string chain_rules(long min, long max) {
  const std::string base = CHAINED_STRING_RULE + std::to_string(min) + "_" + (max < 0 ? "n" : std::to_string(max));
  const long last = max < 0 ? min : max;
  std::string rules;
  for (long i = 0; i <= last; ++i) {
    std::string body;
    if (i >= min) body = QUOTE;
    if (max < 0 || i < max) {
      const std::string next = base + "_" + std::to_string(max < 0 && i == last ? i : i + 1);
      body += (body.empty() ? "" : " | ") + JSON + " " + next;
    }
    rules += base + "_" + std::to_string(i) + " ::= " + body + "\n";
  }
  return rules;
}

}  // namespace

std::string json_strings_fixed(const std::string& input) {
  std::string text = input;
  for (size_t at = text.find(LOOSE); at != std::string::npos; at = text.find(LOOSE, at + JSON.size()))
    text.replace(at, LOOSE.size(), JSON);
  // The rules that are exactly one JSON character: the converter's `NAME_characters`.
  std::set<std::string> characters;
  const std::string body = " ::= ((" + JSON + "))";
  for (size_t at = text.find(body); at != std::string::npos; at = text.find(body, at + 1)) {
    const size_t line = text.rfind('\n', at), start = line == std::string::npos ? 0 : line + 1;
    characters.insert(text.substr(start, at - start));
  }
  std::set<std::pair<long, long>> chains;
  std::string out;
  size_t copied = 0;
  for (size_t at = text.find(QUOTE + " "); at != std::string::npos; at = text.find(QUOTE + " ", at + 1)) {
    size_t p = at + QUOTE.size() + 1;
    const size_t name_start = p;
    while (p < text.size() && (std::isalnum(static_cast<unsigned char>(text[p])) || text[p] == '_')) ++p;
    const std::string name = text.substr(name_start, p - name_start);
    long min = 0, max = 0;
    if (!characters.count(name) || !read_literal(text, p, "{") || !read_int(text, p, min) ||
        !read_literal(text, p, ", ") || !read_int(text, p, max) || !read_literal(text, p, "} " + QUOTE))
      continue;
    if (min < 0 || min > MAX_CHAINED_STRING_LENGTH || max > MAX_CHAINED_STRING_LENGTH || (max >= 0 && max < min))
      continue;
    chains.insert({min, max});
    out += text.substr(copied, at - copied) + QUOTE + " " + CHAINED_STRING_RULE + std::to_string(min) + "_" +
           (max < 0 ? "n" : std::to_string(max)) + "_0";
    copied = p;
  }
  out += text.substr(copied);
  for (const auto& [min, max] : chains) out += "\n" + chain_rules(min, max);
  return out;
}

}  // namespace nibble::grammar

// Rewrites of the grammar text xgrammar 0.2.8's JSON-schema converter prints (Grammar::ToString), so
// that its strings are JSON's and their length bounds cost what an unbounded string costs to mask.
#pragma once

#include <string>

namespace nibble::grammar {

// The longest maxLength (or minLength) whose string becomes a chain of rules; longer ones keep the
// converter's bounded repetition (correct, but each mask inside it scans most of the vocabulary).
inline constexpr int MAX_CHAINED_STRING_LENGTH = 256;
// The name every rule of such a chain starts with.
inline const std::string CHAINED_STRING_RULE = "nibble_string_";

// `text` with (1) the converter's character class of a length-bounded string, [^"\\\r\n], made JSON's
// unescaped character [^\0-\x1f"\\] (a raw tab or \x01 is not JSON: RFC 8259 section 7), and (2)
// each such string `"\"" NAME{min, max} "\""` made a chain of rules, one a character consumed, each
// ending the string where the count allows: xgrammar then decides every token at a chain rule from its
// compile-time cache (a token that stays inside the string is settled there), where its bounded
// repetition leaves most tokens to a parse at every step (0.5-6 ms a mask on Qwen3's vocabulary,
// against ~30 us). Text the converter did not write this way (a user's regex or EBNF) is unchanged.
std::string json_strings_fixed(const std::string& text);

}  // namespace nibble::grammar

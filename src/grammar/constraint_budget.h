// What a structured-output constraint may ask of the grammar compiler. xgrammar's compile time grows
// polynomially with a JSON schema's nesting and with the optional properties of one object, and a
// compile cannot be interrupted: a request past these bounds would hold a compile thread for minutes
// and gigabytes (docs/lab/2026-12-07-grammar-budget.md), so it is refused before it compiles.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "grammar/grammar.h"

namespace nibble::grammar {

struct ConstraintBudget {
  int64_t max_depth = 64;      // JSON nesting of a schema's (or structural tag's) document
  int64_t max_values = 10000;  // JSON values in it: objects, arrays, strings, numbers, …
  // Properties an object names without requiring them: in one object, and in all of them (their cost
  // grows faster than their count, most where objects nest).
  int64_t max_optional_properties = 256, max_total_optional_properties = 1024;
  int64_t max_text_bytes = 65536;  // a regex's, an EBNF grammar's or a choice list's text
  // Characters the grammar's bounded repetitions count, in all (bounded_repetitions): each costs
  // the compiler a pass over the vocabulary (a maxLength of 256: ~9 s on one thread, Qwen3's).
  int64_t max_repeated_chars = 1024;
};

// Ok within `budget`, else an error naming the first bound `c` exceeds and its limit (or a \x or \U
// escape of more than 7 significant hex digits, which xgrammar would overflow). A regex's or EBNF
// grammar's bounded repetitions count here; a schema's, a tool call's or a structural tag's are
// counted in the grammar they convert to (check_repetitions, when it is built). Text that is not JSON
// where JSON is expected passes: the compiler's own error says what is wrong with it.
Status check_budget(const Constraint& c, const ConstraintBudget& budget = ConstraintBudget());

// The characters a grammar's bounded repetitions count: each {m,n} adds n times what it repeats ({m}
// and {m,}: m; at most 129 times, what xgrammar unrolls), each rule of a chained string
// (json_strings.h) one; a repeated rule other than one character counts where it is defined.
// REGEX: `text` is a regex (quotes are characters, \{ an escaped brace); EBNF: xgrammar's EBNF
// (its printed JSON-schema grammars included, whose Regex("…") patterns count as regexes).
enum class GrammarSyntax { EBNF, REGEX };
int64_t bounded_repetitions(const std::string& text, GrammarSyntax syntax);
// Ok while bounded_repetitions(text) is within the budget, else an error naming `what`.
Status check_repetitions(const std::string& text, GrammarSyntax syntax, const char* what,
                         const ConstraintBudget& budget = ConstraintBudget());

}  // namespace nibble::grammar

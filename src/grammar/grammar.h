// Structured output's grammars: a constraint a request asks for (a JSON schema, any JSON object, a
// regex, an EBNF grammar, a choice of strings) compiled against the model's vocabulary, and a
// matcher per sequence that says which tokens may come next. Our wrapper of xgrammar's C++ core
// (docs/third_party.md); nothing outside src/grammar/ sees xgrammar's types.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace nibble::grammar {

// STRUCTURAL_TAG: xgrammar's structural tag JSON (free text with constrained regions, e.g. tool calls
// after a trigger: docs/structural_tag in the xgrammar sdist).
enum class ConstraintKind { JSON_SCHEMA, JSON_OBJECT, REGEX, EBNF, CHOICE, TOOL_CALLS, STRUCTURAL_TAG };
// "json_schema", "json_object", "regex", "ebnf", "choice", "tool_calls", "structural_tag"
const char* constraint_kind_name(ConstraintKind kind);

struct Constraint {
  Constraint() = default;
  Constraint(ConstraintKind k, std::string t = "", std::vector<std::string> c = {})
      : kind(k), text(std::move(t)), choices(std::move(c)) {}
  ConstraintKind kind = ConstraintKind::JSON_OBJECT;
  // The schema (JSON text), the regex or the EBNF grammar (root rule `root`); unused for JSON_OBJECT.
  std::string text;
  std::vector<std::string> choices;  // CHOICE: the output is exactly one of these
  // TOOL_CALLS: `text` is one call's JSON schema; each call is call_begin, the JSON, call_end, and
  // with repeated_calls one or more calls follow each other (a newline between), else one.
  std::string call_begin, call_end;
  bool repeated_calls = false;
  // The cache's key: kind and text (a choice's strings joined unambiguously).
  std::string key() const;
};

// The model's vocabulary as the grammar sees it: per token id (up to the model's padded vocab size)
// the bytes it adds to the text, "" for tokens that are never text (special, control, padding), and
// the ids that end a sequence (allowed once the grammar is complete).
struct Vocabulary {
  std::vector<std::string> token_bytes;
  std::vector<int32_t> stop_ids;
};

// Mask words of a vocabulary of `n` tokens: bit t % 32 of word t / 32 set = token t allowed
// (xgrammar's layout, which the samplers read).
inline int64_t mask_words(int64_t n) { return (n + 31) / 32; }

class CompiledGrammar;  // immutable, shared by every matcher of the constraint

class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const CompiledGrammar> grammar);
  ~Matcher();
  Matcher(Matcher&&) noexcept;
  Matcher& operator=(Matcher&&) noexcept;

  // Writes the allowed next tokens into `words` (mask_words(vocab) of them). Once the grammar is
  // complete only the stop ids are allowed.
  void fill_mask(uint32_t* words);
  // Advances by a drawn token; false (and no change) when the grammar does not allow it.
  bool accept(int32_t token);
  // The grammar is complete and a stop token was accepted: nothing more may follow.
  bool terminated() const;
  // The grammar is complete: a stop token may follow.
  bool completed() const;
  // Takes back the last `n` accepted tokens.
  void rollback(int n);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Compiles constraints for one vocabulary, thread-safe, with a cache by Constraint::key() (LRU of
// `cache_entries`): callers that ask for a constraint being compiled wait for that one compilation.
class GrammarCompiler {
 public:
  GrammarCompiler(const Vocabulary& vocabulary, int threads, size_t cache_entries = 256);
  ~GrammarCompiler();

  // The compiled grammar, or an error naming what is wrong with the constraint (a 400's message).
  Result<std::shared_ptr<const CompiledGrammar>> compile(const Constraint& constraint);
  int64_t vocab_size() const;

  struct Stats {
    int64_t hits = 0, misses = 0, entries = 0;
    double compile_seconds = 0.0;  // summed over the misses
  };
  Stats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The EBNF grammar whose only sentences are `choices` (strings as EBNF literals, escaped).
std::string choice_grammar(const std::vector<std::string>& choices);

}  // namespace nibble::grammar

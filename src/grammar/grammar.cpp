// The grammar wrapper over xgrammar: the vocabulary as xgrammar's RAW tokenizer info (we hand it
// each token's decoded bytes, so byte-level BPE and SentencePiece vocabularies look alike), the
// compile cache with one compilation per key, and the matcher.
#include "grammar/grammar.h"
#include "grammar/constraint_budget.h"
#include "grammar/json_strings.h"

#include <dlpack/dlpack.h>
#include <xgrammar/xgrammar.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <list>
#include <map>
#include <mutex>
#include <optional>

namespace nibble::grammar {

const char* constraint_kind_name(ConstraintKind kind) {
  switch (kind) {
    case ConstraintKind::JSON_SCHEMA:
      return "json_schema";
    case ConstraintKind::JSON_OBJECT:
      return "json_object";
    case ConstraintKind::REGEX:
      return "regex";
    case ConstraintKind::EBNF:
      return "ebnf";
    case ConstraintKind::CHOICE:
      return "choice";
    case ConstraintKind::TOOL_CALLS:
      return "tool_calls";
    case ConstraintKind::STRUCTURAL_TAG:
      return "structural_tag";
  }
  return "?";
}

std::string Constraint::key() const {
  std::string k = constraint_kind_name(kind);
  k += '\n';
  auto add = [&k](const std::string& s) { k += std::to_string(s.size()) + ":" + s; };  // length-prefixed
  if (kind == ConstraintKind::CHOICE) {
    for (const std::string& c : choices) add(c);
  } else if (kind == ConstraintKind::TOOL_CALLS) {
    add(call_begin), add(call_end), add(repeated_calls ? "+" : "1"), add(text);
  } else {
    k += text;
  }
  return k;
}

// s as an EBNF string literal, quotes included.
static std::string ebnf_literal(const std::string& s) {
  std::string g = "\"";
  for (const unsigned char c : s) {
    if (c == '"' || c == '\\') {
      g += '\\';
      g += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {  // control characters as \uXXXX (xgrammar's \x takes any length)
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      g += escaped;
    } else {
      g += static_cast<char>(c);  // UTF-8 passes as is
    }
  }
  return g + '"';
}

std::string choice_grammar(const std::vector<std::string>& choices) {
  std::string g = "root ::=";
  for (size_t i = 0; i < choices.size(); ++i) g += (i ? " | " : " ") + ebnf_literal(choices[i]);
  return g;
}

namespace {

// xgrammar's errors carry "[time] file:line: " before the message; the client needs the message.
std::string error_message(const std::exception& e) {
  std::string m = e.what();
  const size_t at = m.find(": ", m.find(".cc:") == std::string::npos ? 0 : m.find(".cc:"));
  if (m.find(".cc:") != std::string::npos && at != std::string::npos) m = m.substr(at + 2);
  while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
  return m;
}

// The grammar with its JSON strings fixed (json_strings.h), parsed again, within the repetition budget.
Result<xgrammar::Grammar> with_json_strings_fixed(const xgrammar::Grammar& g, const char* what) {
  const std::string text = json_strings_fixed(g.ToString());
  NIB_RETURN_IF_ERROR(check_repetitions(text, GrammarSyntax::EBNF, what));
  return xgrammar::Grammar::FromEBNF(text, "root");
}

}  // namespace

class CompiledGrammar {
 public:
  explicit CompiledGrammar(xgrammar::CompiledGrammar g, int64_t vocab) : grammar(std::move(g)), vocab_size(vocab) {}
  xgrammar::CompiledGrammar grammar;
  int64_t vocab_size;
};

struct Matcher::Impl {
  std::shared_ptr<const CompiledGrammar> grammar;
  xgrammar::GrammarMatcher matcher;
  explicit Impl(std::shared_ptr<const CompiledGrammar> g)
      : grammar(std::move(g)), matcher(grammar->grammar, std::nullopt, false, -1) {}
};

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> grammar) : impl_(std::make_unique<Impl>(std::move(grammar))) {}
Matcher::~Matcher() = default;
Matcher::Matcher(Matcher&&) noexcept = default;
Matcher& Matcher::operator=(Matcher&&) noexcept = default;

void Matcher::fill_mask(uint32_t* words) {
  int64_t shape[2] = {1, mask_words(impl_->grammar->vocab_size)};
  DLTensor t{};
  t.data = words;
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 2;
  t.dtype = DLDataType{kDLInt, 32, 1};
  t.shape = shape;
  impl_->matcher.FillNextTokenBitmask(&t, 0);
}

bool Matcher::accept(int32_t token) {
  if (token < 0 || token >= impl_->grammar->vocab_size) return false;
  return impl_->matcher.AcceptToken(token);
}
bool Matcher::terminated() const { return impl_->matcher.IsTerminated(); }
bool Matcher::completed() const { return impl_->matcher.IsCompleted(); }
void Matcher::rollback(int n) { impl_->matcher.Rollback(n); }

struct GrammarCompiler::Impl {
  int64_t vocab_size;
  xgrammar::GrammarCompiler compiler;
  size_t capacity;

  // One entry per key: ready (grammar or error) or being compiled by one caller, the rest waiting.
  struct Entry {
    bool ready = false;
    std::shared_ptr<const CompiledGrammar> grammar;
    std::string error;
    std::list<std::string>::iterator lru;
  };
  std::mutex mutex;
  std::condition_variable compiled;
  std::map<std::string, std::shared_ptr<Entry>> entries;
  std::list<std::string> lru;  // most recent first; only ready entries
  Stats stats;

  Impl(const Vocabulary& v, int threads, size_t cache_entries)
      : vocab_size(static_cast<int64_t>(v.token_bytes.size())),
        compiler(xgrammar::TokenizerInfo(v.token_bytes, xgrammar::VocabType::RAW,
                                         static_cast<int>(v.token_bytes.size()), v.stop_ids, false),
                 threads, /*cache_enabled=*/false),
        capacity(cache_entries) {}

  Result<std::shared_ptr<const CompiledGrammar>> compile_grammar(const Result<xgrammar::Grammar>& g) {
    if (!g) return g.status();
    return std::make_shared<const CompiledGrammar>(compiler.CompileGrammar(g.value()), vocab_size);
  }

  Result<std::shared_ptr<const CompiledGrammar>> build(const Constraint& c) {
    NIB_RETURN_IF_ERROR(check_budget(c));
    try {
      switch (c.kind) {
        case ConstraintKind::JSON_SCHEMA:
          // any_whitespace false: compact JSON with ", " and ": " (xgrammar's default separators),
          // as vLLM and SGLang ask it; strict_mode: properties the schema does not name are not
          // generated (OpenAI's strict outputs).
          return compile_grammar(with_json_strings_fixed(
              xgrammar::Grammar::FromJSONSchema(c.text, /*any_whitespace=*/false, std::nullopt, std::nullopt, true),
              "the JSON schema"));
        case ConstraintKind::JSON_OBJECT:
          return compile_grammar(
              xgrammar::Grammar::FromJSONSchema(R"({"type": "object"})", false, std::nullopt, std::nullopt, false));
        case ConstraintKind::REGEX:
          return std::make_shared<const CompiledGrammar>(compiler.CompileRegex(c.text), vocab_size);
        case ConstraintKind::EBNF:
          return std::make_shared<const CompiledGrammar>(compiler.CompileGrammar(c.text, "root"), vocab_size);
        case ConstraintKind::TOOL_CALLS: {
          // The call's JSON grammar (root rule `root`) with the calls' rules beside it, under names
          // xgrammar's converter does not make.
          std::string ebnf = json_strings_fixed(
              xgrammar::Grammar::FromJSONSchema(c.text, /*any_whitespace=*/false, std::nullopt, std::nullopt, true)
                  .ToString());
          ebnf += "\nnibble_call ::= " + ebnf_literal(c.call_begin) + " root " + ebnf_literal(c.call_end) + "\n";
          ebnf += "nibble_calls ::= nibble_call";
          ebnf += c.repeated_calls ? " (\"\\n\" nibble_call)*\n" : "\n";
          NIB_RETURN_IF_ERROR(check_repetitions(ebnf, GrammarSyntax::EBNF, "the JSON schema"));
          return std::make_shared<const CompiledGrammar>(compiler.CompileGrammar(ebnf, "nibble_calls"), vocab_size);
        }
        case ConstraintKind::STRUCTURAL_TAG: {
          auto tag = xgrammar::Grammar::FromStructuralTag(c.text);
          if (const auto* e = std::get_if<xgrammar::StructuralTagError>(&tag))
            std::visit([](const auto& x) { throw x; }, *e);  // the message as the catch below gives it
          return compile_grammar(with_json_strings_fixed(std::get<xgrammar::Grammar>(tag), "the structural tag"));
        }
        case ConstraintKind::CHOICE:
          if (c.choices.empty()) return Status::error("the choice list is empty");
          for (const std::string& s : c.choices)
            if (s.empty()) return Status::error("a choice is the empty string");
          return std::make_shared<const CompiledGrammar>(compiler.CompileGrammar(choice_grammar(c.choices), "root"),
                                                         vocab_size);
      }
      return Status::error("unknown constraint kind");
    } catch (const std::exception& e) {
      return Status::error(std::string("invalid ") + constraint_kind_name(c.kind) + ": " + error_message(e));
    }
  }
};

GrammarCompiler::GrammarCompiler(const Vocabulary& vocabulary, int threads, size_t cache_entries)
    : impl_(std::make_unique<Impl>(vocabulary, threads, cache_entries)) {}
GrammarCompiler::~GrammarCompiler() = default;
int64_t GrammarCompiler::vocab_size() const { return impl_->vocab_size; }

GrammarCompiler::Stats GrammarCompiler::stats() const {
  std::lock_guard lock(impl_->mutex);
  Stats s = impl_->stats;
  s.entries = static_cast<int64_t>(impl_->lru.size());
  return s;
}

Result<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::compile(const Constraint& constraint) {
  Impl& m = *impl_;
  const std::string key = constraint.key();
  std::unique_lock lock(m.mutex);
  std::shared_ptr<Impl::Entry>& slot = m.entries[key];
  if (slot) {
    const std::shared_ptr<Impl::Entry> e = slot;  // the entry may be evicted while this caller waits
    m.compiled.wait(lock, [&] { return e->ready; });
    ++m.stats.hits;
    if (const auto at = m.entries.find(key); at != m.entries.end() && at->second == e)
      m.lru.splice(m.lru.begin(), m.lru, e->lru);
    if (!e->grammar) return Status::error(e->error);
    return e->grammar;
  }
  const std::shared_ptr<Impl::Entry> e = slot = std::make_shared<Impl::Entry>();
  ++m.stats.misses;
  lock.unlock();
  const auto start = std::chrono::steady_clock::now();
  Result<std::shared_ptr<const CompiledGrammar>> built = m.build(constraint);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  lock.lock();
  m.stats.compile_seconds += seconds;
  e->ready = true;
  if (built) {
    e->grammar = built.value();
  } else {
    e->error = built.status().message();
  }
  m.lru.push_front(key);
  e->lru = m.lru.begin();
  while (m.lru.size() > m.capacity) {  // the least recent ready entries past the capacity
    m.entries.erase(m.lru.back());
    m.lru.pop_back();
  }
  m.compiled.notify_all();
  return built;
}

}  // namespace nibble::grammar

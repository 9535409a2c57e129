// libFuzzer target: any constraint text a request may carry (response_format's JSON schema, a regex,
// an EBNF grammar, a structural tag: the input's first byte picks which) goes through
// grammar::GrammarCompiler as the server compiles it, and must compile or give a clear error: no
// crash, no unbounded recursion, no hang. A grammar that compiles then runs a matcher for up to 64
// tokens (its mask, a token it allows accepted, a rollback now and then), as a sequence would.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "grammar/grammar.h"

namespace {

// 0..255: the bytes; then a few multi-byte tokens (JSON's pieces) and the stop token.
constexpr int32_t STOP = 256 + 6;

nibble::grammar::GrammarCompiler& compiler() {
  static auto* c = [] {
    nibble::grammar::Vocabulary v;
    for (int b = 0; b < 256; ++b) v.token_bytes.push_back(std::string(1, static_cast<char>(b)));
    for (const char* piece : {"true", "false", "null", "\": ", "\", \"", "{\""}) v.token_bytes.push_back(piece);
    v.token_bytes.push_back("");
    v.stop_ids = {STOP};
    return new nibble::grammar::GrammarCompiler(v, 1, /*cache_entries=*/1);
  }();
  return *c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using nibble::grammar::ConstraintKind;
  if (size == 0) return 0;
  static constexpr ConstraintKind kinds[] = {ConstraintKind::JSON_SCHEMA, ConstraintKind::REGEX, ConstraintKind::EBNF,
                                             ConstraintKind::STRUCTURAL_TAG, ConstraintKind::TOOL_CALLS};
  nibble::grammar::Constraint c(kinds[data[0] % 5], std::string(reinterpret_cast<const char*>(data) + 1, size - 1));
  if (c.kind == ConstraintKind::TOOL_CALLS)
    c.call_begin = "<tool_call>\n", c.call_end = "\n</tool_call>", c.repeated_calls = true;
  auto compiled = compiler().compile(c);
  if (!compiled) {
    if (compiled.status().message().empty()) {
      std::fprintf(stderr, "fuzz_grammar: an error without a message\n");
      std::abort();
    }
    return 0;
  }
  nibble::grammar::Matcher m(compiled.value());
  const int64_t vocab = compiler().vocab_size();
  std::vector<uint32_t> words(static_cast<size_t>(nibble::grammar::mask_words(vocab)));
  uint32_t pick = data[0];
  for (int step = 0; step < 64 && !m.terminated(); ++step) {
    m.fill_mask(words.data());
    std::vector<int32_t> allowed;
    for (int32_t t = 0; t < vocab; ++t)
      if (words[static_cast<size_t>(t / 32)] >> (t % 32) & 1) allowed.push_back(t);
    if (allowed.empty()) break;
    pick = pick * 1664525u + 1013904223u;
    const int32_t token = allowed[pick % allowed.size()];
    if (!m.accept(token)) {
      std::fprintf(stderr, "fuzz_grammar: the matcher refused token %d, which its mask allowed\n", token);
      std::abort();
    }
    if (token == STOP && !m.terminated()) {
      std::fprintf(stderr, "fuzz_grammar: the stop token was accepted, yet the matcher is not terminated\n");
      std::abort();
    }
    if (step % 16 == 15) m.rollback(1);
  }
  return 0;
}

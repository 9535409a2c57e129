// libFuzzer target: any bytes through the real Qwen3 tokenizer (data/qwen3-tokenizer/tokenizer.json):
// encode with and without special tokens parsed, decode what it gave and decode the bytes taken as
// ids — every path gives ids or text, never a crash; encoded ids stay inside the vocabulary.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace {

const nibble::text::Tokenizer& qwen3_tokenizer() {
  static const auto tokenizer = [] {
    auto t = nibble::text::Tokenizer::load(NIBBLE_FUZZ_TOKENIZER);
    if (!t) {
      std::fprintf(stderr, "fuzz_tokenizer: %s: %s\n", NIBBLE_FUZZ_TOKENIZER, t.status().message().c_str());
      std::abort();
    }
    return std::move(*t);
  }();
  return *tokenizer;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nibble::text::Tokenizer& tokenizer = qwen3_tokenizer();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (bool special : {true, false}) {
    const std::vector<int32_t> ids = tokenizer.encode(text, special, special);
    for (int32_t id : ids)
      if (id < 0 || size_t(id) >= tokenizer.vocab_size()) std::abort();  // an id outside the vocabulary
    (void)tokenizer.decode(ids, !special);
  }
  // The bytes as token ids (what a request's prompt of ids becomes), in range, decoded.
  std::vector<int32_t> raw;
  for (size_t i = 0; i + 4 <= size; i += 4) {
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) v |= uint32_t(data[i + k]) << (8 * k);
    raw.push_back(int32_t(v % uint32_t(tokenizer.vocab_size())));
  }
  (void)tokenizer.decode(raw, false);
  return 0;
}

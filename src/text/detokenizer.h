// Incremental detokenizer for streaming: add() returns the text that became complete with this
// token; bytes of an unfinished UTF-8 character are held back. The concatenation of every add()
// and the final finish() equals Tokenizer::decode(all ids).
#pragma once

#include <cstdint>
#include <string>

#include "text/tokenizer.h"

namespace nibble::text {

class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
      : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}

  std::string add(int32_t id);
  // Whatever is still held (an unfinished character at the end decodes to U+FFFD, as decode does).
  std::string finish();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;  // bytes not yet emitted: at most an incomplete UTF-8 sequence
};

}  // namespace nibble::text

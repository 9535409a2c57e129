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
  // Appends bytes (dropping the text's leading space where decode does); returns what is final.
  std::string emit(std::string bytes);
  std::string end_byte_run();

  std::string pending_;   // bytes not yet emitted: at most an incomplete UTF-8 sequence
  bool at_start_ = true;  // no bytes seen yet
  std::string byte_run_;  // SentencePiece byte pieces since the last other token
  size_t byte_run_pieces_ = 0;
};

}  // namespace nibble::text

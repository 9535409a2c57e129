// One sequence's text as it is generated: incremental detokenization, stop strings matched across
// token boundaries (and trimmed), and the hold-back a stream needs so that it never sends text a
// later stop string would have removed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "text/detokenizer.h"
#include "text/tokenizer.h"

namespace nibble::engine {

class TextOutput {
 public:
  TextOutput(const text::Tokenizer& tokenizer, bool skip_special_tokens, std::vector<std::string> stop,
             bool include_stop_string);

  // Adds a token's text. With check_stop, returns the stop string the text now contains (the
  // text is cut before it, or after it with include_stop_string), else "".
  std::string add(int32_t token, bool check_stop);
  // The sequence ended without a stop string: whatever the detokenizer still holds is final (e.g. a
  // run of SentencePiece byte pieces), and with check_stop a stop string in it cuts it as add() does.
  std::string finish(bool check_stop);
  // Text not yet taken; a stop string's possible beginning is held back unless `final`.
  std::string take(bool final);

 private:
  // Cuts the text at the first stop string that ends after old_size; returns it, or "".
  std::string cut_at_stop(size_t old_size);

  text::IncrementalDetokenizer detokenizer_;
  std::vector<std::string> stop_;
  bool include_stop_;
  size_t hold_back_ = 0;  // bytes a stop string could still begin in
  std::string text_;
  size_t taken_ = 0;
};

}  // namespace nibble::engine

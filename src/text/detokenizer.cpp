// Streaming detokenization: emit every byte up to the last position where a UTF-8 sequence could
// still be completed by later bytes; decode with the same lossy rules as Tokenizer::decode.
#include "text/detokenizer.h"

#include "text/utf8.h"

namespace nibble::text {

std::string IncrementalDetokenizer::add(int32_t id) {
  pending_ += tokenizer_.token_bytes(id, skip_special_);
  // Find where a trailing, still-completable sequence starts (if any): everything before it is final.
  size_t i = 0, hold_from = pending_.size();
  while (i < pending_.size()) {
    const int n = utf8_sequence_length(pending_, i);
    if (n == -1) {
      hold_from = i;
      break;
    }
    i += n > 0 ? static_cast<size_t>(n) : 1;
  }
  std::string out = utf8_lossy(std::string_view(pending_).substr(0, hold_from));
  pending_.erase(0, hold_from);
  return out;
}

std::string IncrementalDetokenizer::finish() {
  std::string out = utf8_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace nibble::text

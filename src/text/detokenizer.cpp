// Streaming detokenization: emit every byte up to the last position where a UTF-8 sequence could
// still be completed by later bytes; decode with the same lossy rules as Tokenizer::decode.
#include "text/detokenizer.h"

#include "text/utf8.h"

namespace nibble::text {

std::string IncrementalDetokenizer::add(int32_t id) {
  if (skip_special_ && tokenizer_.is_special(id)) return {};
  if (tokenizer_.is_byte_piece(id)) {  // held until the run ends: its validity decides its text
    byte_run_ += tokenizer_.token_bytes(id);
    ++byte_run_pieces_;
    return {};
  }
  std::string bytes = byte_run_pieces_ ? end_byte_run() : std::string();
  bytes += tokenizer_.token_bytes(id, skip_special_);
  return emit(std::move(bytes));
}

std::string IncrementalDetokenizer::end_byte_run() {
  std::string text = Tokenizer::byte_run_text(byte_run_, byte_run_pieces_);
  byte_run_.clear();
  byte_run_pieces_ = 0;
  return text;
}

std::string IncrementalDetokenizer::emit(std::string bytes) {
  if (at_start_ && !bytes.empty()) {  // as decode(): the text's one leading space may be dropped
    if (bytes[0] == ' ' && tokenizer_.strips_leading_space()) bytes.erase(0, 1);
    at_start_ = false;
  }
  if (pending_.empty() && utf8_valid(bytes)) return bytes;  // the common case: whole characters
  pending_ += bytes;
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
  std::string out = emit(end_byte_run());
  out += utf8_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace nibble::text

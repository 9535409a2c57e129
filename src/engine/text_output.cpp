// TextOutput: a stop string can only newly appear in the last (its length - 1) bytes of the old
// text plus the new piece, so each token costs a search of that window only.
#include "engine/text_output.h"

#include <algorithm>

namespace nibble::engine {

TextOutput::TextOutput(const text::Tokenizer& tokenizer, bool skip_special_tokens, std::vector<std::string> stop,
                       bool include_stop_string)
    : detokenizer_(tokenizer, skip_special_tokens), stop_(std::move(stop)), include_stop_(include_stop_string) {
  std::erase(stop_, std::string());
  for (const std::string& s : stop_) hold_back_ = std::max(hold_back_, s.size() - 1);
  if (include_stop_) hold_back_ = 0;  // the stop string is sent anyway
}

std::string TextOutput::add(int32_t token, bool check_stop) {
  const size_t old_size = text_.size();
  text_ += detokenizer_.add(token);
  return check_stop ? cut_at_stop(old_size) : "";
}

std::string TextOutput::finish(bool check_stop) {
  const size_t old_size = text_.size();
  text_ += detokenizer_.finish();
  return check_stop ? cut_at_stop(old_size) : "";
}

std::string TextOutput::cut_at_stop(size_t old_size) {
  if (text_.size() == old_size) return "";
  size_t best = std::string::npos;
  const std::string* matched = nullptr;
  for (const std::string& s : stop_) {
    const size_t from = old_size >= s.size() - 1 ? old_size - (s.size() - 1) : 0;
    const size_t at = text_.find(s, from);
    if (at < best) {
      best = at;
      matched = &s;
    }
  }
  if (!matched) return "";
  text_.resize(include_stop_ ? best + matched->size() : best);
  taken_ = std::min(taken_, text_.size());
  return *matched;
}

std::string TextOutput::take(bool final) {
  size_t end = text_.size();
  if (!final) {
    end = end > hold_back_ ? end - hold_back_ : 0;
    while (end > taken_ && end < text_.size() && (static_cast<uint8_t>(text_[end]) & 0xC0) == 0x80) --end;
  }
  if (end <= taken_) return "";
  std::string piece = text_.substr(taken_, end - taken_);
  taken_ = end;
  return piece;
}

}  // namespace nibble::engine

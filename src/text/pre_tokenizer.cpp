// Pre-tokenizers as huggingface/tokenizers runs them (tokenizers/src/pre_tokenizers): the steps a
// tokenizer.json names, compiled once at load (PCRE2, JIT where present), and the split of a segment.
#include "text/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

#include "text/utf8.h"

namespace nibble::text {

using json = nlohmann::json;

class Regex {
 public:
  static Result<std::shared_ptr<Regex>> compile(const std::string& pattern, bool literal) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    const uint32_t flags = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    pcre2_code* code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), flags, &error, &offset, nullptr);
    if (!code) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof message);
      return Status::error("regex '" + pattern + "' does not compile at offset " + std::to_string(offset) + ": " +
                           reinterpret_cast<char*>(message));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is absent
    return std::shared_ptr<Regex>(new Regex(code));
  }
  ~Regex() { pcre2_code_free(code_); }

  // Calls on_match(begin, end) for every non-empty match, left to right.
  template <class F>
  void for_each_match(std::string_view s, F on_match) const {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    size_t start = 0;
    while (start <= s.size()) {
      const int rc =
          pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), start, PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc < 0) break;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      if (ov[1] > ov[0]) {
        on_match(ov[0], ov[1]);
        start = ov[1];
      } else {  // empty match: step one character
        if (ov[0] >= s.size()) break;
        size_t i = ov[0];
        next_code_point(s, i);
        start = i;
      }
    }
    pcre2_match_data_free(md);
  }

 private:
  explicit Regex(pcre2_code* code) : code_(code) {}
  pcre2_code* code_;
};

namespace {

// GPT-2's pre-tokenization regex, used by ByteLevel when use_regex is true.
constexpr const char* GPT2_PATTERN = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::vector<std::string> split_piece(const std::string& piece, const PreTokenizerStep& step) {
  std::vector<std::string> out;
  size_t last = 0;
  std::string pending_merge;  // MERGED_WITH_NEXT: a match waiting for the following text
  step.regex->for_each_match(piece, [&](size_t b, size_t e) {
    std::string gap = piece.substr(last, b - last), match = piece.substr(b, e - b);
    switch (step.behavior) {
      case SplitBehavior::ISOLATED:
        if (!gap.empty()) out.push_back(gap);
        out.push_back(match);
        break;
      case SplitBehavior::REMOVED:
        if (!gap.empty()) out.push_back(gap);
        break;
      case SplitBehavior::MERGED_WITH_PREVIOUS:
        if (!gap.empty())
          out.push_back(gap + match);
        else if (!out.empty())
          out.back() += match;
        else
          out.push_back(match);
        break;
      case SplitBehavior::MERGED_WITH_NEXT:
        if (!gap.empty()) out.push_back(pending_merge + gap), pending_merge.clear();
        pending_merge += match;
        break;
    }
    last = e;
  });
  std::string tail = piece.substr(last);
  if (step.behavior == SplitBehavior::MERGED_WITH_NEXT) tail = pending_merge + tail;
  if (!tail.empty()) out.push_back(tail);
  return out;
}

}  // namespace

Status load_pre_tokenizer(const json& p, std::vector<PreTokenizerStep>& out) {
  if (p.is_null()) return Status::ok();
  const std::string type = p.value("type", "");
  if (type == "Sequence") {
    for (const json& child : p.value("pretokenizers", json::array()))
      NIB_RETURN_IF_ERROR(load_pre_tokenizer(child, out));
    return Status::ok();
  }
  PreTokenizerStep step;
  if (type == "ByteLevel") {
    step.add_prefix_space = p.value("add_prefix_space", false);
    if (p.value("use_regex", true)) {
      auto regex = Regex::compile(GPT2_PATTERN, false);
      if (!regex) return regex.status();
      step.regex = *regex;
    }
    out.push_back(step);
    return Status::ok();
  }
  if (type != "Split") {
    return Status::error("pre-tokenizer '" + type + "' is not supported (supported: Split, ByteLevel, Sequence)");
  }
  if (p.value("invert", false)) return Status::error("Split with invert = true is not supported");
  const json& pattern = p.value("pattern", json::object());
  const bool literal = pattern.contains("String");
  if (!literal && !pattern.contains("Regex")) return Status::error("Split pattern needs 'Regex' or 'String'");
  auto regex = Regex::compile(pattern.value(literal ? "String" : "Regex", ""), literal);
  if (!regex) return regex.status();
  step.regex = *regex;
  const std::string behavior = p.value("behavior", "Isolated");
  if (behavior == "Isolated")
    step.behavior = SplitBehavior::ISOLATED;
  else if (behavior == "Removed")
    step.behavior = SplitBehavior::REMOVED;
  else if (behavior == "MergedWithPrevious")
    step.behavior = SplitBehavior::MERGED_WITH_PREVIOUS;
  else if (behavior == "MergedWithNext")
    step.behavior = SplitBehavior::MERGED_WITH_NEXT;
  else
    return Status::error("Split behavior '" + behavior + "' is not supported");
  out.push_back(step);
  return Status::ok();
}

std::vector<std::string> pre_tokenize(const std::string& segment, const std::vector<PreTokenizerStep>& steps) {
  std::vector<std::string> pieces = {segment};
  for (const PreTokenizerStep& step : steps) {
    if (step.add_prefix_space && !pieces.empty() && !pieces[0].empty() && pieces[0][0] != ' ')
      pieces[0].insert(pieces[0].begin(), ' ');
    if (!step.regex) continue;
    std::vector<std::string> next;
    for (const std::string& p : pieces) {
      auto parts = split_piece(p, step);
      next.insert(next.end(), std::make_move_iterator(parts.begin()), std::make_move_iterator(parts.end()));
    }
    pieces = std::move(next);
  }
  return pieces;
}

}  // namespace nibble::text

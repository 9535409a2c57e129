// The pre-tokenizer steps of a tokenizer.json (Split, ByteLevel, Sequence), loaded once and applied to
// each text segment between added tokens before BPE, as huggingface/tokenizers does.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "core/status.h"

namespace nibble::text {

class Regex;  // a compiled PCRE2 pattern (pre_tokenizer.cpp)

// What a Split does with each match (tokenizers' SplitDelimiterBehavior; Contiguous unsupported).
enum class SplitBehavior { ISOLATED, REMOVED, MERGED_WITH_PREVIOUS, MERGED_WITH_NEXT };

struct PreTokenizerStep {
  std::shared_ptr<Regex> regex;  // a Split, or ByteLevel's GPT-2 regex when use_regex
  SplitBehavior behavior = SplitBehavior::ISOLATED;
  bool add_prefix_space = false;  // ByteLevel only
};

// Appends the steps of tokenizer.json's "pre_tokenizer" (null: none); an unsupported one is an error
// that names it.
Status load_pre_tokenizer(const nlohmann::json& p, std::vector<PreTokenizerStep>& out);

// The pieces BPE encodes one by one: segment split by every step in order.
std::vector<std::string> pre_tokenize(const std::string& segment, const std::vector<PreTokenizerStep>& steps);

}  // namespace nibble::text

// Tokenizer and generation-config files of a synthetic checkpoint, by model family.
#pragma once

#include <string>

#include "core/status.h"
#include "io/model_config.h"

namespace nibble::tools {

// The synthetic ERNIE tokenizer's size: the small ERNIE presets take it as their vocabulary, so that
// every id a random model samples is text; the full-size preset keeps ERNIE-4.5's 103,424.
inline constexpr int ERNIE_SYNTH_TOKENIZER_PIECES = 1024;

// Writes the tokenizer files and generation_config.json into out_dir; data: nibble's data/ folder.
Status write_tokenizer_files(const io::ModelConfig& config, const std::string& out_dir, const std::string& data);

}  // namespace nibble::tools

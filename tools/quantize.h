// `nibble quantize`: a BF16 Hugging Face checkpoint → a ModelOpt NVFP4 checkpoint. Weights are
// quantized exactly as nvidia-modelopt does (formats::quantize_weight); input_scales come from a max
// calibration pass through the CPU reference model.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace nibble::tools {

struct QuantizeOptions {
  std::string in_dir;
  std::string out_dir;
  std::string calib_file;            // calibration text; empty: the built-in text
  std::string calib_ids_file;        // or token ids: JSON [[ids...], ...]
  int64_t calib_sequences = 32;      // at most this many sequences ...
  int64_t calib_length = 256;        // ... of at most this many tokens
  uint64_t calib_seed = 0;           // random ids, only for a folder without a tokenizer
  std::vector<std::string> exclude;  // module patterns left in BF16; empty: ModelOpt's default
  uint64_t shard_bytes = 5'000'000'000ull;
};

struct QuantizeReport {
  size_t quantized_modules = 0;
  size_t excluded_modules = 0;
  int64_t calibration_tokens = 0;
  std::string calibration_source;  // what the calibration ran on
  uint64_t total_bytes = 0;
};

Result<QuantizeReport> quantize_checkpoint(const QuantizeOptions& options);

}  // namespace nibble::tools

// Benchmark prompts in the shapes `vllm bench serve` takes: random (token-exact lengths with the
// model's tokenizer, range ratio, shared prefix), ShareGPT JSON, and JSONL prompts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "text/tokenizer.h"

namespace nibble::tools {

struct BenchPrompt {
  std::string text;
  int64_t prompt_len = 0;  // tokens, with the benchmark's tokenizer
  int64_t output_len = 0;  // max tokens to ask for
};

struct RandomDatasetOptions {
  int64_t num_prompts = 100;
  int64_t input_len = 1024;
  int64_t output_len = 128;
  double range_ratio = 0.0;  // lengths uniform in [len·(1−r), len·(1+r)]
  int64_t prefix_len = 0;    // tokens shared by every prompt, before its own
  uint64_t seed = 0;
};

Result<std::vector<BenchPrompt>> random_dataset(const text::Tokenizer& tokenizer, const RandomDatasetOptions& o);
// ShareGPT: [{"conversations": [{"from": "human", "value"}, {"from": "gpt", "value"}, ...]}, ...]; the
// first human turn is the prompt and the reply's length the output length (output_len > 0
// overrides it). Pairs vLLM would drop (prompt or reply < 4 tokens, prompt > 1024, sum > 2048) are
// dropped; prompts are shuffled with the seed and the first num_prompts kept.
Result<std::vector<BenchPrompt>> sharegpt_dataset(const std::string& path, const text::Tokenizer& tokenizer,
                                                  int64_t num_prompts, int64_t output_len, uint64_t seed);
// JSONL: one {"prompt": "...", "output_len"?: N} per line.
Result<std::vector<BenchPrompt>> jsonl_dataset(const std::string& path, const text::Tokenizer* tokenizer,
                                               int64_t num_prompts, int64_t output_len);

}  // namespace nibble::tools

// GSM8K-style accuracy: few-shot prompts and answer extraction exactly as SGLang's
// benchmark/gsm8k/bench_sglang.py builds them, run against any OpenAI-compatible completions
// endpoint; and a generator of synthetic grade-school problems in GSM8K's JSONL format.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace nibble::tools {

struct Gsm8kItem {
  std::string question;
  std::string answer;  // reasoning, then "#### N"
};

Result<std::vector<Gsm8kItem>> read_gsm8k(const std::string& path);
// "Question: q\nAnswer:" (+ " answer" with the answer): SGLang's get_one_example.
std::string gsm8k_example(const Gsm8kItem& item, bool include_answer);
std::string gsm8k_few_shot(const std::vector<Gsm8kItem>& items, int64_t num_shots);
// The last run of digits after removing commas, as SGLang's get_answer_value (ast.literal_eval
// refuses a leading zero, so "007" is invalid there and here); nullopt = invalid.
std::optional<int64_t> gsm8k_answer_value(const std::string& text);

struct Gsm8kOptions {
  std::string data;
  std::string base_url;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string model;
  int64_t num_shots = 8;
  int64_t num_questions = 200;
  int64_t parallel = 64;
  int64_t max_tokens = 512;
  std::string predictions;  // when set: one JSON line per question (label, prediction, correct, text)
};
int run_gsm8k_eval(const Gsm8kOptions& options);

// Synthetic problems (gsm8k_problems.cpp): n of them, deterministic in seed, over gsm8k_like_kinds() kinds.
std::vector<Gsm8kItem> make_gsm8k_like(int64_t n, uint64_t seed);
int64_t gsm8k_like_kinds();

}  // namespace nibble::tools

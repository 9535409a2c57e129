// `nibble bench serve`: a serving benchmark against any OpenAI-compatible server (or nibble's
// native /generate), shaped like `vllm bench serve`: datasets, Poisson/gamma arrivals or all at once,
// a concurrency cap, TTFT/TPOT/ITL/E2EL percentiles, throughput, and a JSON result.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "tools/bench/datasets.h"

namespace nibble::tools {

struct BenchServeOptions {
  std::string base_url;  // http://host:port; else host and port
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string endpoint;                        // default per backend
  std::string backend = "openai-completions";  // openai-completions | openai-chat | nibble
  std::string model;                           // default: the server's first /v1/models entry
  std::string tokenizer;                // folder with tokenizer.json; default: --model if a folder, else the server's
  std::string dataset_name = "random";  // random | sharegpt | jsonl
  std::string dataset_path;
  RandomDatasetOptions random;
  int64_t output_len = 0;  // sharegpt/jsonl: overrides per-prompt output lengths when > 0
  int64_t max_concurrency = 0;
  double request_rate = std::numeric_limits<double>::infinity();
  double burstiness = 1.0;
  bool ignore_eos = false;
  double temperature = 0.0;
  std::string percentile_metrics = "ttft,tpot,itl";
  std::string metric_percentiles = "99";
  bool save_result = false;
  std::string result_dir = ".";
  std::string result_filename;
  bool disable_progress = false;
  // Structured output: none | json-schema | regex | choice, the constraint from structured_file (a
  // JSON schema, a regex, a JSON list of choices) or, without one, a built-in one that random
  // weights fill to the output length (an object whose string is unbounded, a regex of any letters).
  std::string structured = "none";
  std::string structured_file;
};

int run_bench_serve(const BenchServeOptions& options);

}  // namespace nibble::tools

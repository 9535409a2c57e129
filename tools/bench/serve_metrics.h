// Per-request outcomes of a serving benchmark and their summary, computed as `vllm bench serve`
// computes it (numpy's mean/median/std/percentile with linear interpolation), printed in its
// layout and saved with its JSON field names.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace nibble::tools {

struct RequestOutcome {
  bool success = false;
  std::string error;
  double ttft = 0.0;          // s, to the first chunk that carries a token
  std::vector<double> itl;    // s, between consecutive token-carrying chunks
  double latency = 0.0;       // s, request sent → last byte
  double start_offset = 0.0;  // s after the benchmark start
  int64_t prompt_len = 0;
  int64_t output_tokens = 0;
  std::string generated_text;
  // FastDeploy's server-side timing: each chunk's `arrival_time` (s since the request's inference
  // start on the server), or the client's s since sending where a chunk has none; and the server's
  // usage.prompt_tokens (0 when not reported).
  std::vector<double> arrival_time;
  int64_t server_prompt_tokens = 0;
};

double percentile(std::vector<double> values, double p);  // numpy.percentile, linear; 0 for none

// The metrics the summary computes (names as vLLM's --percentile-metrics, and the server-side
// s_* and length ones of FastDeploy's benchmarks/benchmark_serving.py), in its printing order.
inline constexpr const char* SUPPORTED_PERCENTILE_METRICS[] = {
    "s_decode", "ttft", "s_ttft", "tpot", "itl", "s_itl", "e2el", "s_e2el", "input_len", "s_input_len", "output_len"};

struct BenchSummary {
  nlohmann::ordered_json result;  // vLLM's --save-result fields
  std::string printed;            // the result block
};

struct BenchSettings {
  std::string backend, model, tokenizer, dataset;
  int64_t num_prompts = 0;
  double request_rate = 0;  // inf when unlimited
  double burstiness = 1.0;
  int64_t max_concurrency = 0;                  // 0: unlimited
  std::vector<std::string> percentile_metrics;  // a subset of SUPPORTED_PERCENTILE_METRICS
  std::vector<double> metric_percentiles;
};

BenchSummary summarize(const std::vector<RequestOutcome>& outcomes, double duration, const BenchSettings& settings);

}  // namespace nibble::tools

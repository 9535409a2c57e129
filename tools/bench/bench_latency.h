// `nibble bench latency`: an offline benchmark in llama-bench's shape through a model runner (no
// server): prefill throughput (ppN), single-stream decode (tgN), batched decode (S_TG) with long
// prompts and mixed steps (batched decode plus a new prompt each step, serving's prefill steps), per
// activation mode, with load time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace nibble::tools {

struct BenchLatencyOptions {
  std::string model;
  std::string backend = "auto";
  std::string modes = "none";  // activation modes to run, each for MoE and dense: none,static,per-token
  std::string gemm_backend = "auto", moe_backend = "auto", decode_attention = "auto", attention_backend = "auto";
  std::string kv_cache_dtype = "auto";
  std::string pp = "512,2048";          // prefill lengths
  int64_t tg = 128;                     // single-stream decode tokens (after a 1-token prompt)
  std::string batches = "1,16,64,128";  // batched decode: parallel sequences
  int64_t batch_prompt = 1000;          // their prompt length
  int64_t batch_gen = 64;               // decode steps timed per batch size
  std::string mixed;          // prompt lengths: each batch's steps again, each with a new prompt of that length
  int64_t context = 0;        // > 0: batched decode at this context (the batches' prompt length; rows say @N)
  int64_t prefill_chunk = 0;  // > 0: ppN in steps of at most this many tokens (chunked prefill), else one step
  std::string hf_overrides, rope_scaling;  // config.json changes, as nibble serve's
  int64_t tensor_parallel_size = 1;
  bool expert_parallel = false;
  int64_t repeats = 3;                     // median of
  float temperature = 0.0f;                // decode steps' sampling (0: greedy), as a request's
  int32_t top_k = 0;
  float top_p = 1.0f;
  bool enforce_eager = false;
  bool disable_overlap_schedule = false;  // decode steps each collected before the next is launched
  double hbm_tb_s = 4.0;                  // the decode rows' bytes floor: memory bandwidth (TB/s)
  std::string json_out;
};

int run_bench_latency(const BenchLatencyOptions& options);

}  // namespace nibble::tools

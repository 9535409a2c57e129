// `nibble bench kernels`: times the CUDA ops on a model's shapes (Qwen3-30B-A3B or ERNIE-4.5-21B-A3B) against their
// floor (docs/perf.md "Method": max(bytes / HBM bandwidth, FLOPs / BF16 peak)) and cuBLAS BF16 on the same shape.
#pragma once

#include <string>

namespace nibble::tools {

struct BenchKernelsOptions {
  std::string ops = "dense,moe,attention";          // which benchmarks: dense linear, the MoE block, decode attention
  std::string shapes = "qwen3-30b-a3b";             // whose shapes: qwen3-30b-a3b | ernie-4.5-21b-a3b
  std::string m_values = "1,2,4,8,16,64,128,8192";  // dense: rows of x, decode to prefill sizes
  std::string moe_tokens = "1,4,16,64,128,512,2048,8192";  // MoE: tokens, decode to prefill sizes
  std::string attention_contexts = "128,1024,4096";        // decode attention: the token's context lengths
  std::string gemm_backend = "all";                        // dense backends timed: all | one of dense_kernel_names()
  std::string moe_backend = "all";                         // MoE backends timed: all | one of moe_kernel_names()
  double router_skew = -1;                                 // MoE: Zipf exponent of expert loads; < 0: random routers
  double hbm_tb_s = 4.0;                                   // measured copy bandwidth of an H200 (docs/perf.md "Method")
  double bf16_tflops = 800.0;                              // measured cuBLAS BF16 peak
  int iterations = 20;                                     // launches per timed batch
  int batches = 15;                                        // timed batches; the median is reported
  std::string json_out;                                    // also write the rows as JSON
};

int run_bench_kernels(const BenchKernelsOptions& options);

// One MoE block's shape for the MoE benchmark.
struct MoeShape {
  const char* label;
  int64_t experts, top_k, hidden, intermediate;
};

}  // namespace nibble::tools

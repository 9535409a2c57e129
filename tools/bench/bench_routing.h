// `nibble bench routing`: the expert loads a checkpoint's routers give (CPU forward over seeded random
// tokens): per MoE layer the busiest expert's share and rows, the experts holding 90% of the picks, the
// concentration and the picks adjacent tokens share — what decides the MoE kernels' work at a batch.
#pragma once

#include <cstdint>
#include <string>

namespace nibble::tools {

struct BenchRoutingOptions {
  std::string model;
  int64_t tokens = 2048;  // per sequence (a prefill's shape)
  int64_t sequences = 1;  // independent sequences, routed as one batch
  uint64_t seed = 0;
  std::string json_out;
};

int run_bench_routing(const BenchRoutingOptions& options);

}  // namespace nibble::tools

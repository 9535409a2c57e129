// Where a step's GPU time goes: CUDA events between the ops of eager steps, summed per op name and
// per step kind (decode-only steps apart from prefill and mixed ones). Off unless enabled; a
// profiled runner runs every step eagerly (events cannot sit between the nodes of a replayed graph).
// In graphs, op_repeats measures by difference: one op run twice per layer.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace nibble::cuda {

// How many times the model runs op `op` each time it would run it once: 2 for the op named by
// NIBBLE_DIAG_REPEAT_OP (qkv, qk_rope_store, attention, o_proj, post_norm, moe_block — one token's
// one-launch MoE block —, router, gate_up, act_quant, down, combine), else 1. Each of these ops gives
// the same result run twice, or adds its residual twice (timing only). The step time's increase, CUDA
// graphs and PDL included, is the op's cost in the running step — what fusing it away could save at
// most (`WHAT=repeat scripts/device.sh profile`).
int op_repeats(const char* op);

// Closes the time since the last mark under `op` in the step being profiled, if any: how kernels
// below the model (the MoE block's router, GEMMs and combine) split their op.
void profile_mark(const char* op);

class StepProfiler {
 public:
  ~StepProfiler();
  bool enabled() const { return enabled_; }
  void enable() { enabled_ = true; }
  // Starts a step of the given kind (e.g. "decode of 64 tokens"); mark(op) closes the time since the
  // previous mark under `op`; finish() (after the stream is synchronized) adds the step's times. Between
  // begin and finish it is the profiler profile_mark reaches.
  void begin(cudaStream_t stream, const std::string& kind);
  void mark(const char* op);
  Status finish();
  // "kind: n steps, x ms per step; op a ms (p%), ..." for each kind, ops by descending time.
  std::string report() const;

 private:
  cudaEvent_t event();
  bool enabled_ = false;
  cudaStream_t stream_ = nullptr;
  std::string kind_;
  std::vector<std::pair<const char*, cudaEvent_t>> marks_;
  std::vector<cudaEvent_t> pool_;
  size_t used_ = 0;
  std::map<std::string, std::map<std::string, double>> ms_;  // kind → op → total ms
  std::map<std::string, int64_t> steps_;
};

}  // namespace nibble::cuda

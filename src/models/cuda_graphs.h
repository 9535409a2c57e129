// Decode steps as CUDA graphs, whatever the model: one captured per padded batch size (vLLM's list:
// 1, 2, 4, then every 8) and replayed for decode batches of up to that size, with the attention plan
// each was captured under (a replay needs the same launch shape).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "core/status.h"
#include "models/batch.h"

namespace nibble::models {

class DecodeGraphs {
 public:
  DecodeGraphs() = default;
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;
  ~DecodeGraphs();

  // For each size B up to max_batch: prepare(B) stages an all-padding step (outside the capture, the
  // stream then synchronized), plan() names its attention plan, run(B) is captured. Stops at the
  // first size that does not capture (larger batches run eagerly) and logs the sizes it holds.
  Status capture(int64_t max_batch, cudaStream_t stream, const std::function<Status(int64_t)>& prepare,
                 const std::function<std::vector<int64_t>()>& plan, const std::function<Status(int64_t)>& run);
  // The graph size a batch replays (its rows all decode tokens, a logits row each, in order), or 0.
  int64_t size_for(const Batch& batch) const;
  // Whether the attention plan of a step staged at `size` is the one its graph was captured with.
  bool plan_matches(int64_t size, const std::vector<int64_t>& plan) const;
  Status replay(int64_t size, cudaStream_t stream) const;
  bool empty() const { return graphs_.empty(); }

 private:
  std::map<int64_t, cudaGraphExec_t> graphs_;
  std::map<int64_t, std::vector<int64_t>> plans_;
};

}  // namespace nibble::models

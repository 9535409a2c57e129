// Decode steps as CUDA graphs, whatever the model: one captured per padded batch size (vLLM's list:
// 1, 2, 4, then every 8) and attention plan (small sizes have two: the one-launch decode attention's
// and, for long contexts, FlashInfer's), replayed for decode batches of up to that size whose step
// has that plan (a replay needs the same launch shape).
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

  // For each size B up to max_batch: prepare(B, false) stages an all-padding step (outside the
  // capture, the stream then synchronized), plan() names its attention plan, run(B) is captured; sizes
  // up to long_max_batch again after prepare(B, true) (a long-context step's plan). Stops at the first
  // size that does not capture (larger batches run eagerly) and logs the sizes it holds.
  Status capture(int64_t max_batch, int64_t long_max_batch, cudaStream_t stream,
                 const std::function<Status(int64_t, bool)>& prepare, const std::function<std::vector<int64_t>()>& plan,
                 const std::function<Status(int64_t)>& run);
  // The graph size a batch replays (its rows all decode tokens, a logits row each, in order), or 0.
  int64_t size_for(const Batch& batch) const;
  // Whether a graph of this size was captured under the attention plan of a step staged at it.
  bool has(int64_t size, const std::vector<int64_t>& plan) const;
  Status replay(int64_t size, const std::vector<int64_t>& plan, cudaStream_t stream) const;
  bool empty() const { return graphs_.empty(); }

 private:
  std::map<std::pair<int64_t, std::vector<int64_t>>, cudaGraphExec_t> graphs_;  // by (size, plan)
};

}  // namespace nibble::models

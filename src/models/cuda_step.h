// A GPU step's inputs, whatever the model: the batch checked against the runner's limits, then its
// token ids, positions, KV slots, block tables and attention work lists staged through pinned memory
// to one device block in one copy, and the attention kernels' plan for the step.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "cuda/attention/flashinfer_attention.cuh"
#include "cuda/common/device_context.cuh"
#include "models/batch.h"

namespace nibble::models {

struct StepLimits {
  int64_t max_tokens = 0, max_rows = 0, max_seqs = 0;
  int64_t block_size = 16;
  int64_t max_blocks_per_seq = 0;  // a block table's row: context_length() / block_size
  int64_t query_heads_per_kv = 1, head_dim = 0;
  int64_t vocab_size = 0;
  // Decode steps of up to this many rows run the one-launch decode attention (0: never).
  int64_t one_launch_max_rows = 0;
  int64_t one_launch_max_keys = 0;  // ... whose longest context is at most this
  // Native attention: decode tokens go to the tensor-core kernel as one-token items from this many a step.
  int64_t tensor_core_decode_min_rows = 16;
};

// The staged step, as the kernels read it (device pointers into the step block).
struct StagedStep {
  int32_t *ids = nullptr, *positions = nullptr, *token_seq = nullptr, *block_tables = nullptr, *rows = nullptr;
  int64_t* slots = nullptr;
  // Native attention's work lists: prefill chunks as tensor-core items, decode rows for the split-KV kernel.
  int4* items = nullptr;
  int32_t* decode_rows = nullptr;
  int64_t n_items = 0, n_decode = 0;
  bool lists = false;       // whether the native attention reads the lists (else every row is a decode row)
  bool one_launch = false;  // a decode step for the one-launch decode attention
  int64_t max_keys = 0;     // the longest context in the step
};

class StepInputs {
 public:
  // The device block and two pinned host blocks for steps of up to limits.max_tokens tokens.
  Status init(const StepLimits& limits, cuda::DeviceArena& arena);
  // Padding rows of a graph write into this block (one past the engine's: allocate_kv_cache).
  void set_kv_blocks(int64_t n_blocks) { n_blocks_ = n_blocks, trash_block_ = static_cast<int32_t>(n_blocks); }
  int32_t trash_block() const { return trash_block_; }

  // Whether a batch fits the limits and names valid blocks, tokens and rows.
  Status check(const Batch& batch) const;
  // The step's metadata into pinned memory, padded to T tokens (padding: token 0 at position 0 of the
  // trash block), then to the device on `stream`; FlashInfer (when given) plans the step's attention.
  // The two pinned blocks alternate: the caller waits for a step before staging the one after next,
  // so a copy never reads a block being rewritten.
  // long_context: stage as a step past one_launch_max_keys would be (a graph family's capture).
  Status stage(const Batch& batch, int64_t T, int64_t n_rows, bool eager, cuda::FlashInferAttention* flashinfer,
               cudaStream_t stream, bool long_context = false);
  const StagedStep& staged() const { return staged_; }

 private:
  StepLimits limits_;
  StagedStep staged_;
  uint8_t* device_block_ = nullptr;
  cuda::PinnedArray<uint8_t> host_blocks_[2];
  int host_parity_ = 0;
  int64_t n_blocks_ = 0;
  int32_t trash_block_ = 0;
};

}  // namespace nibble::models

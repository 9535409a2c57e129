// One forward step's work, as continuous batching builds it: prefill chunks and decode tokens of
// many sequences, each with its positions and KV block table.
#pragma once

#include <cstdint>
#include <vector>

namespace nibble::models {

struct BatchSequence {
  std::vector<int32_t> block_table;  // physical KV blocks holding this sequence, in logical order
  int64_t start_position = 0;        // tokens of this sequence already in the KV cache
  int64_t n_tokens = 0;              // tokens of this sequence in this step (a prefill chunk, or 1)
};

// Overlapped scheduling: a step is built before the step running ahead of it has drawn its tokens,
// so a token id may stand for "the token the previous step draws for its logits row j". The runner
// resolves it where the drawn tokens are (on the GPU, on the device: the host never waits for them).
inline constexpr int32_t pending_token(int64_t row) { return static_cast<int32_t>(-1 - row); }
inline constexpr bool is_pending_token(int32_t id) { return id < 0; }
inline constexpr int64_t pending_row(int32_t id) { return -1 - int64_t{id}; }

struct Batch {
  // All tokens of the step, sequence after sequence; ids of the vocabulary or pending_token(j).
  std::vector<int32_t> token_ids;
  std::vector<BatchSequence> sequences;
  std::vector<int64_t> logits_rows;  // rows of token_ids whose next-token logits are wanted
};

}  // namespace nibble::models

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

struct Batch {
  std::vector<int32_t> token_ids;       // all tokens of the step, sequence after sequence
  std::vector<BatchSequence> sequences;
  std::vector<int64_t> logits_rows;     // rows of token_ids whose next-token logits are wanted
};

}  // namespace nibble::models

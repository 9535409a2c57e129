// A sequence as the scheduler sees it: its tokens (prompt, then output), how many of them are in
// the KV cache, and the blocks holding them. The engine keeps its per-request state beside it.
#pragma once

#include <cstdint>
#include <vector>

namespace nibble::engine {

enum class SequenceStatus { WAITING, RUNNING, FINISHED };

struct Sequence {
  uint64_t id = 0;              // arrival order: lower ids are served first and preempted last
  std::vector<int32_t> tokens;  // prompt + generated
  // The last n_pending tokens are still being drawn by steps in flight (overlapped scheduling):
  // their ids are models::pending_token placeholders until the engine collects those steps.
  int64_t n_pending = 0;
  int64_t prompt_len = 0;
  int64_t n_computed = 0;  // tokens whose K/V are in the cache
  std::vector<int32_t> block_table;
  std::vector<uint64_t> block_hashes;  // chain hashes of the registered full blocks (prefix cache)
  SequenceStatus status = SequenceStatus::WAITING;
  bool started = false;          // scheduled at least once (a weight reload waits for these)
  int64_t n_cached_prompt = -1;  // prompt tokens found in the prefix cache at first admission
  int64_t n_preemptions = 0;
  double arrival_seconds = 0.0;  // when its request arrived (steady clock; --scheduler-delay-factor)
  // Its prompt positions are scored (prompt logprobs) until the engine has scored them all: each
  // position but the last then adds a logits row, within SchedulerLimits::max_score_rows a step.
  bool scores_prompt = false;

  int64_t n_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t n_output() const { return n_tokens() - prompt_len; }
};

}  // namespace nibble::engine

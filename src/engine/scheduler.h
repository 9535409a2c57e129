// The continuous-batching scheduler (plain C++, no device code). Each step it serves running
// sequences first (one decode token each, or the next chunk of an unfinished prefill), then admits
// waiting ones first-come first-served, within max_num_seqs, the token budget and the KV blocks. A
// running sequence with nothing to compute (its last token is still being drawn) sits a step out.
// When blocks run out it preempts the most recent running sequence (recompute: its blocks are
// freed and it waits at the front of the queue), so nothing is lost and the oldest always progress.
// With a delay factor (vLLM's --scheduler-delay-factor) waiting sequences are admitted only once the
// oldest has waited delay_factor × the last prompt step's latency (or nothing runs), so prompts that
// arrive close together share one prefill step instead of each costing a step of its own.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "engine/block_manager.h"
#include "engine/sequence.h"

namespace nibble::engine {

struct SchedulerLimits {
  int64_t max_num_seqs = 256;
  int64_t max_num_batched_tokens = 8192;
  double delay_factor = 0.0;     // 0: admit whenever the budget allows
  int64_t max_score_rows = 256;  // prompt positions scored a step (Sequence::scores_prompt)
};

struct ScheduledChunk {
  Sequence* seq = nullptr;
  int64_t start = 0;  // first position computed in this step (== n_computed before the step)
  int64_t n_tokens = 0;
  bool wants_logits = false;  // the chunk reaches the end of the sequence's tokens: sample next
};

struct StepPlan {
  std::vector<ScheduledChunk> chunks;
  int64_t n_tokens = 0;
  int64_t n_preempted = 0;
  bool empty() const { return chunks.empty(); }
};

class Scheduler {
 public:
  Scheduler(SchedulerLimits limits, BlockManager& blocks) : limits_(limits), blocks_(blocks) {}

  void add(Sequence* seq);  // to the back of the waiting queue
  // Builds the next step. With admit_new false only sequences already started are served
  // (running ones, and preempted ones waiting to resume): a weight reload drains with it. `now`
  // (seconds, the clock of Sequence::arrival_seconds) matters only with a delay factor.
  StepPlan schedule(bool admit_new = true, double now = 0.0);
  // Once the step is launched (the device runs steps in order, so a later step sees its K/V): the
  // scheduled tokens count as computed; full blocks of drawn (not pending) tokens join the prefix cache.
  void complete(const StepPlan& plan);
  // Removes a sequence (finished or aborted) wherever it is and releases its blocks.
  void finish(Sequence* seq);

  const std::deque<Sequence*>& waiting() const { return waiting_; }
  const std::vector<Sequence*>& running() const { return running_; }
  int64_t n_started_waiting() const;  // preempted sequences waiting to resume
  int64_t total_preemptions() const { return total_preemptions_; }

 private:
  bool grow_to(Sequence* seq, int64_t n_tokens);  // blocks for the first n_tokens positions
  void preempt(Sequence* seq);
  bool passed_delay(double now);

  SchedulerLimits limits_;
  BlockManager& blocks_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // in arrival order
  int64_t total_preemptions_ = 0;
  // The delay factor's clock: the last schedule() call, whether it admitted a prompt, and the time
  // from the last call that did to the call after it (vLLM's last_prompt_latency).
  double prev_time_ = 0.0, last_prompt_latency_ = 0.0;
  bool prev_admitted_ = false;
};

}  // namespace nibble::engine

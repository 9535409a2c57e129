// Scheduler: running first (oldest first, preempting from the newest when blocks run out), then
// FCFS admission with prefix-cache lookup; a chunked prefill takes what is left of the budget.
#include "engine/scheduler.h"

#include <algorithm>

#include "core/check.h"

namespace nibble::engine {

void Scheduler::add(Sequence* seq) {
  seq->status = SequenceStatus::WAITING;
  waiting_.push_back(seq);
}

bool Scheduler::grow_to(Sequence* seq, int64_t n_tokens) {
  const int64_t need =
      BlockManager::blocks_for(n_tokens, blocks_.block_size()) - static_cast<int64_t>(seq->block_table.size());
  return need <= 0 || blocks_.allocate(need, seq->block_table);
}

void Scheduler::preempt(Sequence* seq) {
  blocks_.release(seq->block_table, seq->block_hashes);
  seq->n_computed = 0;  // recompute: prompt and output so far are prefilled again on resume
  seq->status = SequenceStatus::WAITING;
  ++seq->n_preemptions;
  ++total_preemptions_;
  waiting_.push_front(seq);
}

int64_t Scheduler::n_started_waiting() const {
  return std::count_if(waiting_.begin(), waiting_.end(), [](const Sequence* s) { return s->started; });
}

// vLLM's Scheduler._passed_delay: the oldest waiting sequence has waited delay_factor × the last
// prompt step's latency, or nothing is running (then waiting only idles the device).
bool Scheduler::passed_delay(double now) {
  if (prev_admitted_) last_prompt_latency_ = now - prev_time_;
  prev_time_ = now;
  prev_admitted_ = false;
  if (limits_.delay_factor <= 0.0 || waiting_.empty() || running_.empty()) return true;
  double earliest = waiting_.front()->arrival_seconds;
  for (const Sequence* seq : waiting_) earliest = std::min(earliest, seq->arrival_seconds);
  return now - earliest > limits_.delay_factor * last_prompt_latency_;
}

// A scoring sequence's chunk of n tokens cut to the score rows left this step (one a prompt position
// but the last); those it takes are spent.
static int64_t fit_score_rows(const Sequence& seq, int64_t n, int64_t& score_left) {
  if (!seq.scores_prompt) return n;
  const int64_t rows = std::min(n, std::max<int64_t>(seq.prompt_len - 1 - seq.n_computed, 0));
  if (rows > score_left) n = score_left;
  score_left -= std::min(rows, score_left);
  return n;
}

StepPlan Scheduler::schedule(bool admit_new, double now) {
  const bool admit = passed_delay(now);
  StepPlan plan;
  int64_t budget = limits_.max_num_batched_tokens;
  int64_t score_left = limits_.max_score_rows;
  auto add_chunk = [&](Sequence* seq, int64_t n) {
    plan.chunks.push_back({seq, seq->n_computed, n, seq->n_computed + n == seq->n_tokens()});
    plan.n_tokens += n;
    budget -= n;
  };

  // 1. Running sequences, oldest first; a sequence that cannot get blocks preempts the newest.
  std::vector<Sequence*> kept;
  for (size_t i = 0; i < running_.size(); ++i) {
    Sequence* seq = running_[i];
    if (budget <= 0) {
      kept.push_back(seq);
      continue;
    }
    const int64_t n = fit_score_rows(*seq, std::min(seq->n_tokens() - seq->n_computed, budget), score_left);
    if (n == 0) {  // its next token comes from a step in flight that it ends with (length), or no score rows are left
      kept.push_back(seq);
      continue;
    }
    bool placed = false;
    while (!(placed = grow_to(seq, seq->n_computed + n))) {
      if (running_.size() - 1 == i) break;  // no newer sequence left to preempt
      preempt(running_.back());
      running_.pop_back();
      ++plan.n_preempted;
    }
    if (!placed) {
      preempt(seq);  // even alone it does not fit now; it resumes when blocks free up
      ++plan.n_preempted;
      running_.pop_back();
      break;
    }
    add_chunk(seq, n);
    kept.push_back(seq);
  }
  running_ = std::move(kept);

  // 2. Waiting sequences, first come first served; none when this step had to preempt.
  while (admit && plan.n_preempted == 0 && budget > 0 && !waiting_.empty() &&
         static_cast<int64_t>(running_.size()) < limits_.max_num_seqs) {
    Sequence* seq = waiting_.front();
    if (!admit_new && !seq->started) break;
    if (seq->block_table.empty()) {  // a scoring prompt computes every position
      const int64_t cached =
          seq->scores_prompt ? 0 : blocks_.match_prefix(seq->tokens, seq->block_table, seq->block_hashes);
      seq->n_computed = cached;
      if (seq->n_cached_prompt < 0) seq->n_cached_prompt = std::min(cached, seq->prompt_len);
    }
    const int64_t n = fit_score_rows(*seq, std::min(seq->n_tokens() - seq->n_computed, budget), score_left);
    if (n == 0) break;  // no score rows left this step: it waits for the next
    if (!grow_to(seq, seq->n_computed + n)) {
      blocks_.release(seq->block_table, seq->block_hashes);  // give the cached blocks back; retry later
      seq->n_computed = 0;
      break;
    }
    waiting_.pop_front();
    seq->status = SequenceStatus::RUNNING;
    seq->started = true;
    running_.push_back(seq);
    add_chunk(seq, n);
    prev_admitted_ = true;
  }
  return plan;
}

void Scheduler::complete(const StepPlan& plan) {
  for (const ScheduledChunk& c : plan.chunks) {
    Sequence* seq = c.seq;
    if (seq->status == SequenceStatus::FINISHED) continue;
    seq->n_computed = c.start + c.n_tokens;
    const int64_t drawn = std::min(seq->n_computed, seq->n_tokens() - seq->n_pending);
    blocks_.register_full_blocks(seq->tokens, drawn, seq->block_table, seq->block_hashes);
  }
}

void Scheduler::finish(Sequence* seq) {
  if (seq->status == SequenceStatus::FINISHED) return;
  auto r = std::find(running_.begin(), running_.end(), seq);
  if (r != running_.end()) running_.erase(r);
  auto w = std::find(waiting_.begin(), waiting_.end(), seq);
  if (w != waiting_.end()) waiting_.erase(w);
  blocks_.release(seq->block_table, seq->block_hashes);
  seq->status = SequenceStatus::FINISHED;
}

}  // namespace nibble::engine

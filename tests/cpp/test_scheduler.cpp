// Block manager and scheduler under random traces: blocks are never lost or double-owned, every
// sequence finishes, preemption happens under a small budget and the oldest sequence always
// progresses; the prefix cache shares full blocks, verifies tokens, and evicts LRU.
#include <gtest/gtest.h>

#include <algorithm>
#include <list>
#include <map>
#include <memory>
#include <random>
#include <set>

#include "engine/block_manager.h"
#include "engine/scheduler.h"
#include "test_seed.h"

namespace nibble::engine {
namespace {

TEST(BlockManager, PrefixCacheSharesFullBlocksAndKeepsTheLastTokenToCompute) {
  BlockManager blocks(8, 4, true);
  std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<int32_t> table;
  std::vector<uint64_t> hashes;
  EXPECT_EQ(blocks.match_prefix(tokens, table, hashes), 0);
  ASSERT_TRUE(blocks.allocate(3, table));
  blocks.register_full_blocks(tokens, 9, table, hashes);
  EXPECT_EQ(hashes.size(), 2u);  // the third block holds only one token

  std::vector<int32_t> table2;
  std::vector<uint64_t> hashes2;
  EXPECT_EQ(blocks.match_prefix(tokens, table2, hashes2), 8);  // both full blocks, shared
  EXPECT_EQ(table2, std::vector<int32_t>(table.begin(), table.begin() + 2));
  EXPECT_EQ(blocks.n_used(), 3);
  // Exactly 8 tokens: at most 7 may come from the cache (the last is computed for its logits).
  std::vector<int32_t> eight(tokens.begin(), tokens.begin() + 8), table3;
  std::vector<uint64_t> hashes3;
  EXPECT_EQ(blocks.match_prefix(eight, table3, hashes3), 4);
  // A different first block shares nothing even though the second block's tokens match.
  std::vector<int32_t> other = {9, 9, 9, 9, 5, 6, 7, 8, 1}, table4;
  std::vector<uint64_t> hashes4;
  EXPECT_EQ(blocks.match_prefix(other, table4, hashes4), 0);

  blocks.release(table, hashes);
  blocks.release(table2, hashes2);
  blocks.release(table3, hashes3);
  EXPECT_EQ(blocks.n_free(), 8);
  // Freed cached blocks still hit until they are evicted by new allocations.
  std::vector<int32_t> again;
  std::vector<uint64_t> again_h;
  EXPECT_EQ(blocks.match_prefix(tokens, again, again_h), 8);
  blocks.release(again, again_h);
  std::vector<int32_t> filler;
  ASSERT_TRUE(blocks.allocate(8, filler));  // everything, cached blocks last
  EXPECT_FALSE(blocks.allocate(1, filler));
  std::vector<uint64_t> no_hashes;
  blocks.release(filler, no_hashes);
  std::vector<int32_t> after;
  std::vector<uint64_t> after_h;
  EXPECT_EQ(blocks.match_prefix(tokens, after, after_h), 0);  // evicted
  blocks.reset_prefix_cache();
}

TEST(BlockManager, ResetForgetsTheCache) {
  BlockManager blocks(4, 2, true);
  std::vector<int32_t> tokens = {5, 6, 7}, table;
  std::vector<uint64_t> hashes;
  ASSERT_TRUE(blocks.allocate(2, table));
  blocks.register_full_blocks(tokens, 3, table, hashes);
  blocks.release(table, hashes);
  blocks.reset_prefix_cache();
  EXPECT_EQ(blocks.match_prefix(tokens, table, hashes), 0);
}

// The free list's LRU order and the prefix cache, checked against a plain model (a std::list of
// ids: released cached blocks to the back, plain ones to the front; a map from a block's whole token
// prefix to the block caching it): under random allocations, releases, prefix registrations and
// lookups, the block manager finds the same prefixes, hands out the same ids and counts the same
// free blocks.
TEST(BlockManager, FreeListAndPrefixCacheMatchAPlainModel) {
  const uint64_t seed = test::test_seed("FreeListAndPrefixCacheMatchAPlainModel");
  std::mt19937_64 rng(seed);
  constexpr int64_t N = 24, B = 2;
  BlockManager blocks(N, B, true);
  std::list<int32_t> model_free;
  for (int32_t id = 0; id < N; ++id) model_free.push_back(id);
  std::map<int32_t, int> refs;
  std::map<std::vector<int32_t>, int32_t> by_prefix;  // tokens [0, (j + 1)·B) → the block j caching them
  std::map<int32_t, std::vector<int32_t>> cached;     // block → its key in by_prefix
  struct Holder {
    std::vector<int32_t> tokens, table;
    std::vector<uint64_t> hashes;
  };
  std::vector<Holder> holders;
  auto release = [&](const std::vector<int32_t>& table) {
    for (auto it = table.rbegin(); it != table.rend(); ++it)
      if (--refs[*it] == 0) {
        if (cached.count(*it))
          model_free.push_back(*it);
        else
          model_free.push_front(*it);
      }
  };
  for (int op = 0; op < 4000; ++op) {
    if (rng() % 3 == 0 || holders.empty()) {  // a new sequence: prefix lookup, then fresh blocks
      Holder h;
      const int len = 1 + static_cast<int>(rng() % 9);
      for (int i = 0; i < len; ++i) h.tokens.push_back(static_cast<int32_t>(rng() % 3));  // few values: many hits
      std::vector<int32_t> expected_hits;
      for (int64_t j = 0; j < (len - 1) / B; ++j) {
        auto it = by_prefix.find(std::vector<int32_t>(h.tokens.begin(), h.tokens.begin() + (j + 1) * B));
        if (it == by_prefix.end()) break;
        expected_hits.push_back(it->second);
      }
      const int64_t hit = blocks.match_prefix(h.tokens, h.table, h.hashes);
      ASSERT_EQ(h.table, expected_hits) << "seed " << seed;
      ASSERT_EQ(hit, static_cast<int64_t>(expected_hits.size()) * B);
      for (int32_t id : h.table)
        if (refs[id]++ == 0) model_free.remove(id);
      const int64_t need = BlockManager::blocks_for(len, B) - hit / B;
      const bool fits = need <= static_cast<int64_t>(model_free.size());
      ASSERT_EQ(blocks.allocate(need, h.table), fits) << "seed " << seed;
      if (!fits) {
        const std::vector<int32_t> shared = h.table;
        blocks.release(h.table, h.hashes);
        release(shared);
        continue;
      }
      for (int64_t i = 0; i < need; ++i) {
        const int32_t id = model_free.front();
        model_free.pop_front();
        ASSERT_EQ(h.table[h.table.size() - static_cast<size_t>(need) + static_cast<size_t>(i)], id) << "seed " << seed;
        if (auto c = cached.find(id); c != cached.end()) {  // evicted on reuse
          by_prefix.erase(c->second);
          cached.erase(c);
        }
        refs[id] = 1;
      }
      blocks.register_full_blocks(h.tokens, len, h.table, h.hashes);
      for (int64_t j = 0; j < len / B; ++j) {
        std::vector<int32_t> key(h.tokens.begin(), h.tokens.begin() + (j + 1) * B);
        const int32_t id = h.table[static_cast<size_t>(j)];
        if (cached.count(id) || by_prefix.count(key)) continue;  // shared already, or a duplicate
        by_prefix[key] = id;
        cached[id] = std::move(key);
      }
      holders.push_back(std::move(h));
    } else {  // a sequence ends
      const size_t i = rng() % holders.size();
      Holder h = std::move(holders[i]);
      holders.erase(holders.begin() + static_cast<std::ptrdiff_t>(i));
      const std::vector<int32_t> table = h.table;
      blocks.release(h.table, h.hashes);
      release(table);
    }
    ASSERT_EQ(blocks.n_free(), static_cast<int64_t>(model_free.size())) << "seed " << seed;
  }
}

struct Trace {
  std::vector<std::unique_ptr<Sequence>> seqs;
  std::map<Sequence*, int64_t> target;  // total tokens at which the sequence finishes
};

// Runs the scheduler to completion over random sequences; each step's "model" appends one token
// to every sequence whose chunk reached its end.
void run_trace(uint64_t seed, int64_t n_blocks, int64_t block_size, SchedulerLimits limits, bool prefix,
               int64_t* preemptions) {
  std::mt19937_64 rng(seed);
  BlockManager blocks(n_blocks, block_size, prefix);
  Scheduler scheduler(limits, blocks);
  Trace trace;
  const int64_t capacity = n_blocks * block_size;
  for (int i = 0; i < 40; ++i) {
    auto s = std::make_unique<Sequence>();
    s->id = i;
    const int64_t prompt = 1 + static_cast<int64_t>(rng() % (capacity / 2));
    for (int64_t t = 0; t < prompt; ++t) s->tokens.push_back(static_cast<int32_t>(i < 20 ? t % 7 : rng() % 50));
    s->prompt_len = prompt;
    trace.target[s.get()] = std::min<int64_t>(capacity, prompt + 1 + static_cast<int64_t>(rng() % 20));
    trace.seqs.push_back(std::move(s));
  }
  size_t submitted = 0;
  int64_t finished = 0;
  for (int step = 0; step < 100000 && finished < 40; ++step) {
    if (submitted < trace.seqs.size() && rng() % 3 == 0) scheduler.add(trace.seqs[submitted++].get());
    const StepPlan plan = scheduler.schedule();
    int64_t tokens = 0;
    std::set<int32_t> owned_once;
    for (const ScheduledChunk& c : plan.chunks) {
      tokens += c.n_tokens;
      ASSERT_GE(c.n_tokens, 1);
      ASSERT_LE(static_cast<int64_t>(c.seq->block_table.size()) * block_size, capacity);
      ASSERT_GE(static_cast<int64_t>(c.seq->block_table.size()) * block_size, c.start + c.n_tokens);
    }
    ASSERT_LE(tokens, limits.max_num_batched_tokens);
    ASSERT_LE(static_cast<int64_t>(scheduler.running().size()), limits.max_num_seqs);
    // Every block is owned by at most one running sequence, except shared full prefix blocks.
    std::map<int32_t, int> owners;
    for (Sequence* s : scheduler.running())
      for (int32_t b : s->block_table) ++owners[b];
    ASSERT_LE(static_cast<int64_t>(owners.size()), n_blocks);
    ASSERT_EQ(blocks.n_used(), static_cast<int64_t>(owners.size()));
    if (plan.empty()) {
      ASSERT_TRUE(scheduler.running().empty() && (scheduler.waiting().empty() || submitted < trace.seqs.size()))
          << "stuck with work queued";
      continue;
    }
    scheduler.complete(plan);
    for (const ScheduledChunk& c : plan.chunks) {
      if (!c.wants_logits) continue;
      Sequence* s = c.seq;
      s->tokens.push_back(static_cast<int32_t>(rng() % 50));
      if (s->n_tokens() >= trace.target[s]) {
        scheduler.finish(s);
        ++finished;
      }
    }
  }
  ASSERT_EQ(finished, 40) << "not every sequence finished";
  EXPECT_EQ(blocks.n_used(), 0);
  *preemptions = scheduler.total_preemptions();
}

TEST(Scheduler, RandomTracesFinishEverySequenceWithoutLeaks) {
  const uint64_t seed = test::test_seed("Scheduler.RandomTraces");
  int64_t preemptions = 0;
  run_trace(seed, 64, 4, {8, 32}, /*prefix=*/true, &preemptions);
  run_trace(seed + 1, 64, 4, {8, 32}, /*prefix=*/false, &preemptions);
  int64_t tight = 0;
  run_trace(seed + 2, 12, 4, {16, 8}, /*prefix=*/true, &tight);  // a budget that must preempt
  EXPECT_GT(tight, 0);
}

TEST(Scheduler, ChunkedPrefillRespectsTheTokenBudgetAndDecodesComeFirst) {
  BlockManager blocks(100, 4, false);
  Scheduler scheduler({4, 10}, blocks);
  Sequence a, b;
  a.id = 0;
  a.tokens.assign(3, 1);
  a.prompt_len = 3;
  b.id = 1;
  b.tokens.assign(25, 2);
  b.prompt_len = 25;
  scheduler.add(&a);
  scheduler.add(&b);
  StepPlan p1 = scheduler.schedule();
  ASSERT_EQ(p1.chunks.size(), 2u);
  EXPECT_EQ(p1.chunks[0].n_tokens, 3);
  EXPECT_TRUE(p1.chunks[0].wants_logits);
  EXPECT_EQ(p1.chunks[1].n_tokens, 7);  // the rest of the budget
  EXPECT_FALSE(p1.chunks[1].wants_logits);
  scheduler.complete(p1);
  a.tokens.push_back(9);
  StepPlan p2 = scheduler.schedule();
  ASSERT_EQ(p2.chunks.size(), 2u);
  EXPECT_EQ(p2.chunks[0].seq, &a);  // the decode first
  EXPECT_EQ(p2.chunks[0].n_tokens, 1);
  EXPECT_EQ(p2.chunks[1].start, 7);
  EXPECT_EQ(p2.chunks[1].n_tokens, 9);
}

// Overlapped scheduling: a drawn-but-pending last token is computed by the next step, never joins
// the prefix cache as a placeholder, and a sequence whose next token is not queued sits a step out.
TEST(Scheduler, PendingTokensAreComputedButNotCachedAndIdleSequencesSitOut) {
  BlockManager blocks(100, 4, true);
  Scheduler scheduler({4, 64}, blocks);
  Sequence a, b;
  a.id = 0, b.id = 1;
  for (int32_t t = 0; t < 7; ++t) a.tokens.push_back(10 + t), b.tokens.push_back(30 + t);
  a.prompt_len = b.prompt_len = 7;
  scheduler.add(&a);
  scheduler.add(&b);
  StepPlan p1 = scheduler.schedule();
  ASSERT_EQ(p1.chunks.size(), 2u);
  scheduler.complete(p1);
  // a's next token is in flight (a placeholder, as the engine pushes it); b ends with its draw.
  a.tokens.push_back(-1);
  a.n_pending = 1;
  StepPlan p2 = scheduler.schedule();
  ASSERT_EQ(p2.chunks.size(), 1u) << "b has nothing to compute until its token is collected";
  EXPECT_EQ(p2.chunks[0].seq, &a);
  EXPECT_EQ(p2.chunks[0].start, 7);
  EXPECT_EQ(p2.chunks[0].n_tokens, 1);
  EXPECT_EQ(scheduler.running().size(), 2u) << "b is still running";
  scheduler.complete(p2);
  EXPECT_EQ(a.n_computed, 8);
  EXPECT_EQ(a.block_hashes.size(), 1u) << "the block holding the placeholder is not cached yet";
  // The token arrives; the next step registers the now-drawn block.
  a.tokens.back() = 99;
  a.n_pending = 0;
  a.tokens.push_back(-1);
  a.n_pending = 1;
  StepPlan p3 = scheduler.schedule();
  scheduler.complete(p3);
  EXPECT_EQ(a.block_hashes.size(), 2u);
  Sequence c;
  c.id = 2;
  c.tokens = {10, 11, 12, 13, 14, 15, 16, 99, 5};
  c.prompt_len = 9;
  std::vector<int32_t> table;
  std::vector<uint64_t> hashes;
  EXPECT_EQ(blocks.match_prefix(c.tokens, table, hashes), 8) << "the drawn token's block is found by its value";
  blocks.release(table, hashes);
  scheduler.finish(&a);
  scheduler.finish(&b);
  EXPECT_EQ(blocks.n_used(), 0);
}

// vLLM's --scheduler-delay-factor: with sequences running, a new prompt waits until the oldest
// waiting one has waited factor × the last prompt step's latency (the time from the call that
// admitted a prompt to the next call); with nothing running it is admitted at once.
TEST(Scheduler, DelayFactorHoldsNewPromptsForTheLastPromptLatency) {
  BlockManager blocks(100, 4, false);
  Scheduler scheduler({8, 64, /*delay_factor=*/2.0}, blocks);
  Sequence a, b, c;
  a.id = 0, b.id = 1, c.id = 2;
  for (Sequence* s : {&a, &b, &c}) s->tokens.assign(5, 7), s->prompt_len = 5;
  a.arrival_seconds = 10.0;
  scheduler.add(&a);
  StepPlan p1 = scheduler.schedule(true, 10.0);  // nothing runs: admitted at once
  ASSERT_EQ(p1.chunks.size(), 1u);
  scheduler.complete(p1);
  a.tokens.push_back(1);
  b.arrival_seconds = 10.05;
  scheduler.add(&b);
  // The call after a's admission, 0.1 s later: the last prompt latency is 0.1 s, so b (waiting
  // 0.05 s) is held until it has waited 2 × 0.1 = 0.2 s; a decodes meanwhile.
  StepPlan p2 = scheduler.schedule(true, 10.1);
  ASSERT_EQ(p2.chunks.size(), 1u);
  EXPECT_EQ(p2.chunks[0].seq, &a);
  scheduler.complete(p2);
  a.tokens.push_back(1);
  c.arrival_seconds = 10.2;
  scheduler.add(&c);
  StepPlan p3 = scheduler.schedule(true, 10.2);
  ASSERT_EQ(p3.chunks.size(), 1u) << "b has waited 0.15 s of 0.2";
  scheduler.complete(p3);
  a.tokens.push_back(1);
  StepPlan p4 = scheduler.schedule(true, 10.26);  // b has waited 0.21 s: b and c share the step
  ASSERT_EQ(p4.chunks.size(), 3u);
  EXPECT_EQ(p4.chunks[1].seq, &b);
  EXPECT_EQ(p4.chunks[2].seq, &c);
  EXPECT_EQ(p4.chunks[1].n_tokens + p4.chunks[2].n_tokens, 10);

  // Without the factor the same arrivals are admitted the step they come.
  BlockManager blocks0(100, 4, false);
  Scheduler plain({8, 64}, blocks0);
  Sequence d, e;
  d.id = 0, e.id = 1;
  for (Sequence* s : {&d, &e}) s->tokens.assign(5, 7), s->prompt_len = 5;
  plain.add(&d);
  StepPlan q1 = plain.schedule(true, 10.0);
  plain.complete(q1);
  d.tokens.push_back(1);
  plain.add(&e);
  EXPECT_EQ(plain.schedule(true, 10.1).chunks.size(), 2u);
}

}  // namespace
}  // namespace nibble::engine

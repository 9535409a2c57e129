// The data-parallel front's pieces (engine/engine_group.h): the routing table's prefix match and LRU
// bound, the block hashes' chaining, and the sum of engines' metrics.
#include <gtest/gtest.h>

#include "engine/engine_group.h"

using namespace nibble::engine;

TEST(EngineGroup, BlockHashesChainSoAPrefixMatchesOnlyFromTheStart) {
  std::vector<int32_t> a(40), b(40);
  for (int i = 0; i < 40; ++i) a[i] = i, b[i] = i;
  b[20] = 999;  // differs in the second block
  const auto ha = prefix_block_hashes(a, 16), hb = prefix_block_hashes(b, 16);
  ASSERT_EQ(ha.size(), 2u);  // full blocks only
  EXPECT_EQ(ha[0], hb[0]);
  EXPECT_NE(ha[1], hb[1]);
  // The same block after a different first block hashes differently (the chain).
  std::vector<int32_t> c(a.begin() + 16, a.begin() + 32);
  c.insert(c.begin(), a.begin() + 16, a.begin() + 32);
  EXPECT_NE(prefix_block_hashes(c, 16)[1], ha[1]);
  EXPECT_TRUE(prefix_block_hashes(std::vector<int32_t>(15, 1), 16).empty());
}

TEST(EngineGroup, PrefixTableMatchesLeadingBlocksAndEvictsTheLeastRecent) {
  PrefixTable t(4);
  t.insert({1, 2, 3});
  EXPECT_EQ(t.match({1, 2, 3, 4}), 3u);
  EXPECT_EQ(t.match({1, 9, 3}), 1u);  // stops at the first miss
  EXPECT_EQ(t.match({2, 3}), 2u);     // any stored chain hash is a prefix of some prompt
  t.insert({7, 8});                   // 5 blocks > 4: the least recently used (1) goes
  EXPECT_EQ(t.size(), 4u);
  EXPECT_EQ(t.match({1}), 0u);
  EXPECT_EQ(t.match({7, 8}), 2u);
  t.clear();
  EXPECT_EQ(t.size(), 0u);
}

TEST(EngineGroup, MergedMetricsAddCountersAndWeighKvUsageByBlocks) {
  MetricsSnapshot a, b;
  a.kv_blocks_total = 100, a.kv_usage = 0.5, a.generation_tokens = 7, a.requests_running = 2;
  b.kv_blocks_total = 300, b.kv_usage = 0.1, b.generation_tokens = 5, b.requests_running = 1;
  a.finished["stop"] = 3, b.finished["stop"] = 4, b.finished["length"] = 1;
  a.ttft = Histogram({0.1, 1.0}), b.ttft = Histogram({0.1, 1.0});
  a.ttft.observe(0.05), b.ttft.observe(0.5), b.ttft.observe(5.0);
  const MetricsSnapshot m = merge_metrics({a, b});
  EXPECT_EQ(m.kv_blocks_total, 400);
  EXPECT_DOUBLE_EQ(m.kv_usage, (50.0 + 30.0) / 400.0);
  EXPECT_EQ(m.generation_tokens, 12u);
  EXPECT_EQ(m.requests_running, 3);
  EXPECT_EQ(m.finished.at("stop"), 7u);
  EXPECT_EQ(m.finished.at("length"), 1u);
  EXPECT_EQ(m.ttft.count, 3u);
  EXPECT_EQ(m.ttft.counts, (std::vector<uint64_t>{1, 1, 1}));
}

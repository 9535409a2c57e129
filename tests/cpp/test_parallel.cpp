// parallel_for: every index exactly once, nested calls, exceptions, and concurrent callers.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/parallel.h"

using nibble::parallel_for;

TEST(ParallelFor, EveryIndexOnce) {
  for (size_t n : {0, 1, 2, 7, 1000, 100000}) {
    std::vector<std::atomic<int>> hits(n);
    parallel_for(n, [&](size_t i) { hits[i]++; });
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << n << " " << i;
  }
}

TEST(ParallelFor, NestedCallsRunAndComplete) {
  std::atomic<int> total{0};
  parallel_for(8, [&](size_t) { parallel_for(100, [&](size_t) { total++; }); });
  EXPECT_EQ(total.load(), 800);
}

TEST(ParallelFor, ExceptionReachesTheCaller) {
  EXPECT_THROW(parallel_for(100,
                            [](size_t i) {
                              if (i == 37) throw std::runtime_error("x");
                            }),
               std::runtime_error);
  std::atomic<int> total{0};
  parallel_for(50, [&](size_t) { total++; });  // the pool still works afterwards
  EXPECT_EQ(total.load(), 50);
}

TEST(ParallelFor, ConcurrentCallersQueue) {
  std::atomic<int> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&] {
      for (int r = 0; r < 50; ++r) parallel_for(64, [&](size_t) { total++; });
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 4 * 50 * 64);
}

// parallel_for: runs fn(i) for i in [0, n) on all cores, each index once, in no particular order.
// One process-wide thread pool serves all calls (one at a time; concurrent callers queue). A
// parallel_for inside another runs serially on its caller's thread.
#pragma once

#include <cstddef>
#include <functional>

namespace nibble {

// Number of worker threads used: NIBBLE_THREADS, else the hardware concurrency.
size_t worker_count();
void parallel_for(size_t n, const std::function<void(size_t)>& fn);

}  // namespace nibble

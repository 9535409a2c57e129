// parallel_for with an atomic work counter, so uneven items (a large tensor among small ones)
// still spread over all threads.
#include "core/parallel.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace nibble {

size_t worker_count() {
  if (const char* env = std::getenv("NIBBLE_THREADS")) {
    const long n = std::strtol(env, nullptr, 10);
    if (n > 0) return static_cast<size_t>(n);
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

namespace {
thread_local bool inside_parallel_for = false;  // nested calls run serially: no oversubscription
}  // namespace

void parallel_for(size_t n, const std::function<void(size_t)>& fn) {
  const size_t n_threads = inside_parallel_for ? 1 : std::min(worker_count(), n);
  if (n_threads <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&] {
    inside_parallel_for = true;
    for (size_t i = next++; i < n; i = next++) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> threads;
  for (size_t t = 1; t < n_threads; ++t) threads.emplace_back(worker);
  worker();
  inside_parallel_for = false;
  for (std::thread& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace nibble

// parallel_for on one process-wide pool of worker threads (started on first use), with an atomic
// work counter so uneven items still spread over all threads. The caller works too.
#include "core/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "core/env.h"

namespace nibble {
namespace {

thread_local bool inside_parallel_for = false;  // nested calls run serially: no oversubscription

class ThreadPool {
 public:
  explicit ThreadPool(size_t n_workers) {
    for (size_t i = 0; i < n_workers; ++i) threads_.emplace_back([this] { work(); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  // Runs fn over [0, n) on the workers and the calling thread; one job at a time.
  void run(size_t n, const std::function<void(size_t)>& fn) {
    std::lock_guard<std::mutex> job_lock(job_mutex_);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      fn_ = &fn;
      n_ = n;
      next_ = 0;
      error_ = nullptr;
      active_ = threads_.size();
      ++generation_;
    }
    wake_.notify_all();
    drain();
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return active_ == 0; });
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void drain() {
    inside_parallel_for = true;
    for (size_t i = next_++; i < n_; i = next_++) {
      try {
        (*fn_)(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!error_) error_ = std::current_exception();
      }
    }
    inside_parallel_for = false;
  }

  void work() {
    uint64_t seen = 0;
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
      }
      drain();
      std::lock_guard<std::mutex> lock(mutex_);
      if (--active_ == 0) done_.notify_one();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex job_mutex_, mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(size_t)>* fn_ = nullptr;
  size_t n_ = 0;
  std::atomic<size_t> next_{0};
  std::exception_ptr error_;
  size_t active_ = 0;
  uint64_t generation_ = 0;
  bool stopping_ = false;
};

}  // namespace

size_t worker_count() {
  static const size_t count = [] {
    if (const char* env = env_value("NIBBLE_THREADS")) {
      const long n = std::strtol(env, nullptr, 10);
      if (n > 0) return static_cast<size_t>(n);
    }
    return static_cast<size_t>(std::max(1u, std::thread::hardware_concurrency()));
  }();
  return count;
}

void parallel_for(size_t n, const std::function<void(size_t)>& fn) {
  if (inside_parallel_for || worker_count() <= 1 || n <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  static ThreadPool pool(worker_count() - 1);
  pool.run(n, fn);
}

}  // namespace nibble

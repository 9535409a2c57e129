// A progress bar on stderr for long work: redraws in place on a terminal, prints every 10%
// otherwise (logs stay short). Counts bytes (GB, GB/s) or items (done/total, items/s). Runs its own
// thread while alive.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <unistd.h>

namespace nibble::tools {

class ProgressBar {
 public:
  // unit: "GB" counts bytes; any other name counts items of that name (e.g. "requests", "req").
  ProgressBar(std::string label, uint64_t total, const std::atomic<uint64_t>& done, std::string unit = "GB",
              std::string rate_unit = "")
      : label_(std::move(label)),
        unit_(std::move(unit)),
        rate_unit_(std::move(rate_unit)),
        total_(total),
        done_(done),
        tty_(isatty(STDERR_FILENO)),
        start_(std::chrono::steady_clock::now()),
        thread_([this] { run(); }) {}
  ~ProgressBar() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    draw(true);
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(500), [this] { return stop_; })) draw(false);
  }
  void draw(bool final) {
    const uint64_t done = done_.load();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const int percent = total_ ? static_cast<int>(100.0 * done / total_) : 100;
    if (!tty_ && !final && percent / 10 == last_decile_) return;
    last_decile_ = percent / 10;
    const int width = 30, filled = width * percent / 100;
    char amount[96];
    const double rate_base = seconds > 0 ? done / seconds : 0.0;
    if (unit_ == "GB")
      std::snprintf(amount, sizeof amount, "%.2f/%.2f GB %.2f GB/s", done / 1e9, total_ / 1e9, rate_base / 1e9);
    else
      std::snprintf(amount, sizeof amount, "%llu/%llu %s %.2f %s/s", static_cast<unsigned long long>(done),
                    static_cast<unsigned long long>(total_), unit_.c_str(), rate_base,
                    (rate_unit_.empty() ? unit_ : rate_unit_).c_str());
    std::fprintf(stderr, "%s%s [%.*s%*s] %3d%% %s %.0fs%s", tty_ ? "\r" : "", label_.c_str(), filled,
                 "##############################", width - filled, "", percent, amount, seconds,
                 tty_ && !final ? "" : "\n");
    std::fflush(stderr);
  }

  std::string label_, unit_, rate_unit_;
  uint64_t total_;
  const std::atomic<uint64_t>& done_;
  bool tty_;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace nibble::tools

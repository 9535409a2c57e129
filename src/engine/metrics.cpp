// Histogram buckets are vLLM's (vllm/v1/metrics/loggers.py) so dashboards built for it read ours.
#include "engine/metrics.h"

#include <algorithm>

namespace nibble::engine {

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds(std::move(upper_bounds)), counts(bounds.size() + 1, 0) {}

void Histogram::observe(double value) {
  const size_t bucket = std::lower_bound(bounds.begin(), bounds.end(), value) - bounds.begin();
  ++counts[bucket];
  sum += value;
  ++count;
}

Metrics::Metrics() {
  data_.ttft = Histogram({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
                          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0});
  data_.tpot = Histogram(
      {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0});
  data_.itl = data_.tpot;
  data_.e2e = Histogram({0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                         30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0});
  data_.step_engine = Histogram({25e-6, 50e-6, 100e-6, 150e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.1});
  data_.device_idle = Histogram({1e-6, 5e-6, 10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 5e-3, 0.025});
}

void Metrics::clear_counters() {
  const Metrics fresh;
  std::lock_guard<std::mutex> lock(mutex_);
  MetricsSnapshot kept = fresh.data_;
  kept.requests_running = data_.requests_running, kept.requests_waiting = data_.requests_waiting;
  kept.kv_usage = data_.kv_usage, kept.kv_blocks_total = data_.kv_blocks_total;
  data_ = std::move(kept);
}

MetricsSnapshot Metrics::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return data_;
}

}  // namespace nibble::engine

// The engine's counters, gauges and latency histograms, updated on the engine thread and read
// (as a snapshot) by the server's /metrics. Names and buckets follow vLLM's Prometheus metrics.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace nibble::engine {

struct Histogram {
  std::vector<double> bounds;    // upper bounds, ascending (+Inf implied)
  std::vector<uint64_t> counts;  // per bucket (not cumulative), bounds.size() + 1 entries
  double sum = 0.0;
  uint64_t count = 0;

  explicit Histogram(std::vector<double> upper_bounds = {});
  void observe(double value);
};

struct MetricsSnapshot {
  int64_t requests_running = 0;  // sequences in the scheduler's running set (published after each step)
  int64_t requests_waiting = 0;
  double kv_usage = 0.0;  // fraction of KV blocks in use
  int64_t kv_blocks_total = 0;
  uint64_t prompt_tokens = 0;  // whole prompt lengths (prefix-cache hits included, as vLLM counts),
                               // added when a sequence draws its first token
  uint64_t generation_tokens = 0;
  uint64_t preemptions = 0;
  uint64_t prefix_queries = 0;               // prompt tokens looked up in the prefix cache (block manager's count)
  uint64_t prefix_hits = 0;                  // of those, tokens found cached
  std::map<std::string, uint64_t> finished;  // by finish reason
  Histogram ttft, tpot, itl, e2e;            // seconds
  // Where the engine thread's time goes while it steps: inside the runner's step (the model; on
  // the GPU, the device working), and the engine's own work around it (commands, scheduling, batch
  // building, detokenizing, outputs) — while steps run back to back, the time the device waits.
  uint64_t steps = 0;
  double step_model_seconds = 0.0, step_engine_seconds = 0.0;
  Histogram step_engine;  // seconds of engine work per step
  // On the GPU, per step launched back to back with the one before (the engine had work between
  // them): the step's own device time, and how long the device sat idle before it started
  // (waiting for the host to queue it; overlapped scheduling builds a step while the last one runs).
  uint64_t device_steps = 0;
  double device_step_seconds = 0.0, device_idle_seconds = 0.0;
  Histogram device_idle;
  // Structured output: grammar masks filled on the engine thread (rows, and their summed seconds).
  uint64_t grammar_mask_rows = 0;
  double grammar_mask_seconds = 0.0;
};

class Metrics {
 public:
  Metrics();
  MetricsSnapshot snapshot() const;
  // Counters and histograms back to zero; the gauges kept.
  void clear_counters();
  template <typename F>
  void update(F&& f) {
    std::lock_guard<std::mutex> lock(mutex_);
    f(data_);
  }

 private:
  mutable std::mutex mutex_;
  MetricsSnapshot data_;
};

}  // namespace nibble::engine

// Data parallelism: N engines (one per GPU, or sharing one) behind one front, each with its own
// model copy, KV cache and scheduler. A request goes to the engine whose prefix cache most likely
// holds its prompt (SGLang's cache-aware rule), else to the least loaded; control calls (weight
// updates, cache flushes, aborts) reach every engine; metrics are per engine and summed.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"

namespace nibble::engine {

// The routing rule's constants, SGLang router's cache_aware defaults (sgl-router's
// --cache-threshold 0.5, --balance-abs-threshold 32, --balance-rel-threshold 1.0001): a prompt goes
// to the engine holding the longest cached prefix when that covers more than CACHE_THRESHOLD of its
// full blocks, unless the engines' loads are imbalanced (the busiest has more than
// BALANCE_ABS_THRESHOLD requests more than the idlest, and more than BALANCE_REL_THRESHOLD times
// as many): then, and on a miss, to the least loaded.
inline constexpr double CACHE_THRESHOLD = 0.5;
inline constexpr int64_t BALANCE_ABS_THRESHOLD = 32;
inline constexpr double BALANCE_REL_THRESHOLD = 1.0001;

// What the router remembers of the prompts each engine was given: the chained hashes of their full
// blocks (the prefix cache's own key), least recently used first out once it holds `capacity`.
class PrefixTable {
 public:
  explicit PrefixTable(size_t capacity) : capacity_(capacity) {}
  // How many leading blocks of `hashes` the table holds.
  size_t match(const std::vector<uint64_t>& hashes);
  void insert(const std::vector<uint64_t>& hashes);
  void clear();
  size_t size() const { return index_.size(); }

 private:
  size_t capacity_;
  std::list<uint64_t> lru_;  // most recent first
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> index_;
};

// Chained hashes of a prompt's full blocks of block_size tokens (hash i covers tokens 0 … (i+1)·bs − 1).
std::vector<uint64_t> prefix_block_hashes(const std::vector<int32_t>& prompt, int64_t block_size);

struct EngineReplicaInfo {
  int index = 0;
  std::string device;  // the runner's description
  bool in_service = true;
  int64_t load = 0;             // requests routed to it and not finished
  int64_t routed = 0;           // requests routed to it so far
  int64_t cached_prefixes = 0;  // blocks in its routing table
};

class EngineGroup {
 public:
  // engines: at least one, all of the same model (the first one's config and tokenizer answer for all).
  explicit EngineGroup(std::vector<std::unique_ptr<Engine>> engines, std::vector<std::string> devices);
  ~EngineGroup();

  size_t size() const { return replicas_.size(); }
  const EngineConfig& config() const { return replicas_[0]->engine->config(); }
  const io::ModelConfig& model_config() const { return replicas_[0]->engine->model_config(); }
  const text::Tokenizer& tokenizer() const { return replicas_[0]->engine->tokenizer(); }

  // Routes and submits; an error means no engine accepted it (every one out of service, or the
  // request itself is wrong).
  Status submit(GenerationRequest request);
  void abort(const std::string& request_id);
  bool any_in_service() const;
  void abort_all();
  // On every engine, answered once all have: success when every one succeeded (messages joined).
  void update_weights(WeightUpdate update, std::function<void(WeightUpdateResult)> done);
  void flush_cache(std::function<void(Status)> done);
  // Engine::warm_up on every engine at once (before serving); the errors joined, each naming its engine.
  Status warm_up(const std::vector<int64_t>& prompt_lengths);
  ModelInfo model_info() const { return replicas_[0]->engine->model_info(); }
  MetricsSnapshot metrics() const;                      // summed over the engines
  std::vector<MetricsSnapshot> engine_metrics() const;  // each engine's
  std::vector<EngineReplicaInfo> replicas() const;
  void shutdown();

 private:
  struct Replica {
    int index = 0;
    std::unique_ptr<Engine> engine;
    std::string device;
    std::atomic<int64_t> load{0};
    std::atomic<int64_t> routed{0};
    PrefixTable table{0};
  };
  // The engine for a prompt (under mutex_), or -1 when none is in service.
  int route(const std::vector<uint64_t>& hashes);

  std::vector<std::unique_ptr<Replica>> replicas_;
  mutable std::mutex mutex_;                     // guards the tables and owners_
  std::unordered_map<std::string, int> owners_;  // request id → engine, while it runs
};

// Sums engine snapshots: counters and histograms add, KV usage is over all blocks.
MetricsSnapshot merge_metrics(const std::vector<MetricsSnapshot>& parts);

}  // namespace nibble::engine

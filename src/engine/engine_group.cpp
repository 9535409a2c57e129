// EngineGroup (engine_group.h): routing by cached prefix and load, fan-out of control calls, and
// the merged metrics.
#include "engine/engine_group.h"

#include <algorithm>
#include <thread>

#include "core/log.h"

namespace nibble::engine {

size_t PrefixTable::match(const std::vector<uint64_t>& hashes) {
  size_t n = 0;
  for (; n < hashes.size(); ++n) {
    auto it = index_.find(hashes[n]);
    if (it == index_.end()) break;
    lru_.splice(lru_.begin(), lru_, it->second);  // a hit is a use
  }
  return n;
}

void PrefixTable::insert(const std::vector<uint64_t>& hashes) {
  for (uint64_t h : hashes) {
    auto it = index_.find(h);
    if (it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      continue;
    }
    lru_.push_front(h);
    index_[h] = lru_.begin();
  }
  while (index_.size() > capacity_) {
    index_.erase(lru_.back());
    lru_.pop_back();
  }
}

void PrefixTable::clear() { lru_.clear(), index_.clear(); }

std::vector<uint64_t> prefix_block_hashes(const std::vector<int32_t>& prompt, int64_t block_size) {
  std::vector<uint64_t> hashes;
  const size_t bs = static_cast<size_t>(std::max<int64_t>(block_size, 1));
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the token ids, chained block to block
  for (size_t i = 0; i + bs <= prompt.size(); i += bs) {
    for (size_t j = i; j < i + bs; ++j) {
      h ^= static_cast<uint32_t>(prompt[j]);
      h *= 0x100000001b3ull;
    }
    hashes.push_back(h);
  }
  return hashes;
}

EngineGroup::EngineGroup(std::vector<std::unique_ptr<Engine>> engines, std::vector<std::string> devices) {
  for (size_t i = 0; i < engines.size(); ++i) {
    auto r = std::make_unique<Replica>();
    r->index = static_cast<int>(i);
    // The table remembers about as many blocks as the engine's KV cache holds.
    const size_t blocks = static_cast<size_t>(std::max<int64_t>(engines[i]->kv_blocks(), 1));
    r->table = PrefixTable(blocks);
    r->engine = std::move(engines[i]);
    r->device = i < devices.size() ? devices[i] : "";
    replicas_.push_back(std::move(r));
  }
}

EngineGroup::~EngineGroup() { shutdown(); }

int EngineGroup::route(const std::vector<uint64_t>& hashes) {
  int least = -1, best = -1;
  int64_t min_load = 0, max_load = 0;
  size_t best_match = 0;
  for (auto& r : replicas_) {
    if (!r->engine->in_service()) continue;
    const int64_t load = r->load.load();
    if (least < 0 || load < min_load ||
        (load == min_load && r->table.size() < replicas_[static_cast<size_t>(least)]->table.size()))
      least = r->index, min_load = load;
    max_load = std::max(max_load, load);
    const size_t m = hashes.empty() ? 0 : r->table.match(hashes);
    if (m > best_match) best = r->index, best_match = m;
  }
  if (least < 0) return -1;
  const bool imbalanced = max_load - min_load > BALANCE_ABS_THRESHOLD &&
                          static_cast<double>(max_load) > BALANCE_REL_THRESHOLD * static_cast<double>(min_load);
  const bool hit = best >= 0 && static_cast<double>(best_match) > CACHE_THRESHOLD * static_cast<double>(hashes.size());
  return !imbalanced && hit ? best : least;
}

Status EngineGroup::submit(GenerationRequest request) {
  if (replicas_.size() == 1) return replicas_[0]->engine->submit(std::move(request));
  const std::vector<uint64_t> hashes = prefix_block_hashes(request.prompt, replicas_[0]->engine->block_size());
  int chosen = -1;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    chosen = route(hashes);
    if (chosen < 0) return Status::error("every engine is out of service (" + replicas_[0]->engine->failure() + ")");
    replicas_[static_cast<size_t>(chosen)]->table.insert(hashes);
    owners_[request.id] = chosen;
  }
  Replica& r = *replicas_[static_cast<size_t>(chosen)];
  r.load.fetch_add(1);
  r.routed.fetch_add(1);
  // The final output releases the request's place in the count and in owners_.
  OutputCallback inner = std::move(request.on_output);
  const std::string id = request.id;
  request.on_output = [this, &r, id, inner = std::move(inner)](RequestOutput out) {
    const bool finished = out.finished;
    inner(std::move(out));
    if (!finished) return;
    r.load.fetch_sub(1);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = owners_.find(id);
    if (it != owners_.end() && it->second == r.index) owners_.erase(it);
  };
  const Status status = r.engine->submit(std::move(request));
  if (!status) {
    r.load.fetch_sub(1);
    std::lock_guard<std::mutex> lock(mutex_);
    owners_.erase(id);
  }
  return status;
}

void EngineGroup::abort(const std::string& request_id) {
  int owner = -1;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = owners_.find(request_id);
    if (it != owners_.end()) owner = it->second;
  }
  if (owner >= 0) return replicas_[static_cast<size_t>(owner)]->engine->abort(request_id);
  for (auto& r : replicas_) r->engine->abort(request_id);  // not routed here (one engine): each ignores unknown ids
}

bool EngineGroup::any_in_service() const {
  for (const auto& r : replicas_)
    if (r->engine->in_service()) return true;
  return false;
}

void EngineGroup::abort_all() {
  for (auto& r : replicas_) r->engine->abort_all();
}

namespace {

// Calls `done` once `count` parts have arrived; the parts come on each engine's thread, and merge
// into the caller's result under `mutex`.
class Countdown {
 public:
  Countdown(size_t count, std::function<void()> done) : left_(count), done_(std::move(done)) {}
  void arrive() {
    if (left_.fetch_sub(1) == 1) done_();
  }
  std::mutex mutex;

 private:
  std::atomic<size_t> left_;
  std::function<void()> done_;
};

}  // namespace

void EngineGroup::update_weights(WeightUpdate update, std::function<void(WeightUpdateResult)> done) {
  if (replicas_.size() == 1) return replicas_[0]->engine->update_weights(std::move(update), std::move(done));
  auto result = std::make_shared<WeightUpdateResult>(WeightUpdateResult{true, "", 0});
  auto join = std::make_shared<Countdown>(replicas_.size(), [result, done = std::move(done)] { done(*result); });
  for (auto& r : replicas_) {
    const int index = r->index;
    r->engine->update_weights(update, [join, result, index](WeightUpdateResult part) {
      {
        std::lock_guard<std::mutex> lock(join->mutex);
        result->success = result->success && part.success;
        result->num_paused_requests += part.num_paused_requests;
        if (!part.success || result->message.empty())
          result->message += (result->message.empty() ? "" : "; ") + std::string("engine ") + std::to_string(index) +
                             ": " + part.message;
      }
      join->arrive();
    });
  }
  // The prefix caches were flushed (or kept) engine by engine; the routing tables follow suit.
  if (update.flush_cache) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& r : replicas_) r->table.clear();
  }
}

void EngineGroup::flush_cache(std::function<void(Status)> done) {
  if (replicas_.size() == 1) return replicas_[0]->engine->flush_cache(std::move(done));
  auto errors = std::make_shared<std::string>();
  auto join = std::make_shared<Countdown>(replicas_.size(), [errors, done = std::move(done)] {
    done(errors->empty() ? Status::ok() : Status::error(*errors));
  });
  for (auto& r : replicas_) {
    const int index = r->index;
    r->engine->flush_cache([this, join, errors, index](Status part) {
      if (!part) {
        std::lock_guard<std::mutex> lock(join->mutex);
        *errors +=
            (errors->empty() ? "" : "; ") + std::string("engine ") + std::to_string(index) + ": " + part.message();
      } else {
        std::lock_guard<std::mutex> lock(mutex_);
        replicas_[static_cast<size_t>(index)]->table.clear();
      }
      join->arrive();
    });
  }
}

Status EngineGroup::warm_up(const std::vector<int64_t>& prompt_lengths) {
  std::vector<Status> results(replicas_.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < replicas_.size(); ++i)
    threads.emplace_back([&, i] { results[i] = replicas_[i]->engine->warm_up(prompt_lengths); });
  for (std::thread& t : threads) t.join();
  std::string errors;
  for (size_t i = 0; i < results.size(); ++i)
    if (!results[i])
      errors += (errors.empty() ? "" : "; ") + (replicas_.size() > 1 ? "engine " + std::to_string(i) + ": " : "") +
                results[i].message();
  return errors.empty() ? Status::ok() : Status::error(errors);
}

std::vector<MetricsSnapshot> EngineGroup::engine_metrics() const {
  std::vector<MetricsSnapshot> parts;
  for (const auto& r : replicas_) parts.push_back(r->engine->metrics());
  return parts;
}

MetricsSnapshot EngineGroup::metrics() const {
  return replicas_.size() == 1 ? replicas_[0]->engine->metrics() : merge_metrics(engine_metrics());
}

std::vector<EngineReplicaInfo> EngineGroup::replicas() const {
  std::vector<EngineReplicaInfo> out;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& r : replicas_)
    out.push_back({r->index, r->device, r->engine->in_service(), r->load.load(), r->routed.load(),
                   static_cast<int64_t>(r->table.size())});
  return out;
}

void EngineGroup::shutdown() {
  for (auto& r : replicas_) r->engine->shutdown();
}

namespace {

void add_histogram(Histogram& into, const Histogram& h) {
  if (into.counts.size() != h.counts.size()) return;  // same buckets by construction (Metrics())
  for (size_t i = 0; i < h.counts.size(); ++i) into.counts[i] += h.counts[i];
  into.sum += h.sum, into.count += h.count;
}

}  // namespace

MetricsSnapshot merge_metrics(const std::vector<MetricsSnapshot>& parts) {
  if (parts.empty()) return MetricsSnapshot();
  MetricsSnapshot m = parts[0];
  double used_blocks = parts[0].kv_usage * static_cast<double>(parts[0].kv_blocks_total);
  for (size_t i = 1; i < parts.size(); ++i) {
    const MetricsSnapshot& p = parts[i];
    m.requests_running += p.requests_running, m.requests_waiting += p.requests_waiting;
    used_blocks += p.kv_usage * static_cast<double>(p.kv_blocks_total);
    m.kv_blocks_total += p.kv_blocks_total;
    m.prompt_tokens += p.prompt_tokens, m.generation_tokens += p.generation_tokens, m.preemptions += p.preemptions;
    m.prefix_queries += p.prefix_queries, m.prefix_hits += p.prefix_hits;
    for (const auto& [reason, n] : p.finished) m.finished[reason] += n;
    add_histogram(m.ttft, p.ttft), add_histogram(m.tpot, p.tpot), add_histogram(m.itl, p.itl);
    add_histogram(m.e2e, p.e2e), add_histogram(m.step_engine, p.step_engine),
        add_histogram(m.device_idle, p.device_idle);
    m.steps += p.steps, m.step_model_seconds += p.step_model_seconds, m.step_engine_seconds += p.step_engine_seconds;
    m.device_steps += p.device_steps, m.device_step_seconds += p.device_step_seconds;
    m.device_idle_seconds += p.device_idle_seconds;
    m.grammar_mask_rows += p.grammar_mask_rows, m.grammar_mask_seconds += p.grammar_mask_seconds;
  }
  m.kv_usage = m.kv_blocks_total > 0 ? used_blocks / static_cast<double>(m.kv_blocks_total) : 0.0;
  return m;
}

}  // namespace nibble::engine

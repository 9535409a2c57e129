// BlockManager: free list as an LRU linked through the blocks, prefix cache as a hash map from chain
// hash to block, verified against the block's stored tokens on every hit. Nothing allocates per step
// but the hash map's nodes (bench_engine: std::list nodes and per-block token vectors were ~15% of
// the engine's time in the workload 1 shape).
#include "engine/block_manager.h"

#include <algorithm>

#include "core/check.h"

namespace nibble::engine {

BlockManager::BlockManager(int64_t n_blocks, int64_t block_size, bool prefix_caching)
    : block_size_(block_size),
      prefix_caching_(prefix_caching),
      blocks_(static_cast<size_t>(n_blocks)),
      tokens_(prefix_caching ? static_cast<size_t>(n_blocks * block_size) : 0) {
  for (int32_t id = 0; id < n_blocks; ++id) link(id, false);
  if (prefix_caching) by_hash_.reserve(static_cast<size_t>(n_blocks));
}

void BlockManager::link(int32_t id, bool front) {
  Block& b = blocks_[id];
  int32_t& end = front ? free_front_ : free_back_;
  (front ? b.prev : b.next) = -1;
  (front ? b.next : b.prev) = end;
  if (end >= 0)
    (front ? blocks_[end].prev : blocks_[end].next) = id;
  else
    (front ? free_back_ : free_front_) = id;  // the list was empty: id is both ends
  end = id;
  b.in_free_list = true;
  ++n_free_;
}

void BlockManager::unlink(int32_t id) {
  Block& b = blocks_[id];
  (b.prev >= 0 ? blocks_[b.prev].next : free_front_) = b.next;
  (b.next >= 0 ? blocks_[b.next].prev : free_back_) = b.prev;
  b.prev = b.next = -1;
  b.in_free_list = false;
  --n_free_;
}

uint64_t BlockManager::chain_hash(uint64_t parent, std::span<const int32_t> tokens) const {
  // splitmix64-style mixing of each token into the parent's hash: cheap and well spread; the
  // stored tokens make a collision harmless for this block (see match_prefix).
  uint64_t h = parent ^ 0x9e3779b97f4a7c15ull;
  for (int32_t t : tokens) {
    h ^= static_cast<uint64_t>(static_cast<uint32_t>(t)) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    h ^= h >> 31;
  }
  return h;
}

void BlockManager::forget(int32_t id) {
  Block& b = blocks_[id];
  if (!b.cached) return;
  auto it = by_hash_.find(b.hash);
  if (it != by_hash_.end() && it->second == id) by_hash_.erase(it);
  b.cached = false;
}

void BlockManager::take(int32_t id) {
  if (blocks_[id].in_free_list) unlink(id);
  ++blocks_[id].ref_count;
}

int64_t BlockManager::match_prefix(std::span<const int32_t> tokens, std::vector<int32_t>& table,
                                   std::vector<uint64_t>& hashes) {
  NIB_CHECK(table.empty() && hashes.empty());
  if (!prefix_caching_ || tokens.empty()) return 0;
  const int64_t max_blocks = (static_cast<int64_t>(tokens.size()) - 1) / block_size_;
  queried_tokens_ += static_cast<int64_t>(tokens.size());
  uint64_t parent = 0;
  for (int64_t j = 0; j < max_blocks; ++j) {
    const auto block_tokens = tokens.subspan(j * block_size_, block_size_);
    const uint64_t h = chain_hash(parent, block_tokens);
    auto it = by_hash_.find(h);
    if (it == by_hash_.end()) break;
    const std::span<const int32_t> cached = tokens_of(it->second);
    if (!std::equal(cached.begin(), cached.end(), block_tokens.begin(), block_tokens.end())) break;
    take(it->second);
    table.push_back(it->second);
    hashes.push_back(h);
    parent = h;
  }
  const int64_t hit = static_cast<int64_t>(table.size()) * block_size_;
  hit_tokens_ += hit;
  return hit;
}

bool BlockManager::allocate(int64_t n, std::vector<int32_t>& table) {
  if (n > n_free()) return false;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = free_front_;
    forget(id);  // evicted: its cached contents are about to be overwritten
    take(id);
    table.push_back(id);
  }
  return true;
}

void BlockManager::release(std::vector<int32_t>& table, std::vector<uint64_t>& hashes) {
  for (auto it = table.rbegin(); it != table.rend(); ++it) {
    Block& b = blocks_[*it];
    NIB_CHECK(b.ref_count > 0);
    if (--b.ref_count > 0) continue;
    // Cached blocks go to the back (kept longest); plain ones to the front (reused first).
    link(*it, /*front=*/!b.cached);
  }
  table.clear();
  hashes.clear();
}

void BlockManager::register_full_blocks(std::span<const int32_t> tokens, int64_t n_computed,
                                        const std::vector<int32_t>& table, std::vector<uint64_t>& hashes) {
  if (!prefix_caching_) return;
  const int64_t full = std::min<int64_t>(n_computed / block_size_, static_cast<int64_t>(table.size()));
  for (int64_t j = static_cast<int64_t>(hashes.size()); j < full; ++j) {
    const auto block_tokens = tokens.subspan(j * block_size_, block_size_);
    const uint64_t h = chain_hash(j == 0 ? 0 : hashes[j - 1], block_tokens);
    hashes.push_back(h);
    Block& b = blocks_[table[j]];
    if (b.cached || by_hash_.count(h)) continue;  // already cached (shared) or a duplicate of another block
    b.cached = true;
    b.hash = h;
    std::copy(block_tokens.begin(), block_tokens.end(), tokens_of(table[j]).begin());
    by_hash_[h] = table[j];
  }
}

void BlockManager::reset_prefix_cache() {
  for (int32_t id = 0; id < n_blocks(); ++id) forget(id);
}

}  // namespace nibble::engine

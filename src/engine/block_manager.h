// The paged KV cache's bookkeeping: which physical blocks are free, who holds each one
// (reference counts, so sequences share cached prefix blocks), and the prefix cache — full blocks
// keyed by a hash of their tokens and everything before them, kept after their sequence ends and
// evicted least-recently-freed first.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace nibble::engine {

class BlockManager {
 public:
  BlockManager(int64_t n_blocks, int64_t block_size, bool prefix_caching);

  int64_t block_size() const { return block_size_; }
  int64_t n_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  int64_t n_free() const { return n_free_; }  // cached-but-unused blocks count as free
  int64_t n_used() const { return n_blocks() - n_free(); }
  static int64_t blocks_for(int64_t tokens, int64_t block_size) { return (tokens + block_size - 1) / block_size; }

  // For a sequence that holds no blocks: takes the cached full blocks that start `tokens`, at most
  // up to tokens.size() - 1 (the last token must be computed to get logits). Appends them to
  // `table`, their chain hashes to `hashes`; returns the number of tokens they hold.
  int64_t match_prefix(std::span<const int32_t> tokens, std::vector<int32_t>& table, std::vector<uint64_t>& hashes);

  // Appends n fresh blocks to `table`; false (and nothing taken) when fewer than n are free.
  bool allocate(int64_t n, std::vector<int32_t>& table);

  // Releases a sequence's blocks (last block first, so a prefix outlives its tail) and clears `table`.
  void release(std::vector<int32_t>& table, std::vector<uint64_t>& hashes);

  // Makes the sequence's full blocks among its first `n_computed` tokens findable by later
  // sequences; `hashes` holds the chain hashes of the blocks already registered.
  void register_full_blocks(std::span<const int32_t> tokens, int64_t n_computed, const std::vector<int32_t>& table,
                            std::vector<uint64_t>& hashes);

  // Forgets every cached block (after a weight swap the cached K/V are stale).
  void reset_prefix_cache();

  int64_t prefix_queries() const { return queried_tokens_; }  // tokens looked up
  int64_t prefix_hits() const { return hit_tokens_; }         // tokens found
  void reset_counters() { queried_tokens_ = hit_tokens_ = 0; }

 private:
  struct Block {
    int32_t ref_count = 0;
    bool cached = false;  // registered in by_hash_, its tokens in tokens_
    bool in_free_list = false;
    uint64_t hash = 0;
    int32_t prev = -1, next = -1;  // free-list neighbours
  };
  uint64_t chain_hash(uint64_t parent, std::span<const int32_t> tokens) const;
  void take(int32_t id);  // out of the free list, one more reference
  void forget(int32_t id);
  // A cached block's tokens, so that a hash collision is never a false hit.
  std::span<int32_t> tokens_of(int32_t id) {
    return {tokens_.data() + static_cast<size_t>(id) * static_cast<size_t>(block_size_),
            static_cast<size_t>(block_size_)};
  }
  // The free list, an LRU threaded through blocks_ (no allocation per step): front evicted first.
  void link(int32_t id, bool front);
  void unlink(int32_t id);

  int64_t block_size_;
  bool prefix_caching_;
  std::vector<Block> blocks_;
  std::vector<int32_t> tokens_;  // [blocks, block_size]
  int32_t free_front_ = -1, free_back_ = -1;
  int64_t n_free_ = 0;
  std::unordered_map<uint64_t, int32_t> by_hash_;
  int64_t queried_tokens_ = 0, hit_tokens_ = 0;
};

}  // namespace nibble::engine

// KV cache storage for the CPU backend: per layer, K and V as [n_blocks, block_size, n_kv_heads,
// head_dim] fp32 (the reference keeps full precision). Which blocks a sequence owns is decided by
// the engine's block manager; this only holds the numbers.
#pragma once

#include <cstdint>
#include <vector>

#include "io/model_config.h"
#include "ref/attention.h"

namespace nibble::models {

class KvCache {
 public:
  KvCache(const io::ModelConfig& config, int64_t n_blocks, int64_t block_size)
      : n_blocks_(n_blocks), block_size_(block_size), n_kv_heads_(config.num_key_value_heads),
        head_dim_(config.head_dim),
        k_(static_cast<size_t>(config.num_hidden_layers)),
        v_(static_cast<size_t>(config.num_hidden_layers)) {
    const size_t per_layer = static_cast<size_t>(n_blocks * block_size * n_kv_heads_ * head_dim_);
    for (auto& k : k_) k.assign(per_layer, 0.0f);
    for (auto& v : v_) v.assign(per_layer, 0.0f);
  }

  int64_t n_blocks() const { return n_blocks_; }
  int64_t block_size() const { return block_size_; }
  ref::PagedKvLayer layer(int64_t l) {
    return {k_[l].data(), v_[l].data(), n_blocks_, block_size_, n_kv_heads_, head_dim_};
  }

 private:
  int64_t n_blocks_, block_size_, n_kv_heads_, head_dim_;
  std::vector<std::vector<float>> k_, v_;
};

}  // namespace nibble::models

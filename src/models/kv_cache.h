// KV cache storage for the CPU backend: per layer, K and V as [n_blocks, block_size, n_kv_heads,
// head_dim] fp32, holding BF16- or FP8-rounded values for a BF16 or FP8 cache (KvDtype::BF16, FP8:
// what the GPU stores) or full fp32 for the reference. Which blocks a sequence owns is decided by the
// engine's block manager; this only holds the numbers. Memory is left uninitialised, so pages are
// committed only once written.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "io/model_config.h"
#include "ref/attention.h"

namespace nibble::models {

enum class KvDtype { FP32, BF16, FP8 };

class KvCache {
 public:
  // n_kv_heads: a rank's KV heads under tensor parallelism (0: the model's).
  KvCache(const io::ModelConfig& config, int64_t n_blocks, int64_t block_size, KvDtype dtype = KvDtype::FP32,
          int64_t n_kv_heads = 0)
      : n_blocks_(n_blocks),
        block_size_(block_size),
        n_kv_heads_(n_kv_heads > 0 ? n_kv_heads : config.num_key_value_heads),
        head_dim_(config.head_dim),
        dtype_(dtype) {
    const size_t per_layer = static_cast<size_t>(n_blocks * block_size * n_kv_heads_ * head_dim_);
    for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
      k_.push_back(std::make_unique_for_overwrite<float[]>(per_layer));
      v_.push_back(std::make_unique_for_overwrite<float[]>(per_layer));
    }
  }

  int64_t n_blocks() const { return n_blocks_; }
  int64_t block_size() const { return block_size_; }
  KvDtype dtype() const { return dtype_; }
  // Bytes of one token's K and V over all layers, as this backend stores them.
  static int64_t bytes_per_token(const io::ModelConfig& config) {
    return config.num_hidden_layers * 2 * config.num_key_value_heads * config.head_dim * int64_t{sizeof(float)};
  }
  ref::PagedKvLayer layer(int64_t l) {
    const ref::KvRounding rounding = dtype_ == KvDtype::BF16  ? ref::KvRounding::BF16
                                     : dtype_ == KvDtype::FP8 ? ref::KvRounding::FP8
                                                              : ref::KvRounding::NONE;
    return {k_[l].get(), v_[l].get(), n_blocks_, block_size_, n_kv_heads_, head_dim_, rounding};
  }

 private:
  int64_t n_blocks_, block_size_, n_kv_heads_, head_dim_;
  KvDtype dtype_;
  std::vector<std::unique_ptr<float[]>> k_, v_;
};

}  // namespace nibble::models

// Synthetic checkpoints in the exact ModelOpt NVFP4 layout (both config forms, sharded safetensors
// with index, generation_config.json, the family's tokenizer files), with random weights.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/model_config.h"
#include "tools/synth_routers.h"

namespace nibble::tools {

struct SynthOptions {
  std::string
      preset;  // tiny-moe | small-moe (GPU-sized) | qwen3-30b-a3b | tiny-ernie | small-ernie | ernie-4.5-21b-a3b
  std::string out_dir;
  uint64_t seed = 0;
  int64_t layers = 0;                           // 0: the preset's
  int64_t experts = 0;                          // 0: the preset's; top-k is capped at this
  bool quantize_attention = true;               // false: q/k/v/o stay BF16 (listed in exclude_modules)
  bool kv_cache_fp8 = false;                    // kv_cache_quant_algo FP8: k_proj.k_scale / v_proj.v_scale per layer
  uint64_t shard_bytes = 0;                     // --shard-size; 0: the preset's (5 GB; tiny-moe 4 MB)
  double router_skew = -1;                      // --router-skew: routers placed for Zipf(s) loads; < 0: random rows
  int64_t router_tokens = 1024;                 // calibration tokens of the placement (half fit, half checked)
  std::atomic<uint64_t>* bytes_done = nullptr;  // progress: tensor bytes of each module group once generated
};

struct SynthReport {
  io::ModelConfig config;
  uint64_t total_bytes = 0;  // tensor bytes written
  size_t n_shards = 0;
  double generate_seconds = 0;  // drawing, quantizing and storing into the mapped files
  double flush_seconds = 0;     // ShardedWriter::finish: fdatasync of every shard, the index
  std::vector<LayerRouting> routing;  // --router-skew: each MoE layer's placement
  double routing_seconds = 0;
};

const std::vector<std::string>& synth_presets();
// The preset's ModelConfig with the overrides of `options` applied and validated.
Result<io::ModelConfig> synth_config(const SynthOptions& options);
// Total tensor bytes the checkpoint will hold (for progress bars).
Result<uint64_t> synth_total_bytes(const SynthOptions& options);
Result<SynthReport> synth_checkpoint(const SynthOptions& options);

// Where nibble's data files (data/qwen3-tokenizer) are: $NIBBLE_DATA_DIR, else <exe>/../data,
// else the source tree's data/.
std::string data_dir();

}  // namespace nibble::tools

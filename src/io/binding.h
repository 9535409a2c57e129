// Binds a checkpoint's tensors to its module plan: every expected tensor present with the right
// dtype and shape, nothing unexpected, scales finite and positive; all problems in one error.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/model_config.h"
#include "io/partition.h"
#include "io/quant_config.h"
#include "io/safetensors.h"
#include "io/weight_plan.h"

namespace nibble::io {

// A tensor inside a mapped checkpoint file (valid while the SafetensorsReader lives).
struct TensorRef {
  const uint8_t* data = nullptr;
  DType dtype = DType::U8;  // as stored: may be BF16 where the plan says F32 (widening is exact)
  std::vector<int64_t> shape;
};

// The values of a parameter the plan keeps in fp32 (ERNIE's router bias), as fp32 whether the file
// stores them as F32 or BF16 (bind_checkpoint accepts both; the widening is exact).
std::vector<float> read_f32_values(const TensorRef& t);

// One Linear. BF16: weight is [out, in] BF16. NVFP4: weight is U8 [out, in/2] codes, weight_scale
// F8_E4M3 [out, in/16], and the two fp32 scalars of the checkpoint.
struct LinearWeights {
  ModuleSpec module;
  TensorRef weight;
  TensorRef weight_scale;
  float weight_scale_2 = 1.0f;
  float input_scale = 0.0f;
  // k_proj's k_scale or v_proj's v_scale (ModelOpt's FP8 KV-cache calibration: amax / 448) when the
  // quant config has kv_cache_quant_algo FP8; 1 otherwise.
  float kv_scale = 1.0f;
};

struct BoundCheckpoint {
  ModelConfig config;
  QuantConfig quant;
  std::vector<ModuleSpec> modules;
  std::map<std::string, LinearWeights> linears;  // by module name
  std::map<std::string, TensorRef> tensors;      // embedding and norm weights, by tensor name
  // MoE experts whose gate_proj and up_proj weight_scale_2 differ: kept exact (each half keeps its
  // own global scale), counted here and logged once.
  int64_t experts_with_split_gate_up_scale = 0;
};

// Checks the reader's tensors against plan_modules(config, quant).
Result<BoundCheckpoint> bind_checkpoint(const SafetensorsReader& reader, const ModelConfig& config,
                                        const QuantConfig& quant);

// For a weight swap: the same architecture, dimensions and module formats/shapes; the error lists
// the first differences.
Status check_same_layout(const BoundCheckpoint& current, const BoundCheckpoint& candidate);

// A whole model folder: config.json, quant config, safetensors, bound and validated. On a rank of a
// tensor- or expert-parallel group, `bound` holds only the rank's parts (keep_rank_slices).
struct LoadedCheckpoint {
  std::string path;
  SafetensorsReader reader;
  BoundCheckpoint bound;
  ParallelConfig parallel;
  std::map<std::string, RankModule> rank_modules;  // by module name, on a rank of a group of 2 or more
  std::vector<std::vector<uint8_t>> slice_storage;  // column slices' copies (row slices view the mapping)
  // Under expert parallelism, each MoE layer's static input scales over all its experts (the rank
  // holds only some): the largest gate/up and down input_scale, which every rank quantizes with.
  struct ExpertInputScales {
    float gate_up = 0.0f, down = 0.0f;
  };
  std::map<int64_t, ExpertInputScales> all_experts_input_scales;  // by layer
};
Result<std::unique_ptr<LoadedCheckpoint>> load_checkpoint(const std::string& model_dir,
                                                          const ConfigOverrides& overrides = {},
                                                          const ParallelConfig& parallel = {});

// Narrows a bound checkpoint to one rank's parts (io::partition's plan): a row slice is a view of the
// file's mapping, a column slice a copy of just those columns, another rank's experts are dropped; so
// a rank reads only the bytes it keeps. Module shapes become the rank's.
Status keep_rank_slices(LoadedCheckpoint& checkpoint, const ParallelConfig& parallel);

}  // namespace nibble::io

// How a checkpoint's modules split over the ranks of tensor and expert parallelism: which rows or
// columns of which stored tensor each rank loads (NVFP4 block scales with their weights), and the
// errors for shapes that do not split. The plan only; loaders and forwards read it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/weight_plan.h"

namespace nibble::io {

// tensor_parallel ranks share every layer (Megatron's split: q/k/v, gate/up and the experts' gate/up
// by output rows, o and down by input columns, one all-reduce after each; the embedding and lm_head
// by vocabulary rows); with expert_parallel the experts are dealt out whole instead (rank r holds a
// contiguous E / size of them) while attention stays tensor-parallel.
struct ParallelConfig {
  int64_t size = 1;  // ranks
  int64_t rank = 0;
  bool expert_parallel = false;
};

// How one module lies on a rank.
enum class Split {
  WHOLE,    // every rank loads it all (norms, the router, scalars)
  ROWS,     // output rows [begin, end) (column-parallel linear, vocabulary-parallel embedding)
  COLUMNS,  // input columns [begin, end) (row-parallel linear: partial sums, all-reduced)
  ABSENT    // another rank's expert (expert parallelism)
};

struct RankModule {
  ModuleSpec module;  // shape: the rank's part
  Split split = Split::WHOLE;
  int64_t begin = 0, end = 0;  // along the split axis of the module's [out, in] (or [vocab, hidden])
};

// Each stored tensor's part on the rank: the element range [begin, end) of dimension `dim` (or all of
// it when dim < 0). An NVFP4 weight's columns are bytes (two values each) and its weight_scale's
// columns 16-value blocks, so a column split moves both by the same values.
struct TensorSlice {
  TensorSpec tensor;  // as stored in the checkpoint (full shape)
  int dim = -1;
  int64_t begin = 0, end = 0;
};

struct RankPlan {
  std::vector<RankModule> modules;
  std::vector<TensorSlice> slices;
};

// The rank's plan, or an error naming each dimension that does not split (heads, KV heads, MLP and
// expert widths, the NVFP4 16-value blocks, the vocabulary, the expert count).
Result<RankPlan> partition(const ModelConfig& config, const QuantConfig& quant, const ParallelConfig& parallel);

}  // namespace nibble::io

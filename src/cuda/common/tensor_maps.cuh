// 2-D tensor maps for the copy engine (TMA, cp.async.bulk.tensor): a row-major tensor of rows × inner
// elements described for boxes of box_rows × box_inner, encoded on the host by the driver's
// cuTensorMapEncodeTiled (reached through the runtime: nothing links libcuda).
#pragma once

#include <cuda.h>  // CUtensorMap

#include <cstdint>

#include "core/status.h"

namespace nibble::cuda {

struct TensorMap2d {
  CUtensorMapDataType type;
  const void* base;      // 16-byte aligned
  uint64_t inner, rows;  // elements a row, rows
  uint64_t row_bytes;    // a multiple of 16
  uint32_t box_inner, box_rows;
  CUtensorMapSwizzle swizzle;
};

// Encodes `map` into `out` (rows past the tensor read as zeros; L2 promotion in 128-byte lines).
Status encode_tensor_map(const TensorMap2d& map, CUtensorMap* out);
// The same, encoded once per distinct map and kept (weights: graph captures and replays, and weight
// reloads in place, see the same maps).
Status cached_tensor_map(const TensorMap2d& map, CUtensorMap* out);

}  // namespace nibble::cuda

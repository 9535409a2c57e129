// skinny_linear's kernel for batches beyond a few rows (skinny_dense_cluster.cu): 128 weight rows a
// CTA over x staged once in shared memory, K split over a thread-block cluster that sums its parts
// in rank order. Internal to the cuda layer: callers use skinny_linear.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"
#include "cuda/linear_nvfp4.cuh"

namespace nibble::cuda {

// in_features it takes: multiples of 128 up to 8 CTAs × 8 k-blocks (8,192).
bool skinny_cluster_supported(int64_t in_features);
// The cluster size (CTAs splitting K) for in_features: K / 512, 1 to 8. A function of K alone, so
// weights launched together or apart sum in the same order.
int skinny_cluster_ranks(int64_t in_features);

// skinny_linear's contract (1 to 3 weights of one in_features sharing x; row_scales or null).
Status skinny_linear_cluster(const uint16_t* x, int64_t M, const DeviceNvfp4Weight* const* weights, float* const* outputs,
                             int count, const float* row_scales, cudaStream_t stream);

}  // namespace nibble::cuda

// One row's residual add + RMSNorm (+ its W4A4 x̂) by a CTA, in add_rmsnorm's order: thread t < NORM_THREADS
// holds elements t + k · NORM_THREADS, sums their squares in k order, then the warps', then the warps'
// partials in order. Threads from NORM_THREADS on hold zeros, which leave every sum and maximum as it
// is, so a larger CTA (the small-batch router, which folds the MoE block's input norm in) gets the
// same bits. Twin of ref::add_inplace + ref::rmsnorm.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/nvfp4/nvfp4_act_quant.cuh"
#include "cuda/nvfp4/nvfp4_layout.h"
#include "cuda/ops/transformer_ops.cuh"

namespace nibble::cuda {

inline constexpr int NORM_THREADS = 256;

// The thread's PER weights (0 past the row, and for a thread not `active`: one from NORM_THREADS on).
template <int PER>
__device__ __forceinline__ void load_norm_weight(const uint16_t* weight, int64_t width, bool active, float (&w)[PER]) {
#pragma unroll
  for (int k = 0; k < PER; ++k) {
    const int64_t i = threadIdx.x + int64_t{k} * NORM_THREADS;
    w[k] = active && i < width ? __uint_as_float(uint32_t(weight[i]) << 16) : 0.0f;
  }
}

// v = x (+ delta · delta_scale) of the thread's elements; predicated, not `break`: every load in flight
// at once. delta_scale ≠ 1: a per-token W4A4 GEMM's row scale, rounded apart from the add (no FMA), as
// a scaling pass over delta would have rounded it.
template <int PER>
__device__ __forceinline__ void load_row(const float* x, const float* delta, int64_t width, bool active,
                                         float (&v)[PER], float delta_scale = 1.0f) {
#pragma unroll
  for (int k = 0; k < PER; ++k) {
    const int64_t i = threadIdx.x + int64_t{k} * NORM_THREADS;
    v[k] = active && i < width
               ? (delta ? x[i] + (delta_scale == 1.0f ? delta[i] : __fmul_rn(delta[i], delta_scale)) : x[i])
               : 0.0f;
  }
}

// v ← BF16(v · 1/sqrt(mean(v²) + eps) · w) as fp32 (the BF16 output's exact values, kept for x̂).
// Every thread of the CTA calls it; partial: blockDim.x / 32 floats of shared memory, which no thread
// may still be reading from an earlier reduction (the caller synchronizes between rows).
template <int PER>
__device__ __forceinline__ void normalize_row(float (&v)[PER], const float (&w)[PER], int64_t width, float eps,
                                              float* partial) {
  float sum_sq = 0.0f;
#pragma unroll
  for (int k = 0; k < PER; ++k) sum_sq += v[k] * v[k];  // zeros past the row add nothing
  for (int offset = 16; offset > 0; offset >>= 1) sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, offset);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = sum_sq;
  __syncthreads();
  float total = 0.0f;
  for (unsigned k = 0; k < blockDim.x / 32; ++k) total += partial[k];
  const float inv = 1.0f / sqrtf(total / static_cast<float>(width) + eps);
#pragma unroll
  for (int k = 0; k < PER; ++k) v[k] = __bfloat162float(__float2bfloat16_rn(v[k] * inv * w[k]));
}

// x̂ of the normed row (v from normalize_row) into q.x_hat row `row`, its row scale into q.row_scales[row]
// (a 16-value block is 16 consecutive threads of one k; width a multiple of 16). Every thread calls it.
// A block's scales are computed once, by lane k of its half-warp, and shuffled to the block's 16
// lanes: each lane computing them for each of its values (the same bits) made a W4A4 prefill's norm
// ~60% slower than W4A16's (H200, docs/lab/perf-notebook.md).
template <int PER>
__device__ __forceinline__ void quantize_row(const float (&v)[PER], int64_t width, const NormActQuant& q, int64_t row,
                                             float* partial) {
  float thread_amax = 0.0f;
  if (q.input_scale == 0.0f)
#pragma unroll
    for (int k = 0; k < PER; ++k) thread_amax = fmaxf(thread_amax, fabsf(v[k]));
  const float global = cta_row_global(q.input_scale, thread_amax, partial, q.row_scales + row);
  if (threadIdx.x >= NORM_THREADS) return;  // whole warps: the shuffles below stay converged
  // Each k's block amax over its 16 lanes (zeros past the row: every k runs, the shuffles converged).
  float amax[PER];
#pragma unroll
  for (int k = 0; k < PER; ++k) {
    amax[k] = fabsf(v[k]);
    for (int offset = 1; offset < 16; offset <<= 1)
      amax[k] = fmaxf(amax[k], __shfl_xor_sync(0xffffffffu, amax[k], offset));
  }
  const int lane16 = threadIdx.x & 15;
#pragma unroll
  for (int k0 = 0; k0 < PER; k0 += 16) {
    float mine = 0.0f;  // the amax of block k0 + lane16, selected (a register array indexed at run time spills)
#pragma unroll
    for (int k = 0; k < 16 && k0 + k < PER; ++k)
      if (lane16 == k) mine = amax[k0 + k];
    const ActBlockScale computed(mine, global);
#pragma unroll
    for (int k = k0; k < PER && k < k0 + 16; ++k) {
      ActBlockScale block;
      block.out_scale = __shfl_sync(0xffffffffu, computed.out_scale, k - k0, 16);
      block.block_scale = __shfl_sync(0xffffffffu, computed.block_scale, k - k0, 16);
      const int64_t i = threadIdx.x + int64_t{k} * NORM_THREADS;
      if (i < width)
        q.x_hat[row * width + (q.fragment_order ? fragment_order_index(i) : i)] =
            static_cast<uint16_t>(block.bf16(v[k]));
    }
  }
}

}  // namespace nibble::cuda

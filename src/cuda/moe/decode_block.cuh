// The one-launch MoE block's pieces (moe_decode.cu): its CTA shape, grid barriers and tagged words
// between co-resident CTAs, and a warp's NVFP4 tile GEMV from shared memory in skinny_gemm.cu's
// fragments and k order, the expert weights in line order (nvfp4_layout.h, skinny_fragments.cuh's LINE).
#pragma once

#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>
#include <cstdio>

#include "cuda/gemm/skinny_fragments.cuh"
#include "cuda/moe/moe_routing_device.cuh"

namespace nibble::cuda::decode_block {

inline constexpr int WARPS = 16, THREADS = WARPS * 32;  // a CTA of the block

// A spinning wait that outlives 10 s names itself and traps: the launch fails with a line that says
// which meeting, where a device that hung would say nothing (a server whose CTAs could not all be
// resident, a tag that never came). The global timer is read every 1,024 polls only.
struct Watchdog {
  unsigned polls = 0;
  unsigned long long start = 0;
  __device__ __forceinline__ void check(const char* meeting, unsigned target) {
    if (++polls & 1023u) return;
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (start == 0) start = now;
    if (now - start < 10'000'000'000ull) return;
    printf("moe_decode_block: CTA %d waited 10 s at %s for %u\n", int(blockIdx.x), meeting, target);
    __trap();
  }
};

// Grid barriers (the CTAs are co-resident: one an SM, no more than the SMs), generation-counted so
// two words {arrived, generation} serve every launch: one thread of each CTA arrives (release: the
// CTA's writes, ordered before it by the caller's __syncthreads, become visible at GPU scope) and
// later waits (acquire) for the generation the last arrival publishes. Split so a CTA can work
// between its arrival and the wait. H200: 1.44 µs a barrier, against 1.74 with __threadfence around
// relaxed atomics.
// Whether this CTA arrived last (it then resets the count for the next barrier).
__device__ __forceinline__ bool arrive_last(unsigned* bar, unsigned ctas) {
  unsigned arrived;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n" : "=r"(arrived) : "l"(bar) : "memory");
  if (arrived != ctas - 1) return false;
  asm volatile("st.relaxed.gpu.global.u32 [%0], 0;\n" ::"l"(bar) : "memory");
  return true;
}
__device__ __forceinline__ void grid_arrive(unsigned* bar, unsigned ctas, unsigned target) {
  if (arrive_last(bar, ctas))
    asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(bar + 1), "r"(target) : "memory");
}
__device__ __forceinline__ void grid_wait(const unsigned* bar, unsigned target) {
  unsigned seen;
  Watchdog dog;
  for (;;) {
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(seen) : "l"(bar + 1) : "memory");
    if (seen == target) return;
    dog.check("a grid barrier", target);
  }
}

// The last launch's final generation: thread 0 reads it after the PDL wait (the previous launch's
// writes are visible only then), before its CTA's first arrival.
__device__ __forceinline__ unsigned first_generation(const unsigned* bar) {
  return *reinterpret_cast<const volatile unsigned*>(bar + 1);
}

// A value met without a barrier: its fp32 bits beside the launch's tag in one 64-bit word, stored and
// loaded single-copy atomic (aligned st/ld.relaxed.gpu.u64), so a reader that sees the tag sees the
// value. The tag must differ from every earlier launch's (the generation this launch's barrier will
// publish); the words need no reset between launches.
__device__ __forceinline__ void store_tagged(unsigned long long* word, unsigned tag, float value) {
  const unsigned long long w = (static_cast<unsigned long long>(tag) << 32) | __float_as_uint(value);
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;\n" ::"l"(word), "l"(w) : "memory");
}

// One warp: words[lane + 32 i] (i < ROUTER_MAX_PER_LANE, below n) polled until each carries `tag`,
// into v (−FLT_MAX past n). All of a lane's outstanding words are loaded before any is checked, so a
// round is one L2 round trip, not eight. `meeting` names the wait in the watchdog's line.
__device__ __forceinline__ void poll_tagged(const unsigned long long* words, int n, unsigned tag,
                                            float (&v)[ROUTER_MAX_PER_LANE], const char* meeting) {
  const int lane = threadIdx.x & 31;
  unsigned pending = 0;
#pragma unroll
  for (int i = 0; i < ROUTER_MAX_PER_LANE; ++i) {
    v[i] = -FLT_MAX;
    if (lane + 32 * i < n) pending |= 1u << i;
  }
  Watchdog dog;
  while (__any_sync(0xFFFFFFFFu, pending != 0)) {
    unsigned long long w[ROUTER_MAX_PER_LANE];
#pragma unroll
    for (int i = 0; i < ROUTER_MAX_PER_LANE; ++i)
      if (pending >> i & 1u)
        asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];\n" : "=l"(w[i]) : "l"(words + lane + 32 * i));
#pragma unroll
    for (int i = 0; i < ROUTER_MAX_PER_LANE; ++i)
      if ((pending >> i & 1u) && unsigned(w[i] >> 32) == tag)
        v[i] = __uint_as_float(unsigned(w[i])), pending &= ~(1u << i);
    if (pending) dog.check(meeting, tag);
  }
}

// The whole barrier for a CTA (generation: thread 0's count of barriers passed).
__device__ __forceinline__ void grid_barrier(unsigned* bar, unsigned ctas, unsigned& generation) {
  __syncthreads();
  if (threadIdx.x == 0) grid_arrive(bar, ctas, ++generation), grid_wait(bar, generation);
  __syncthreads();
}

// The lane's code words and scale codes (load_scales<true>) of k-block b of a 16-row tile in shared
// memory (codes rows k / 2 bytes, then scale code rows k / 16 bytes): rows g and g + 8.
__device__ __forceinline__ void load_kblock(const uint8_t* tile, int k, int b, uint4 (&codes)[2],
                                            uint32_t (&scales)[2]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    codes[h] = *reinterpret_cast<const uint4*>(tile + (g + 8 * h) * (k / 2) + b * 64 + 16 * c);
    const uint2 v = *reinterpret_cast<const uint2*>(tile + 16 * (k / 2) + (g + 8 * h) * (k / 16) + b * 8);
    scales[h] = __byte_perm(v.x, v.y, skinny::line_scale_selector(c));
  }
}

// Bytes of a 16-row tile of a k-wide NVFP4 weight as load_kblock reads it: the rows' codes (one
// contiguous run in global memory), then their scale codes (another).
__host__ __device__ constexpr int tile_bytes(int k) { return 16 * (k / 2 + k / 16); }

// One warp's k-blocks [kb0, kb1) of a 16-row tile in shared memory against the x row (lanes of token
// column 0; null elsewhere: zero columns), into acc. Two k-blocks a step into two sums: their loads
// together, half the dependent mma chain.
__device__ __forceinline__ void tile_mma(const uint8_t* tile, int k, const uint16_t* x_row, int kb0, int kb1,
                                         float (&acc)[1][4]) {
  const int c = threadIdx.x & 3;
  float acc2[1][4] = {};
  for (int b0 = kb0; b0 < kb1; b0 += 2) {
    uint4 codes[2][2], xv[2][1][4];
    uint32_t scales[2][2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int b = min(b0 + j, kb1 - 1);  // an odd range's last step repeats a block into a zero x
      const bool real = b0 + j < kb1;
      load_kblock(tile, k, b, codes[j], scales[j]);
      skinny::token_x_fragment<true>(x_row, b, x_row && real, c, xv[j][0]);
    }
    skinny::mma_kblock<1, true>(codes[0], scales[0], xv[0], acc);
    skinny::mma_kblock<1, true>(codes[1], scales[1], xv[1], acc2);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[0][i] += acc2[0][i];
}

// Warps `split` to a tile (its k-blocks), `groups` tiles a round; the partial sums meet in warp order
// in `sums` (4 · 32 floats a warp). Every warp calls it the same number of times (it synchronizes).
__device__ __forceinline__ void sum_split(float (&acc)[1][4], int split, bool active, float* sums) {
  if (split == 1) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, part = warp % split;
  if (active && part > 0)
#pragma unroll
    for (int i = 0; i < 4; ++i) sums[(warp * 4 + i) * 32 + lane] = acc[0][i];
  __syncthreads();
  if (active && part == 0)
    for (int w = 1; w < split; ++w)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[0][i] += sums[((warp + w) * 4 + i) * 32 + lane];
  __syncthreads();
}

}  // namespace nibble::cuda::decode_block

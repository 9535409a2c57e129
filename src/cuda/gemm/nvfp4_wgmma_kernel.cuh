// NVFP4 × BF16 GEMMs for prefill-sized batches on Hopper's warpgroup MMA with the weights as the
// register operand (wgmma RS, sm_90a): a CTA computes 64 · WG weight rows (WG = 2 or 3 consumer
// warpgroups of one m-tile of 64; gate_up: gate and up of each feature in one thread) × N token rows
// (N = 32…256, the tile height). A producer warpgroup brings each 64-wide k-step — FP4 codes and
// in-order BF16 activation rows by the copy engine (TMA), scale codes and gathered rows by cp.async —
// into a ring of stages; each consumer thread decodes its weight rows' codes straight into wgmma A
// fragments (E2M1 × E4M3 is exact in BF16) while the previous group's MMAs run, and the activations
// are wgmma's B operand in shared memory. A tile's MMAs are only as wide as its rows need, and BF16
// outputs leave through a shared-memory staging in 16-byte runs. Twin of ref::moe's projections and
// ref::linear_nvfp4. The kernel and its mainloop (layouts: nvfp4_wgmma_layout.cuh, epilogue:
// nvfp4_wgmma_epilogue.cuh); nvfp4_wgmma.cu launches it and is the one file that includes these (so
// their anonymous namespace is that file's).
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <type_traits>

#include "cuda/common/async_copy.cuh"
#include "cuda/moe/moe_grouping.cuh"
#include "cuda/nvfp4/nvfp4_fragments.cuh"
#include "cuda/nvfp4/nvfp4_layout.h"
#include "cuda/gemm/nvfp4_wgmma.cuh"
#include "cuda/gemm/nvfp4_wgmma_epilogue.cuh"
#include "cuda/gemm/nvfp4_wgmma_layout.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/tensor_maps.cuh"
#include "cuda/common/wgmma.cuh"

namespace nibble::cuda {
namespace {

// The MMA width for a tile of `rows` rows in a kernel of height N: the narrowest wgmma shape that
// holds them, so the tensor cores skip most of an expert's last, partial tile (H200, MoE block on
// even routing, widths 32, 64, 128, 192, 256 against N always: T = 512 399 → 359 µs, T = 2,048 755 →
// 713). Below N = 256 every multiple of 32 (one m64nWk16 shape each; 96 as well as 128: T = 1,024 411
// → 399 µs); N = 256 keeps 32, 64, 128, 192, 256: with seven or more shapes in one kernel ptxas
// serializes its wgmmas (C7512: registers), as it did for widths made of two shapes.
template <int N>
__device__ __forceinline__ int mma_width(int rows) {
  const int width = N < 256       ? (rows + 31) / 32 * 32
                    : rows <= 32  ? 32
                    : rows <= 64  ? 64
                    : rows <= 128 ? 128
                    : rows <= 192 ? 192
                                  : 256;
  return min(N, max(width, 32));
}

// Calls f(std::integral_constant<int, W>) for W = width, one of mma_width's widths up to N (warp-uniform).
template <int N, int W = 32, class F>
__device__ __forceinline__ void with_width(int width, F&& f) {
  if constexpr (W < N) {
    if (width == W) return f(std::integral_constant<int, W>{});
    with_width < N, N<256 ? W + 32 : W == 32 ? 64 : W == 64 ? 128 : W + 64>(width, f);
  } else {
    f(std::integral_constant<int, N>{});
  }
}

// Where the consumers are in the ring of stages; carried across items.
struct RingPosition {
  int slot = 0;
  uint32_t phase = 0;
  int code_pair = 0;  // line order: the region of the codes (Layout::CODE_PAIRS)
};

// Where a local weight row's codes are in a stage's code region: at its local row, or with the copy
// engine's boxes (TMA) at its row in its projection's block (gated: gate rows, then up rows).
template <bool GATED, int TMA, int ROWS>
__device__ __forceinline__ int code_row(int local) {
  if constexpr ((TMA & 1) && GATED)
    return projection<GATED>(local) * (ROWS / 2) + weight_row<GATED, ROWS>(0, local);
  else
    return local;
}

// One item's k-steps for a consumer thread: wait for each stage, decode its weight rows' codes into A
// fragments (rows local0 and local0 + 8), issue the MMAs over the tile's first WIDTH token rows, free
// each stage when its MMAs are done. A wgmma group is two MMAs (half a k-step, two k16 blocks), decoded
// while the group before runs: two groups' fragments are all a thread holds beside its accumulators
// (more made ptxas serialize the wgmmas).
//
// FRAG (line order; the activations in fragment order, nvfp4_layout.h): thread q's A
// fragments of a stage are exactly the pairs of two code words of each of its rows — natural chunks q
// and 4 + q of the stage, the 8 bytes at 8·half of lane slot q — so each row takes one 8-byte load,
// its pairs decode at compile-time positions (decode_code_pair_at: ~2.75 operations a pair against 4
// with run-time rotations), and one block scale serves each word.
template <int WIDTH, int N, bool LINE, bool GATED, int TMA, bool FRAG, class L>
__device__ __forceinline__ void consume_item(float (&acc)[N / 2], RingPosition& ring, uint8_t* smem, uint64_t* full,
                                             uint64_t* empty, uint64_t act_descriptor, int k_tiles, int local0,
                                             int lane, int magnitude_rotation, int sign_rotation) {
  static_assert(!FRAG || LINE, "fragment order: line-order codes");
  constexpr int ROWS = L::ROWS;
  constexpr int STAGES = L::STAGES;
  uint32_t frag[2][2][4];  // [group parity][k16 block in the group][A register]
  int prev_slot = 0;
  for (int kt = 0; kt < k_tiles; ++kt) {
    // The stage's copies landed (cp.async.mbarrier.arrive): wgmma reads them with no proxy fence
    // between, as CUTLASS's SM90 cp.async mainloops do (sm90_mma_multistage_gmma_ss_warpspecialized.hpp:
    // consumer_wait, warpgroup_arrive, gemm). A fence.proxy.async here cost the MoE block 5% at T = 512
    // and 1,024 on the H200 (326 → 309, 360 → 342 µs; docs/lab/perf-notebook.md), 3% of a mixed serving step.
    barrier_wait(&full[ring.slot], ring.phase);
    const uint8_t* codes = smem + L::CODE_OFFSET + (LINE ? ring.code_pair * 2 : ring.slot) * L::CODE_STAGE;
    const uint8_t* scales = smem + L::SCALE_OFFSET + ring.slot * L::SCALE_STAGE;
    const int half = kt & 1;  // line order: the stage's half of the 128-block (k_tiles is even)
    uint32_t scale_word[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) scale_word[r] = *reinterpret_cast<const uint32_t*>(scales + (local0 + 8 * r) * 4);
    const uint64_t stage_descriptor = act_descriptor + uint32_t(ring.slot * (L::ACT_STAGE / 16));
    // FRAG: each row's two words (x: natural chunk q of the stage, y: chunk 4 + q) and their block
    // scales' BF16 operands, each in both halves (blocks q / 2 and 2 + q / 2 of the stage).
    uint2 frag_words[2];
    uint32_t frag_scales[2][2];
    if constexpr (FRAG) {
      const int q = lane % 4;
      const uint32_t selector = 0x4240u + uint32_t(q >> 1) * 0x0101u;  // [block q/2, 0, block 2 + q/2, 0]
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = code_row<GATED, TMA, ROWS>(local0 + 8 * r);
        frag_words[r] = *reinterpret_cast<const uint2*>(codes + (q * ROWS + row) * 16 + 8 * half);
        const uint32_t both =
            __byte_perm(scale_word[r], 0u, selector) * 0x10u + (SCALE_OPERAND_BIAS | SCALE_OPERAND_BIAS << 16);
        frag_scales[r][0] = __byte_perm(both, 0u, 0x1010u), frag_scales[r][1] = __byte_perm(both, 0u, 0x3232u);
      }
    }
#pragma unroll
    for (int group = 0; group < 2; ++group) {
      const int parity = group % 2;
      // The group's k16 blocks of the stage. Natural: blocks 2g, 2g + 1. Line order: the stage's block
      // B is natural words 8h + 2B + e (h the half, e = 0, 1), stored as word 2h + B / 2 of lane slot
      // 2(B % 2) + e; so group g takes blocks {g, g + 2}, whose words are the two words at 8h bytes of
      // lane slots 2g and 2g + 1.
      auto block_of = [&](int b) { return LINE ? group + 2 * b : 2 * group + b; };
      if constexpr (FRAG) {
        // Block group + 2b of the stage's B order: word b's pairs 2·group (a0, a1) and 2·group + 1 (a2, a3).
#pragma unroll
        for (int b = 0; b < 2; ++b)
#pragma unroll
          for (int i = 0; i < 4; ++i) {  // A registers: row r = i % 2, pair 2·group + i / 2
            const uint32_t word = b ? frag_words[i % 2].y : frag_words[i % 2].x;
            frag[parity][b][i] = bf16x2_mul(decode_code_pair_unrolled(word, 2 * group + i / 2), frag_scales[i % 2][b]);
          }
      }
      if constexpr (!FRAG) {
        // Natural: block b's codes are words 2b, 2b + 1 of chunk b / 2 (k 32·(b / 2) … +31) of a row.
        // A thread takes pair q of each word as BF16s, the codes of k 2q, 2q + 1 in its group of 8 —
        // what an A fragment's thread q holds (k 2q, 2q + 1 and 2q + 8, 2q + 9 of the block). The
        // rotations are pair q's (nvfp4_layout.h).
        uint32_t words[2][2][2];  // [row][block of the group][k half of the block]
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = code_row<GATED, TMA, ROWS>(local0 + 8 * r);
          if constexpr (LINE) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const uint2 v = *reinterpret_cast<const uint2*>(codes + ((2 * group + e) * ROWS + row) * 16 + 8 * half);
              words[r][0][e] = v.x, words[r][1][e] = v.y;
            }
          } else {
            const uint4 v = *reinterpret_cast<const uint4*>(codes + (group * ROWS + row) * 16);
            words[r][0][0] = v.x, words[r][0][1] = v.y, words[r][1][0] = v.z, words[r][1][1] = v.w;
          }
        }
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          const uint32_t scale0 = block_scale_bf16x2(scale_word[0], block_of(b));
          const uint32_t scale1 = block_scale_bf16x2(scale_word[1], block_of(b));
#pragma unroll
          for (int i = 0; i < 4; ++i)  // A registers: row r = i % 2, k half i / 2
            frag[parity][b][i] = bf16x2_mul(decode_code_pair(words[i % 2][b][i / 2], magnitude_rotation, sign_rotation),
                                            i % 2 ? scale1 : scale0);
        }
      }
      wgmma::fence();
#pragma unroll
      for (int b = 0; b < 2; ++b)
        wgmma::mma_rs<WIDTH>(*reinterpret_cast<float(*)[WIDTH / 2]>(&acc[0]), frag[parity][b],
                             stage_descriptor + block_of(b) * 2);
      wgmma::commit();
      // The group before this one is done: its fragments may be rewritten, and after the first group
      // the previous stage has no reader left.
      wgmma::wait<1>();
      if (group == 0 && kt > 0 && lane == 0) barrier_arrive(&empty[prev_slot]);
    }
    prev_slot = ring.slot;
    if (++ring.slot == STAGES) ring.slot = 0, ring.phase ^= 1;
    if (half && ++ring.code_pair == L::CODE_PAIRS) ring.code_pair = 0;
  }
  wgmma::wait<0>();
  if (lane == 0) barrier_arrive(&empty[prev_slot]);  // the item's last stage: free for the next item's fills
}

// Persistent: work items are (row tile, weight slice) pairs, slice fastest (a row tile's activations
// stay in L2 for its slices), and CTA b takes items b, b + gridDim.x, … of a grid of CTA slots per
// SM, the producers filling the ring with the next item's stages while the consumers finish the last
// one's MMAs and store its outputs. The ring (slot, phase) runs on across items.
template <bool GATED, int N, bool LINE, int WG, int TMA, bool FRAG, int CTAS = CTAS_PER_SM<N>>
__global__ void __launch_bounds__(CONSUMER_THREADS<WG> + PRODUCERS, CTAS)
    nvfp4_wgmma_kernel(const __grid_constant__ Params p) {
  static_assert(!LINE || (TMA & 1), "line-order codes come by the copy engine");
  using L = Layout<N, LINE, WG>;
  constexpr int ROWS = L::ROWS;
  constexpr int CONSUMERS = CONSUMER_THREADS<WG>;
  constexpr int STAGES = L::STAGES;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  // 1024-byte aligned for the swizzle by an offset from the __shared__ array (rounding the generic
  // address loses the state space: every shared access becomes a generic one).
  uint8_t* smem = smem_raw + ((1024u - (smem_address(smem_raw) & 1023u)) & 1023u);
  const int tid = threadIdx.x;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::BARRIER_OFFSET);  // [STAGES]: the stage's copies landed
  uint64_t* empty = full + STAGES;                                         // [STAGES]: the stage was consumed
  // The tile's W4A4 row scales, staged for the epilogue: loaded there, one per accumulator column,
  // they cost the W4A4 GEMMs 12–16% (H200, MoE T = 2,048: down 262 → 305 µs).
  float* row_scales = reinterpret_cast<float*>(smem + L::ROW_SCALES_OFFSET);
  if (tid < STAGES) {
    barrier_init(&full[tid], PRODUCERS);           // each producer thread's copies
    barrier_init(&empty[tid], CONSUMERS / 32);     // lane 0 of each consumer warp
    if constexpr (TMA != 0) fence_barrier_init();  // the copy engine completes transfers on `full`
  }
  // Launched with PDL: the set-up above overlaps the previous kernel's tail; the tile list and the
  // activations are the earlier kernels' output.
  pdl_wait();
  pdl_launch_dependents();
  const int items = p.slices * row_tiles(p, N);
  if (int(blockIdx.x) >= items) return;
  __syncthreads();
  const int k_tiles = p.k / BK;
  // Warp-uniform as ptxas can see (a shuffle), so the wgmma below are not serialized.
  const int warpgroup = __shfl_sync(0xffffffffu, tid / 128, 0);

  if (warpgroup == CONSUMERS / 128) {  // the producers: local weight rows lane + 128m, activation chunks
    // Registers go to the consumers (N = 256 holds 128 accumulators and 16 fragment registers).
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGISTERS<CTAS, WG>) : "memory");
    const int lane = tid - CONSUMERS;
    const int which = projection<GATED>(lane);  // the same for lane + 128m
    constexpr int PRODUCER_ROWS = (ROWS + PRODUCERS - 1) / PRODUCERS;
    // Everything a k-step's copies need is in registers: 64-bit weight sources and an activation base
    // advanced by a k-step's bytes, the activation rows' byte offsets from it, 32-bit shared addresses. (Recomputing
    // the sources from the parameters per copy made the producer warp, one per scheduler, the kernel's limit: H200, MoE
    // T = 2,048, consumers waited for stages in 24% of the stall samples.)
    const uint32_t act_place = smem_address(smem + L::ACT_OFFSET) + wgmma::swizzled_offset(lane / 8, lane % 8);
    const uint32_t code_place = smem_address(smem + L::CODE_OFFSET) + lane * 16;
    const uint32_t scale_place = smem_address(smem + L::SCALE_OFFSET) + lane * 4;
    const uint32_t full_place = smem_address(full);
    int slot = 0, code_pair = 0;
    uint32_t phase = 0;
    for (int item = blockIdx.x, fills = 0; item < items; item += gridDim.x) {
      const RowTile tile = row_tile(p, item / p.slices, N);
      // Weight rows past the weight's rows read its last row, activation rows past the tile's rows its
      // last row: their outputs are dropped, and no copy needs a zero fill.
      // Producer thread `lane` copies local rows lane + 128m, m < PRODUCER_ROWS, those below ROWS.
      const uint8_t* code_src[PRODUCER_ROWS];
      const uint8_t* scale_src[PRODUCER_ROWS];
#pragma unroll
      for (int m = 0; m < PRODUCER_ROWS; ++m) {
        const int row = min(weight_row<GATED, ROWS>(item % p.slices, min(lane + 128 * m, ROWS - 1)), p.n - 1);
        const size_t row_index = size_t(tile.expert) * p.n + row;
        code_src[m] = p.codes[which] + row_index * (p.k / 2);
        scale_src[m] = p.scales[which] + row_index * (p.k / 16);
      }
      // Activation chunk (lane % 8) of rows t_i = lane / 8 + 16·i, whose swizzled place is the same
      // chunk for every i as t_i % 8 = (lane / 8) % 8; rows from the tile's MMA width on are not read.
      // Each copy's address is a register pair built from a uniform base and a 32-bit offset, and a
      // copy reads it late: the copies wait on one another (H200, MoE T = 8,192, gate_up: consumers
      // waiting on their stages in 12% of the stall samples; docs/lab/perf-notebook.md). Rows in order (down's input,
      // dense x) come by the copy engine instead (TMA bit 2, below); gate_up's gathered rows cannot.
      constexpr int CHUNKS = N * 8 / PRODUCERS;
      const int copies = mma_width<N>(tile.rows) / 16;  // chunks i < copies are inside the width
      uint32_t act_offset[CHUNKS];
#pragma unroll
      for (int i = 0; i < CHUNKS; ++i) {
        const int t = min(lane / 8 + 16 * i, tile.rows - 1);
        act_offset[i] = uint32_t(source_row(p, tile.row0 + t)) * uint32_t(p.k) * 2u + (lane % 8) * 16;
      }
      const uint8_t* act_base = reinterpret_cast<const uint8_t*>(p.act);  // + the k-step's bytes
      for (int kt = 0; kt < k_tiles; ++kt, ++fills) {
        // Fill `fills` reuses the slot of fill − STAGES: wait for that one's consumption.
        if (fills >= STAGES) barrier_wait(&empty[slot], phase ^ 1);
        if constexpr ((TMA & 1) != 0) {
          // The copy engine brings the pair's codes with the even stage: per projection, each 16-byte
          // lane slot of the slice's rows as one box, into [lane slot][ROWS][16 B] (gated: gate rows,
          // then up rows: code_row). 16-byte cp.asyncs, one a row and slot, had the producer's
          // requests in flight as its limit (docs/lab/perf-notebook.md). Rows past the expert's read the next
          // expert's (or the copy engine's zeros past the last): their outputs are dropped.
          if ((kt & 1) == 0 && lane == 0) {
            constexpr int PROJECTIONS = GATED ? 2 : 1, PROJECTION_ROWS = ROWS / PROJECTIONS;
            barrier_expect_tx_shared(full_place + slot * 8, PROJECTIONS * 4 * PROJECTION_ROWS * 16);
            const uint32_t region = smem_address(smem + L::CODE_OFFSET) + code_pair * 2 * L::CODE_STAGE;
            const int y = tile.expert * p.n + (item % p.slices) * PROJECTION_ROWS;
#pragma unroll
            for (int w = 0; w < PROJECTIONS; ++w)
#pragma unroll
              for (int c = 0; c < 4; ++c)
                tma_load_2d(region + (c * ROWS + w * PROJECTION_ROWS) * 16, &p.code_maps[w], kt * (BK / 2) + 16 * c, y,
                            full_place + slot * 8);
          }
        }
#pragma unroll
        for (int m = 0; m < PRODUCER_ROWS; ++m) {
          if (ROWS % 128 && lane + 128 * m >= ROWS) continue;  // three warpgroups' 192 rows: warp-uniform
          if constexpr ((TMA & 1) == 0) {  // natural order (TMA & 1, line order: the copy engine brought them)
            const uint32_t code = code_place + slot * L::CODE_STAGE + m * 128 * 16;
            cp_async_shared<16>(code, code_src[m]);
            cp_async_shared<16>(code + ROWS * 16, code_src[m] + 16);
            code_src[m] += BK / 2;
          }
          cp_async_shared<4>(scale_place + slot * L::SCALE_STAGE + m * 128 * 4, scale_src[m]);
          scale_src[m] += BK / 16;
        }
        if (LINE && (kt & 1) && ++code_pair == L::CODE_PAIRS) code_pair = 0;
        if constexpr ((TMA & 2) != 0) {
          // Rows in order (down's input, a dense GEMM's x): the copy engine brings the stage's rows of
          // the MMA width as boxes of 32 rows × 64 k, in the 128-byte swizzle wgmma reads (the
          // stage's 1024-byte alignment keeps the address-based pattern); rows past the tensor are zeros.
          if (lane == 0) {
            const int boxes = copies / 2;  // the width (a multiple of 32) in 32-row boxes
            barrier_expect_tx_shared(full_place + slot * 8, boxes * 32 * BK * 2);
            const uint32_t stage = smem_address(smem + L::ACT_OFFSET) + slot * L::ACT_STAGE;
            for (int b = 0; b < boxes; ++b)
              tma_load_2d(stage + b * 32 * 128, &p.act_map, kt * BK, tile.row0 + 32 * b, full_place + slot * 8);
          }
        } else {
          const uint32_t a = act_place + slot * L::ACT_STAGE;
#pragma unroll
          for (int i = 0; i < CHUNKS; ++i)
            if (i < copies) cp_async_shared<16>(a + i * 16 * 128, act_base + act_offset[i]);
        }
        barrier_arrive_on_copies_shared(full_place + slot * 8);
        act_base += BK * 2;
        if (++slot == STAGES) slot = 0, phase ^= 1;
      }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");  // the copies were never committed to a group
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGISTERS<CTAS, WG>) : "memory");
  const int lane = tid & 31, warp = (tid / 32) % 4, q = lane % 4;
  const int local0 = 64 * warpgroup + 16 * warp + lane / 4;  // rows local0 and local0 + 8
  const int magnitude_rotation = pair_magnitude_rotation(q), sign_rotation = pair_sign_rotation(q);
  // The activation tile's descriptors: that of stage 0's first k16 block, plus 16-byte units.
  const uint64_t act_descriptor = wgmma::descriptor(smem + L::ACT_OFFSET);
  RingPosition ring;
  RowTile next = row_tile(p, blockIdx.x / p.slices, N);
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const RowTile tile = next;
    const int slice = item % p.slices;
    if (item + int(gridDim.x) < items) next = row_tile(p, (item + gridDim.x) / p.slices, N);  // in flight meanwhile
    // This thread's row's W4A4 scale (row tid), loaded now, staged after the MMAs.
    const float my_row_scale = p.row_scales && tid < tile.rows ? p.row_scales[source_row(p, tile.row0 + tid)] : 1.0f;
    float acc[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) acc[i] = 0.0f;
    // Warp-uniform as ptxas can see, like `warpgroup`.
    const int width = __shfl_sync(0xffffffffu, mma_width<N>(tile.rows), 0);
    with_width<N>(width, [&](auto w) {
      consume_item<decltype(w)::value, N, LINE, GATED, TMA, FRAG, L>(
          acc, ring, smem, full, empty, act_descriptor, k_tiles, local0, lane, magnitude_rotation, sign_rotation);
    });
    if (p.row_scales) {
      // Every consumer is past the last item's epilogue before the staged scales are replaced.
      asm volatile("bar.sync 1, %0;\n" ::"n"(CONSUMERS) : "memory");
      if (tid < N) row_scales[tid] = my_row_scale;
      asm volatile("bar.sync 1, %0;\n" ::"n"(CONSUMERS) : "memory");
    }

    // Epilogue. The decoded weights are × 2⁻⁸ (nvfp4_layout.h): the factor restores them, exactly.
    const float scale0 = (p.global_scales[0] ? p.global_scales[0][tile.expert] : p.scale) * WEIGHT_DECODE_EPILOGUE;
    const float scale1 = GATED ? p.global_scales[1][tile.expert] * WEIGHT_DECODE_EPILOGUE : 0.0f;
    const bool bf16 = !p.out_fp32;
    const bool staged = CTAS == 1 && N >= 64 && bf16 && p.n % 8 == 0 && reinterpret_cast<uintptr_t>(p.out) % 16 == 0;
    Outputs<GATED, N> out{p,
                          tile,
                          p.row_scales ? row_scales : nullptr,
                          scale0,
                          scale1,
                          weight_row<GATED, ROWS>(slice, local0),
                          weight_row<GATED, ROWS>(slice, local0 + 8),
                          q};
    if (staged) {
      const uint32_t staging = smem_address(smem + L::STAGING_OFFSET) + warpgroup * 64 * STAGED_PITCH;
      const int feature0 = weight_row<GATED, ROWS>(slice, 64 * warpgroup);
      if (p.row_scales)
        out.template store_bf16_staged<true>(acc, staging, feature0, warpgroup, tid % 128);
      else
        out.template store_bf16_staged<false>(acc, staging, feature0, warpgroup, tid % 128);
    } else if (bf16 && p.n % 2 == 0) {
      out.store_bf16_pairs(acc, lane);
    } else if (p.out_fp32) {
      out.store_each(acc, static_cast<float*>(p.out));
    } else {
      out.store_each(acc, static_cast<__nv_bfloat16*>(p.out));
    }
  }
}

}  // namespace
}  // namespace nibble::cuda

// NVFP4 × BF16 GEMMs for prefill-sized batches on Hopper's warpgroup MMA (wgmma, sm_90a). A CTA
// computes 128 rows (expert-sorted pairs of one expert, or dense tokens) × 256 weight rows (gate_up:
// 128 gate and the same 128 up features; down and dense: 256 output features). Per 64-wide k-step a
// producer warpgroup cp.asyncs the FP4 codes, E4M3 scales and (gathered) activation rows into a
// 4-stage ring; each of 256 consumer threads decodes one weight row once into a BF16 tile (E2M1 ×
// E4M3 is exact in BF16) that both consumer warpgroups read through wgmma descriptors while the
// tensor cores run the previous k-step: the decode is done once per CTA, not per warp and token tile
// as in moe_gemm.cu's mma.sync kernel. Twin of ref::moe's projections and ref::linear_nvfp4.
#include <cuda_bf16.h>

#include <cstdlib>

#include "cuda/nvfp4_wgmma.cuh"

#include "cuda/async_copy.cuh"
#include "cuda/check.cuh"
#include "cuda/moe_grouping.cuh"
#include "cuda/nvfp4_fragments.cuh"
#include "cuda/wgmma.cuh"

namespace nibble::cuda {
namespace {

constexpr int BT = 128;  // sorted rows per CTA: two warpgroups of 64
constexpr int BN = 256;              // weight rows per CTA, one per consumer thread
constexpr int BK = 64;               // k per step: one 128-byte swizzled row of BF16
constexpr int STAGES = 4;            // k-steps of raw data in flight (6 measured no faster)
constexpr int CONSUMERS = 256;       // two warpgroups: decode and MMA
// One warpgroup of producers: with a single producer warp its address arithmetic and 56 copies per
// lane per step made it the bottleneck (H200, q_proj M = 8192: 659 µs, against 390 µs with four).
constexpr int PRODUCER_WARPS = 4;
static_assert(BN == CONSUMERS, "each consumer thread decodes one weight row");

// Shared memory: the activation tiles and BF16 weight tiles are wgmma operands (1024-byte aligned
// for the 128-byte swizzle); raw codes are stored chunk-major so a quarter-warp's 16-byte reads of 8
// rows fall in distinct banks.
constexpr int A_STAGE = BT * 128;        // 16 KB
constexpr int B_TILE = BN * 128;         // 32 KB, double-buffered
constexpr int CODE_STAGE = BN * BK / 2;  // 8 KB: [2 chunks][BN rows][16 B]
constexpr int SCALE_STAGE = BN * BK / 16;
constexpr int A_OFFSET = 0;
constexpr int B_OFFSET = A_OFFSET + STAGES * A_STAGE;
constexpr int CODE_OFFSET = B_OFFSET + 2 * B_TILE;
constexpr int SCALE_OFFSET = CODE_OFFSET + STAGES * CODE_STAGE;
constexpr int BARRIER_OFFSET = SCALE_OFFSET + STAGES * SCALE_STAGE;
constexpr int ROWS_OFFSET = BARRIER_OFFSET + 2 * STAGES * 8;
constexpr int SMEM_BYTES = ROWS_OFFSET + BT * int(sizeof(int)) + 1024;  // + alignment slack
static_assert(SMEM_BYTES <= 227 * 1024, "Hopper's shared memory per block");

struct Params {
  const uint8_t* codes[2];  // gate, up (gated) or down in [0]
  const uint8_t* scales[2];
  const float* global_scales[2];  // per expert; null: `scale` (the dense weight's weight_scale_2)
  float scale;
  int n, k;                 // weight rows per expert (per projection), in_features
  const uint16_t* act;
  const int32_t* sorted_pairs;
  int top_k;
  const float* row_scales;
  const int32_t* tile_offsets;  // the MoE tile list; null for a dense GEMM of m rows
  const int4* tiles;
  int experts, m;
  void* out;
  bool out_fp32;
};

// The 256 consumer threads only (named barrier 1; the producer warp never joins it).
__device__ __forceinline__ void consumer_sync() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }

// Roles: warps 0–7 (two warpgroups) decode the weight tiles and run the MMAs; warps 8–11 only issue
// the cp.async copies of every stage and never wait on them (the copies arrive on the stage's `full`
// barrier as they land). Decoding threads then hold no global copies in flight when they run the
// proxy fence their BF16 tiles need before wgmma (MEMBAR.ALL.CTA in SASS, which waits for a thread's
// own pending copies too). Measured on q_proj M = 8192: 431 µs with every thread loading, 390 so.
template <bool GATED>
__global__ void __launch_bounds__(CONSUMERS + 32 * PRODUCER_WARPS, 1) nvfp4_wgmma_kernel(const Params p) {
  constexpr int PRODUCERS = 32 * PRODUCER_WARPS;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  // 1024-byte aligned for the swizzle, by an offset from the __shared__ array itself: rounding the
  // generic address instead made the compiler lose the state space, and every shared access of the
  // kernel became a generic LD/ST through L1TEX (measured stalls: 43% of cycles on that scoreboard).
  uint8_t* smem = smem_raw + ((1024u - (smem_address(smem_raw) & 1023u)) & 1023u);
  int expert = 0, row0 = blockIdx.y * BT, rows = min(BT, p.m - row0);
  if (p.tiles) {
    if (int(blockIdx.y) >= p.tile_offsets[p.experts]) return;
    const int4 tile = p.tiles[blockIdx.y];
    expert = tile.x, row0 = tile.y, rows = tile.z;
  }
  const int tid = threadIdx.x;
  int* src_rows = reinterpret_cast<int*>(smem + ROWS_OFFSET);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + BARRIER_OFFSET);  // [STAGES]: the stage's copies landed
  uint64_t* empty = full + STAGES;                                      // [STAGES]: the stage was consumed
  if (tid < BT) src_rows[tid] = tid < rows ? (p.sorted_pairs ? p.sorted_pairs[row0 + tid] / p.top_k : row0 + tid) : -1;
  if (tid < STAGES) {
    barrier_init(&full[tid], PRODUCERS);        // each producer thread's copies
    barrier_init(&empty[tid], CONSUMERS / 32);  // lane 0 of each consumer warp
  }
  __syncthreads();
  const int k_tiles = p.k / BK;
  // Warp-uniform as ptxas can see (a shuffle), so the wgmma below are not serialized.
  const int warpgroup = __shfl_sync(0xffffffffu, tid / 128, 0);

  if (warpgroup == CONSUMERS / 128) {  // the producers
    const int lane = tid - CONSUMERS;
    for (int kt = 0; kt < k_tiles; ++kt) {
      const int slot = kt % STAGES;
      if (kt >= STAGES) barrier_wait(&empty[slot], (kt / STAGES - 1) & 1);
      // Weight rows r = lane + PRODUCERS·i: two 16-byte code chunks and a 4-byte scale word each.
      uint8_t* codes = smem + CODE_OFFSET + slot * CODE_STAGE;
      uint8_t* scales = smem + SCALE_OFFSET + slot * SCALE_STAGE;
#pragma unroll
      for (int i = 0; i < BN / PRODUCERS; ++i) {
        const int r = lane + PRODUCERS * i;
        const int which = GATED ? r / (BN / 2) : 0;
        const int weight_row = GATED ? blockIdx.x * (BN / 2) + r % (BN / 2) : blockIdx.x * BN + r;
        const bool valid = weight_row < p.n;
        const size_t row_index = size_t(expert) * p.n + (valid ? weight_row : 0);
        const uint8_t* code_src = p.codes[which] + row_index * (p.k / 2) + kt * (BK / 2);
        cp_async16(codes + r * 16, code_src, valid ? 16 : 0);
        cp_async16(codes + (BN + r) * 16, code_src + 16, valid ? 16 : 0);
        cp_async4(scales + r * 4, p.scales[which] + row_index * (p.k / 16) + kt * (BK / 16), valid ? 4 : 0);
      }
      // Activation rows t = lane / 8 + (PRODUCERS / 8)·i, chunk lane % 8 of each.
      uint8_t* a = smem + A_OFFSET + slot * A_STAGE;
      const int chunk = lane % 8;
#pragma unroll 8
      for (int i = 0; i < BT * 8 / PRODUCERS; ++i) {
        const int t = lane / 8 + (PRODUCERS / 8) * i, src = src_rows[t];
        cp_async16(a + wgmma::swizzled_offset(t, chunk), p.act + size_t(src >= 0 ? src : 0) * p.k + kt * BK + chunk * 8,
                   src >= 0 ? 16 : 0);
      }
      barrier_arrive_on_copies(&full[slot]);
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    return;
  }

  // Row `tid` of raw stage kt → BF16 row `tid` of B tile `buffer`: eight 16-byte chunks of 8 values.
  auto decode = [&](int kt, int buffer) {
    const int slot = kt % STAGES;
    barrier_wait(&full[slot], (kt / STAGES) & 1);
    const uint8_t* codes = smem + CODE_OFFSET + slot * CODE_STAGE;
    const uint32_t scale_word = *reinterpret_cast<const uint32_t*>(smem + SCALE_OFFSET + slot * SCALE_STAGE + tid * 4);
    uint8_t* b = smem + B_OFFSET + buffer * B_TILE;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint4 words = *reinterpret_cast<const uint4*>(codes + (j * BN + tid) * 16);
      const uint32_t w[4] = {words.x, words.y, words.z, words.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // word i of chunk j: k 32j + 8i …, block scale (32j + 8i) / 16
        const int chunk = 4 * j + i;
        const uint32_t scale = e4m3_scale_bf16x2((scale_word >> (8 * (chunk / 2))) & 0xFF);
        uint32_t pair[4];
        e2m1x8_to_bf16(w[i], pair);
        uint4 v;
        v.x = bf16x2_mul(pair[0], scale), v.y = bf16x2_mul(pair[1], scale);
        v.z = bf16x2_mul(pair[2], scale), v.w = bf16x2_mul(pair[3], scale);
        *reinterpret_cast<uint4*>(b + wgmma::swizzled_offset(tid, chunk)) = v;
      }
    }
  };

  // The BF16 tiles (st.shared) and the activation tiles this thread saw land (cp.async, via `full`)
  // are generic-proxy writes that wgmma reads through the async proxy: a proxy fence, then a barrier.
  decode(0, 0);
  wgmma::fence_shared_for_async();
  consumer_sync();
  float acc[128];  // acc[4j + q]: column block j of the 256 B rows (the m64n256 accumulator)
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.0f;

  for (int kt = 0; kt < k_tiles; ++kt) {
    // No branch around the MMAs (a warpgroup whose 64 rows are all padding multiplies zeros): ptxas
    // serializes wgmma issued on a path it cannot prove warpgroup-uniform.
    const uint8_t* a = smem + A_OFFSET + (kt % STAGES) * A_STAGE + warpgroup * 64 * 128;
    const uint8_t* b = smem + B_OFFSET + (kt % 2) * B_TILE;
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      wgmma::mma_m64n256k16(acc, wgmma::descriptor(a + kk * 32), wgmma::descriptor(b + kk * 32));
    }
    wgmma::commit();
    // Step kt + 1 is decoded while the MMAs of step kt run (its B tile was read by step kt − 1, which
    // every warpgroup finished before the last barrier). The proxy fence (MEMBAR.ALL.CTA in SASS: it
    // waits for whatever the thread has in flight) comes after this thread's MMAs are done; fencing
    // with them in flight measured 4% slower (q_proj M = 8192: 390 against 375 µs).
    if (kt + 1 < k_tiles) decode(kt + 1, (kt + 1) % 2);
    wgmma::wait<0>();
    wgmma::fence_shared_for_async();
    if (tid % 32 == 0) barrier_arrive(&empty[kt % STAGES]);  // stage kt is consumed: refill it
    consumer_sync();
  }
  if (warpgroup * 64 >= rows) return;

  // Epilogue: acc[64h + 4j + q] is sorted row 64·warpgroup + 16·warp + lane/4 + 8·(q/2) and B row
  // 128h + 8j + 2·(lane%4) + q%2.
  const int lane = tid & 31, warp = (tid / 32) % 4;
  const float scale0 = p.global_scales[0] ? p.global_scales[0][expert] : p.scale;
  const float scale1 = GATED ? p.global_scales[1][expert] : 0.0f;
#pragma unroll
  for (int q2 = 0; q2 < 2; ++q2) {
    const int trow = warpgroup * 64 + warp * 16 + lane / 4 + 8 * q2;
    if (trow >= rows) continue;
    const float row_scale = p.row_scales ? p.row_scales[src_rows[trow]] : 1.0f;
    const size_t out_row = size_t(row0 + trow) * p.n;
#pragma unroll
    for (int h = 0; h < (GATED ? 1 : 2); ++h)
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int col = h * 128 + 8 * j + 2 * (lane % 4);
        const int feature = GATED ? blockIdx.x * (BN / 2) + col : blockIdx.x * BN + col;
        float v[2];
#pragma unroll
        for (int q1 = 0; q1 < 2; ++q1) {
          const int i = 4 * j + 2 * q2 + q1;
          if constexpr (GATED) {
            const float gate = acc[i] * scale0 * row_scale, up = acc[64 + i] * scale1 * row_scale;
            v[q1] = gate / (1.0f + expf(-gate)) * up;  // silu(gate) · up, as ref::silu_mul
          } else {
            v[q1] = acc[64 * h + i] * scale0 * row_scale;
          }
        }
        if (feature + 1 < p.n) {
          if (p.out_fp32) *reinterpret_cast<float2*>(static_cast<float*>(p.out) + out_row + feature) = make_float2(v[0], v[1]);
          else *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(p.out) + out_row + feature) =
                   __floats2bfloat162_rn(v[0], v[1]);
        } else if (feature < p.n) {
          if (p.out_fp32) static_cast<float*>(p.out)[out_row + feature] = v[0];
          else static_cast<__nv_bfloat16*>(p.out)[out_row + feature] = __float2bfloat16_rn(v[0]);
        }
      }
  }
}

template <bool GATED>
Status launch(const Params& p, int64_t row_tiles, cudaStream_t stream) {
  if (row_tiles > 65535) return Status::error("wgmma gemm: more than 65,535 tiles of 128 rows (grid limit)");
  auto kernel = nvfp4_wgmma_kernel<GATED>;
  constexpr int threads = CONSUMERS + 32 * PRODUCER_WARPS;
  NIB_RETURN_IF_ERROR(cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES),
                                  "wgmma gemm: shared memory"));
  const int rows_per_cta = GATED ? BN / 2 : BN;
  const dim3 grid(unsigned((p.n + rows_per_cta - 1) / rows_per_cta), unsigned(row_tiles));
  kernel<<<grid, threads, SMEM_BYTES, stream>>>(p);
  return cuda_status(cudaGetLastError(), GATED ? "wgmma gate_up launch" : "wgmma gemm launch");
}

Status check_weight(const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t cols) {
  if (!packed || !scales) return Status::error("wgmma gemm: null weight pointer");
  if (!wgmma_supported(rows, cols) || rows > INT32_MAX || cols > INT32_MAX)
    return Status::error("wgmma gemm: weight [" + std::to_string(rows) + ", " + std::to_string(cols) +
                         "] needs in_features a multiple of 64 and even out_features");
  if (reinterpret_cast<uintptr_t>(packed) % 16 || reinterpret_cast<uintptr_t>(scales) % 4)
    return Status::error("wgmma gemm: weight is not 16-byte aligned");
  return Status::ok();
}

Status grouped(const GroupedGemmArgs& a, const DeviceNvfp4Experts& w0, const DeviceNvfp4Experts* w1, cudaStream_t stream) {
  NIB_RETURN_IF_ERROR(check_weight(w0.packed, w0.block_scales, w0.rows, w0.cols));
  if (w1 && (w1->rows != w0.rows || w1->cols != w0.cols || w1->experts != w0.experts))
    return Status::error("wgmma gate_up: gate and up weights differ in shape");
  if (!a.act || !a.tile_offsets || !a.tiles || !a.out || !w0.global_scales || (w1 && !w1->global_scales))
    return Status::error("wgmma moe gemm: null pointer");
  if (reinterpret_cast<uintptr_t>(a.act) % 16) return Status::error("wgmma moe gemm: activations not 16-byte aligned");
  if (a.tile_rows != BT)
    return Status::error("wgmma moe gemm: tile_rows " + std::to_string(a.tile_rows) + ", needs " + std::to_string(BT));
  if (a.pairs == 0) return Status::ok();
  Params p{};
  p.codes[0] = w0.packed, p.scales[0] = w0.block_scales, p.global_scales[0] = w0.global_scales;
  if (w1) p.codes[1] = w1->packed, p.scales[1] = w1->block_scales, p.global_scales[1] = w1->global_scales;
  p.n = int(w0.rows), p.k = int(w0.cols);
  p.act = a.act, p.sorted_pairs = a.sorted_pairs, p.top_k = int(a.top_k), p.row_scales = a.row_scales;
  p.tile_offsets = a.tile_offsets, p.tiles = a.tiles, p.experts = int(w0.experts);
  p.out = a.out, p.out_fp32 = a.out_fp32;
  const int64_t row_tiles = max_expert_tiles(a.pairs, p.experts, BT);
  return w1 ? launch<true>(p, row_tiles, stream) : launch<false>(p, row_tiles, stream);
}

}  // namespace

bool wgmma_supported(int64_t rows, int64_t cols) { return cols >= BK && cols % BK == 0 && rows >= 2 && rows % 2 == 0; }

// NIBBLE_WGMMA_SS=1: the shared-memory-operand kernels of this file instead of nvfp4_wgmma_rs.cu's.
static bool shared_memory_kernels() {
  static const bool ss = std::getenv("NIBBLE_WGMMA_SS") != nullptr;
  return ss;
}

int wgmma_tile_rows(int64_t pairs, int64_t experts) {
  return shared_memory_kernels() ? BT : wgmma_rs_tile_rows(pairs, experts);
}

Status wgmma_moe_gate_up(const GroupedGemmArgs& a, const DeviceNvfp4Experts& gate, const DeviceNvfp4Experts& up,
                         cudaStream_t stream) {
  if (!shared_memory_kernels()) return wgmma_rs_moe_gate_up(a, gate, up, stream);
  return grouped(a, gate, &up, stream);
}

Status wgmma_moe_down(const GroupedGemmArgs& a, const DeviceNvfp4Experts& down, cudaStream_t stream) {
  if (!shared_memory_kernels()) return wgmma_rs_moe_down(a, down, stream);
  return grouped(a, down, nullptr, stream);
}

Status wgmma_linear(const uint16_t* x, int64_t M, const DeviceNvfp4Weight& w, float* y, const float* row_scales,
                    cudaStream_t stream) {
  if (!shared_memory_kernels()) return wgmma_rs_linear(x, M, w, y, row_scales, stream);
  NIB_RETURN_IF_ERROR(check_weight(w.packed, w.block_scales, w.rows, w.cols));
  if (!x || !y) return Status::error("wgmma linear: null activation or output");
  if (reinterpret_cast<uintptr_t>(x) % 16) return Status::error("wgmma linear: x not 16-byte aligned");
  if (M <= 0 || M > INT32_MAX) return Status::error("wgmma linear: M must be in [1, 2^31)");
  Params p{};
  p.codes[0] = w.packed, p.scales[0] = w.block_scales, p.scale = w.weight_scale_2;
  p.n = int(w.rows), p.k = int(w.cols), p.m = int(M);
  p.act = x, p.top_k = 1, p.row_scales = row_scales;
  p.out = y, p.out_fp32 = true;
  return launch<false>(p, (M + BT - 1) / BT, stream);
}

}  // namespace nibble::cuda

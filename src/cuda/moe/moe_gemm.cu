// Grouped NVFP4 × BF16 GEMM with mma.sync m16n8k16 (fp32 accumulate). The weight tile is the MMA's
// A operand (16 output features per m-tile) and tokens are its B operand (8 per n-tile), so a tile
// of one token wastes little at decode. Per k-step (64–256 wide) a CTA stages FP4 codes, scale codes and
// gathered BF16 activation rows in shared memory (cp.async, multi-stage), and each warp decodes its
// A fragments in registers: eight repacked E2M1 codes → BF16 in shifts and masks, × the block scale —
// exact, since an E2M1 · E4M3 product has ≤ 6 significant bits. Within each 32-wide k-chunk,
// thread c of a quad takes code word c for both operands (MMA k order is free as long as A and B
// agree), so its codes are one 32-bit word and its activations one 16-byte load: physical k 8c … 8c+7,
// or with k-steps of 128 and 256 (in_features a multiple of 128: the weights in line order,
// nvfp4_layout.h) the chunk line_order_chunk of that word. Small batches split each k-step's chunks
// over several warps (WARPS_K) for more loads in flight.
#include "cuda/moe/moe_gemm.cuh"

#include <cuda_bf16.h>

#include <algorithm>

#include "cuda/common/async_copy.cuh"
#include "cuda/common/check.cuh"
#include "cuda/moe/moe_grouping.cuh"
#include "cuda/nvfp4/nvfp4_fragments.cuh"
#include "cuda/nvfp4/nvfp4_layout.h"

namespace nibble::cuda {
namespace {

// BK: k per pipeline stage, J = BK/32 chunks of 32; each weight row brings BK/2 contiguous code bytes
// (a longer k-step reads longer runs of each row, which HBM serves better) and BK/16 scales.
template <int WARPS_M_, int WARPS_N_, int WARPS_K_, int WM_, int WN_, int BK_, int STAGES_>
struct Config {
  static constexpr int WARPS_M = WARPS_M_, WARPS_N = WARPS_N_, WARPS_K = WARPS_K_, WM = WM_, WN = WN_, BK = BK_,
                       STAGES = STAGES_;
  static constexpr int J = BK / 32;
  static constexpr bool LINE = BK >= 128;  // whole 128-blocks: the weights are in line order
  static_assert(J == 2 || J == 4 || J == 8, "k-step of 64, 128 or 256");
  static_assert(J % WARPS_K == 0, "each k-warp takes every WARPS_K-th chunk");
  static constexpr int BM = WARPS_M * WM * 16;  // weight rows per CTA
  static constexpr int BT = WARPS_N * WN * 8;   // sorted rows per CTA
  static constexpr int THREADS = WARPS_M * WARPS_N * WARPS_K * 32;
  static constexpr int CODE_ROW = BK / 2, SCALE_ROW = BK / 16, ACT_ROW = BK * 2;  // bytes per row per stage
  static constexpr int CODE_BYTES = BM * CODE_ROW;
  static constexpr int SCALE_BYTES = BM * SCALE_ROW;
  static constexpr int ACT_BYTES = BT * ACT_ROW;
  // Code chunk j of shared-memory row r sits at chunk j ^ f(r): a warp's fragment reads (rows g, g+8;
  // the same j) then fall in distinct banks for every row stride.
  static constexpr int SWIZZLE_SHIFT = J == 8 ? 0 : J == 4 ? 1 : 2;
  __device__ static int code_offset(int srow, int j) {
    return srow * CODE_ROW + ((j ^ ((srow >> SWIZZLE_SHIFT) & (J - 1))) * 16);
  }
  // Activation chunk (16 B) q of row t: the two rows a quarter-warp reads differ in bit 2. In line
  // order a quarter-warp's chunks are 4c + r (c = 0 … 3) of two rows, placed apart by bit 3 of q
  // into bit 1 and by the row into bit 0: eight distinct 16-byte bank groups.
  __device__ static int act_offset(int trow, int q) {
    if constexpr (LINE) return trow * ACT_ROW + ((q ^ (((q >> 3) & 1) << 1) ^ (trow & 1)) * 16);
    return trow * ACT_ROW + ((q ^ ((trow & 1) << 2)) * 16);
  }
  // The scale code (its byte in a row's stage) and activation chunk of code word c of 32-wide chunk j.
  __device__ static int scale_byte(int j, int c) {
    if constexpr (LINE) return 8 * (j >> 2) + line_order_chunk(4 * (j & 3) + c) / 2;
    return 2 * j + (c >> 1);
  }
  __device__ static int act_chunk(int j, int c) {
    if constexpr (LINE) return 16 * (j >> 2) + line_order_chunk(4 * (j & 3) + c);
    return 4 * j + c;
  }
  static constexpr int STAGE_BYTES = CODE_BYTES + SCALE_BYTES + ACT_BYTES;
  static constexpr int SMEM_BYTES = STAGES * STAGE_BYTES + BT * int(sizeof(int));
};
// Chosen by the average rows per expert: decode and small batches (≤ 16: memory-bound, k split over 4
// warps for loads in flight), mid-size batches (≤ 48), prefill (compute-bound).
using SmallConfig = Config<2, 1, 4, 2, 2, 256, 4>;
using MediumConfig = Config<2, 2, 2, 2, 2, 128, 4>;
using LargeConfig = Config<4, 2, 1, 2, 8, 128, 3>;
using LargeConfigK64 = Config<4, 2, 1, 2, 8, 64, 4>;  // the same tiles for in_features not a multiple of 128

struct KernelParams {
  const uint8_t* codes[2];  // down: [0] only; gated: gate, up
  const uint8_t* scales[2];
  const float* global_scales[2];
  int n;  // weight rows per expert (per projection)
  int k;
  const uint16_t* act;
  const int32_t* sorted_pairs;
  int top_k;
  const float* row_scales;
  const int32_t* expert_offsets;
  const int32_t* tile_offsets;
  const int4* tiles;
  int experts;
  void* out;
  bool out_fp32;
};

// The CTA's tile: its expert, first sorted row and number of rows (≤ BT).
struct TileInfo {
  int expert, row0, rows;
};

__device__ __forceinline__ bool find_tile(const KernelParams& p, TileInfo& info) {
  const int tile = blockIdx.y;
  if (tile >= p.tile_offsets[p.experts]) return false;
  const int4 t = p.tiles[tile];
  info.expert = t.x, info.row0 = t.y, info.rows = t.z;
  return true;
}

// Weight row (of projection `which`) held in shared-memory row `srow`, or −1 beyond the weight.
template <class C, bool GATED>
__device__ __forceinline__ int weight_row(int srow, int n, int& which) {
  if (!GATED) {
    which = 0;
    const int row = blockIdx.x * C::BM + srow;
    return row < n ? row : -1;
  }
  // Each warp's first WM/2 m-tiles are gate rows, the next WM/2 the up rows of the same features.
  const int tile = srow / 16, warp_m = tile / C::WM, t = tile % C::WM;
  which = t < C::WM / 2 ? 0 : 1;
  const int row = blockIdx.x * (C::BM / 2) + warp_m * (C::WM / 2) * 16 + (t % (C::WM / 2)) * 16 + srow % 16;
  return row < n ? row : -1;
}

// This thread's share of a stage's cp.async copies, addressed once per CTA (only the k offset moves):
// FP4 code chunks (16 B, swizzled so a warp's fragment reads hit distinct banks), scale words, and
// activation chunks of the gathered rows. A destination of −1 means the thread has no such copy;
// rows past the weight or the tile are zero-filled (0 bytes read).
template <class C, bool GATED>
struct StageLoader {
  static constexpr int CODE_CHUNKS = (C::BM * C::J + C::THREADS - 1) / C::THREADS;
  static constexpr int SCALE_ROWS = (C::BM + C::THREADS - 1) / C::THREADS;
  static constexpr int ACT_CHUNKS = (C::BT * C::J * 4 + C::THREADS - 1) / C::THREADS;
  const uint8_t* code_src[CODE_CHUNKS];
  int code_dst[CODE_CHUNKS], code_bytes[CODE_CHUNKS];
  const uint8_t* scale_src[SCALE_ROWS];
  int scale_dst[SCALE_ROWS], scale_bytes[SCALE_ROWS];
  const uint16_t* act_src[ACT_CHUNKS];
  int act_dst[ACT_CHUNKS], act_bytes[ACT_CHUNKS];

  __device__ StageLoader(const KernelParams& p, int expert, const int* src_rows, int tid) {
    const size_t code_row_bytes = p.k / 2, scale_row_bytes = p.k / 16;
#pragma unroll
    for (int i = 0; i < CODE_CHUNKS; ++i) {
      const int c = tid + i * C::THREADS, srow = c / C::J, j = c % C::J;
      int which = 0;
      const int row = c < C::BM * C::J ? weight_row<C, GATED>(srow, p.n, which) : -1;
      code_src[i] = (which ? p.codes[1] : p.codes[0]) + (size_t(expert) * p.n + max(row, 0)) * code_row_bytes + j * 16;
      code_dst[i] = c < C::BM * C::J ? C::code_offset(srow, j) : -1;
      code_bytes[i] = row >= 0 ? 16 : 0;
    }
#pragma unroll
    for (int i = 0; i < SCALE_ROWS; ++i) {
      const int srow = tid + i * C::THREADS;
      int which = 0;
      const int row = srow < C::BM ? weight_row<C, GATED>(srow, p.n, which) : -1;
      scale_src[i] = (which ? p.scales[1] : p.scales[0]) + (size_t(expert) * p.n + max(row, 0)) * scale_row_bytes;
      scale_dst[i] = srow < C::BM ? C::CODE_BYTES + srow * C::SCALE_ROW : -1;
      scale_bytes[i] = row >= 0 ? C::SCALE_ROW : 0;
    }
#pragma unroll
    for (int i = 0; i < ACT_CHUNKS; ++i) {
      const int c = tid + i * C::THREADS, trow = c / (C::J * 4), chunk = c % (C::J * 4);
      const int src_row = c < C::BT * C::J * 4 ? src_rows[trow] : -1;
      act_src[i] = p.act + size_t(max(src_row, 0)) * p.k + chunk * 8;
      act_dst[i] = c < C::BT * C::J * 4 ? C::CODE_BYTES + C::SCALE_BYTES + C::act_offset(trow, chunk) : -1;
      act_bytes[i] = src_row >= 0 ? 16 : 0;
    }
  }

  __device__ __forceinline__ void load(uint8_t* stage, int kt) const {
#pragma unroll
    for (int i = 0; i < CODE_CHUNKS; ++i)
      if (code_dst[i] >= 0) cp_async<16>(stage + code_dst[i], code_src[i] + kt * C::CODE_ROW, code_bytes[i]);
#pragma unroll
    for (int i = 0; i < SCALE_ROWS; ++i)
      if (scale_dst[i] >= 0)
        cp_async<C::SCALE_ROW>(stage + scale_dst[i], scale_src[i] + kt * C::SCALE_ROW, scale_bytes[i]);
#pragma unroll
    for (int i = 0; i < ACT_CHUNKS; ++i)
      if (act_dst[i] >= 0) cp_async<16>(stage + act_dst[i], act_src[i] + kt * C::BK, act_bytes[i]);
  }
};

template <class C, bool GATED>
__global__ void __launch_bounds__(C::THREADS) moe_gemm_kernel(const KernelParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  TileInfo tile;
  if (!find_tile(p, tile)) return;
  int* src_rows = reinterpret_cast<int*>(smem + C::STAGES * C::STAGE_BYTES);
  const int tid = threadIdx.x;
  for (int t = tid; t < C::BT; t += C::THREADS) {
    const int r = tile.row0 + t;
    src_rows[t] = t < tile.rows ? (p.sorted_pairs ? p.sorted_pairs[r] / p.top_k : r) : -1;
  }
  __syncthreads();
  const StageLoader<C, GATED> loader(p, tile.expert, src_rows, tid);

  const int k_tiles = p.k / C::BK;  // dispatch picks a config whose BK divides in_features
#pragma unroll
  for (int s = 0; s < C::STAGES - 1; ++s) {
    if (s < k_tiles) loader.load(smem + s * C::STAGE_BYTES, s);
    cp_async_commit();
  }

  const int lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp % C::WARPS_M, warp_n = (warp / C::WARPS_M) % C::WARPS_N;
  const int warp_k = warp / (C::WARPS_M * C::WARPS_N);
  const int g = lane >> 2, c = lane & 3;
  float acc[C::WM][C::WN][4] = {};

  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<C::STAGES - 2>();
    __syncthreads();
    const int next = kt + C::STAGES - 1;
    if (next < k_tiles) loader.load(smem + (next % C::STAGES) * C::STAGE_BYTES, next);
    cp_async_commit();

    const uint8_t* stage = smem + (kt % C::STAGES) * C::STAGE_BYTES;
    const uint8_t* codes = stage;
    const uint8_t* scales = stage + C::CODE_BYTES;
    const uint8_t* act = scales + C::SCALE_BYTES;
#pragma unroll
    for (int j = 0; j < C::J; ++j) {  // 32-wide k-chunks; k-warp w takes those with j % WARPS_K == w
      if (C::WARPS_K > 1 && j % C::WARPS_K != warp_k) continue;
      uint32_t a[C::WM][2][4];  // [m-tile][k16 step][fragment register]
#pragma unroll
      for (int t = 0; t < C::WM; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // rows g and g + 8
          const int srow = (warp_m * C::WM + t) * 16 + g + 8 * h;
          const uint32_t word = *reinterpret_cast<const uint32_t*>(codes + C::code_offset(srow, j) + 4 * c);
          const uint32_t scale = block_scale_bf16x2(scales[srow * C::SCALE_ROW + C::scale_byte(j, c)], 0);
          uint32_t pair[4];
          decode_code_word(word, pair);
#pragma unroll
          for (int b = 0; b < 4; ++b)  // pair b is physical k 8c + 2b, +1: step b/2, first or second k half
            a[t][b >> 1][(b & 1) * 2 + h] = bf16x2_mul(pair[b], scale);
        }
#pragma unroll
      for (int u = 0; u < C::WN; ++u) {
        const int trow = (warp_n * C::WN + u) * 8 + g;
        const uint4 v = *reinterpret_cast<const uint4*>(act + C::act_offset(trow, C::act_chunk(j, c)));
#pragma unroll
        for (int t = 0; t < C::WM; ++t) {
          mma_bf16(acc[t][u], a[t][0], v.x, v.y);
          mma_bf16(acc[t][u], a[t][1], v.z, v.w);
        }
      }
    }
  }
  cp_async_wait<0>();

  if constexpr (C::WARPS_K > 1) {  // k-warps 1.. hand their sums to k-warp 0, which adds them in order
    __syncthreads();               // every warp is past the pipeline: its shared memory is free
    float* partial = reinterpret_cast<float*>(smem);
    constexpr int SLOTS = C::WARPS_M * C::WARPS_N * 32, VALUES = C::WM * C::WN * 4;
    static_assert((C::WARPS_K - 1) * SLOTS * VALUES * 4 <= C::STAGES * C::STAGE_BYTES, "partials fit");
    const int slot = (warp % (C::WARPS_M * C::WARPS_N)) * 32 + lane;
    if (warp_k > 0)
#pragma unroll
      for (int t = 0; t < C::WM; ++t)
#pragma unroll
        for (int u = 0; u < C::WN; ++u)
#pragma unroll
          for (int q = 0; q < 4; ++q)
            partial[((warp_k - 1) * VALUES + (t * C::WN + u) * 4 + q) * SLOTS + slot] = acc[t][u][q];
    __syncthreads();
    if (warp_k > 0) return;
    for (int w = 0; w < C::WARPS_K - 1; ++w)
#pragma unroll
      for (int t = 0; t < C::WM; ++t)
#pragma unroll
        for (int u = 0; u < C::WN; ++u)
#pragma unroll
          for (int q = 0; q < 4; ++q) acc[t][u][q] += partial[(w * VALUES + (t * C::WN + u) * 4 + q) * SLOTS + slot];
  }

  // Epilogue: accumulator (t, u, q) is weight row g + 8·(q/2) of m-tile t, sorted row 2c + q%2 of n-tile u.
  // The decoded weights are × 2⁻⁸ (nvfp4_layout.h): the epilogue's factor restores them, exactly.
  const float scale0 = p.global_scales[0][tile.expert] * WEIGHT_DECODE_EPILOGUE;
  const float scale1 = GATED ? p.global_scales[1][tile.expert] * WEIGHT_DECODE_EPILOGUE : 0.0f;
  constexpr int OUT_TILES = GATED ? C::WM / 2 : C::WM;
#pragma unroll
  for (int u = 0; u < C::WN; ++u)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int trow = (warp_n * C::WN + u) * 8 + 2 * c + (q & 1);
      if (trow >= tile.rows) continue;
      const float row_scale = p.row_scales ? p.row_scales[src_rows[trow]] : 1.0f;
      const size_t out_row = size_t(tile.row0 + trow) * p.n;
#pragma unroll
      for (int t = 0; t < OUT_TILES; ++t) {
        float value;
        int feature;
        if constexpr (GATED) {
          const float gate = acc[t][u][q] * scale0 * row_scale;
          const float up = acc[t + C::WM / 2][u][q] * scale1 * row_scale;
          value = gate / (1.0f + expf(-gate)) * up;  // silu(gate) · up, as ref::silu_mul
          feature = blockIdx.x * (C::BM / 2) + warp_m * (C::WM / 2) * 16 + t * 16 + g + 8 * (q >> 1);
        } else {
          value = acc[t][u][q] * scale0 * row_scale;
          feature = blockIdx.x * C::BM + (warp_m * C::WM + t) * 16 + g + 8 * (q >> 1);
        }
        if (feature >= p.n) continue;
        if (p.out_fp32)
          static_cast<float*>(p.out)[out_row + feature] = value;
        else
          static_cast<__nv_bfloat16*>(p.out)[out_row + feature] = __float2bfloat16_rn(value);
      }
    }
}

template <class C, bool GATED>
Status launch(const KernelParams& p, int64_t pairs, cudaStream_t stream) {
  auto kernel = moe_gemm_kernel<C, GATED>;
  NIB_RETURN_IF_ERROR(
      cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM_BYTES),
                  "moe_gemm: shared memory"));
  const int rows_per_cta = GATED ? C::BM / 2 : C::BM;
  const int64_t tiles = max_expert_tiles(pairs, p.experts, C::BT);
  const dim3 grid(unsigned((p.n + rows_per_cta - 1) / rows_per_cta), unsigned(tiles));
  kernel<<<grid, C::THREADS, C::SMEM_BYTES, stream>>>(p);
  return cuda_status(cudaGetLastError(), GATED ? "moe_gemm_gate_up launch" : "moe_gemm_down launch");
}

template <bool GATED>
Status dispatch(const KernelParams& p, int64_t pairs, int tile_rows, cudaStream_t stream) {
  if (tile_rows == SmallConfig::BT && p.k % SmallConfig::BK == 0) return launch<SmallConfig, GATED>(p, pairs, stream);
  if (tile_rows == MediumConfig::BT && p.k % MediumConfig::BK == 0)
    return launch<MediumConfig, GATED>(p, pairs, stream);
  if (tile_rows == LargeConfig::BT && p.k % LargeConfig::BK == 0) return launch<LargeConfig, GATED>(p, pairs, stream);
  if (tile_rows == LargeConfig::BT && p.k % LargeConfigK64::BK == 0)
    return launch<LargeConfigK64, GATED>(p, pairs, stream);
  return Status::error("moe_gemm: tile_rows " + std::to_string(tile_rows) + " with in_features " + std::to_string(p.k) +
                       " is not a tiling moe_tile_rows chooses");
}

Status check_experts(const DeviceNvfp4Experts& w, const char* what) {
  if (!w.packed || !w.block_scales || !w.global_scales)
    return Status::error(std::string("moe_gemm: null ") + what + " weight pointer");
  if (w.experts < 1 || w.rows < 1 || w.cols < 64 || w.cols % 64 != 0 || w.rows > INT32_MAX || w.cols > INT32_MAX)
    return Status::error(std::string("moe_gemm: ") + what + " weight [" + std::to_string(w.experts) + ", " +
                         std::to_string(w.rows) + ", " + std::to_string(w.cols) +
                         "] needs in_features a positive multiple of 64 (use the cublas backend)");
  if (reinterpret_cast<uintptr_t>(w.packed) % 16 || reinterpret_cast<uintptr_t>(w.block_scales) % 4)
    return Status::error(std::string("moe_gemm: ") + what + " weight is not 16-byte aligned");
  return Status::ok();
}

Status check_args(const GroupedGemmArgs& a) {
  if (!a.act || !a.expert_offsets || !a.tile_offsets || !a.tiles || !a.out)
    return Status::error("moe_gemm: null pointer");
  if (reinterpret_cast<uintptr_t>(a.act) % 16) return Status::error("moe_gemm: activations not 16-byte aligned");
  if (a.pairs < 0 || a.pairs > INT32_MAX || a.top_k < 1) return Status::error("moe_gemm: bad pair count");
  return Status::ok();
}

KernelParams params(const GroupedGemmArgs& a, const DeviceNvfp4Experts& w0, const DeviceNvfp4Experts* w1) {
  KernelParams p{};
  p.codes[0] = w0.packed, p.scales[0] = w0.block_scales, p.global_scales[0] = w0.global_scales;
  if (w1) p.codes[1] = w1->packed, p.scales[1] = w1->block_scales, p.global_scales[1] = w1->global_scales;
  p.n = int(w0.rows), p.k = int(w0.cols);
  p.act = a.act, p.sorted_pairs = a.sorted_pairs, p.top_k = int(a.top_k), p.row_scales = a.row_scales;
  p.expert_offsets = a.expert_offsets, p.tile_offsets = a.tile_offsets, p.tiles = a.tiles, p.experts = int(w0.experts);
  p.out = a.out, p.out_fp32 = a.out_fp32;
  return p;
}

}  // namespace

int moe_tile_rows(int64_t pairs, int64_t experts, int64_t hidden, int64_t intermediate) {
  const int64_t average = (pairs + experts - 1) / std::max<int64_t>(experts, 1);
  // Both GEMMs share the tiling: a config serves only if its k-step divides both in_features.
  auto fits = [&](int bk) { return hidden % bk == 0 && intermediate % bk == 0; };
  if (average <= 16 && fits(SmallConfig::BK)) return SmallConfig::BT;
  if (average <= 48 && fits(MediumConfig::BK)) return MediumConfig::BT;
  return LargeConfig::BT;
}

Status moe_gemm_gate_up(const GroupedGemmArgs& a, const DeviceNvfp4Experts& gate, const DeviceNvfp4Experts& up,
                        cudaStream_t stream) {
  NIB_RETURN_IF_ERROR(check_experts(gate, "gate"));
  NIB_RETURN_IF_ERROR(check_experts(up, "up"));
  NIB_RETURN_IF_ERROR(check_args(a));
  if (up.experts != gate.experts || up.rows != gate.rows || up.cols != gate.cols)
    return Status::error("moe_gemm_gate_up: gate and up weights differ in shape");
  if (a.pairs == 0) return Status::ok();
  return dispatch<true>(params(a, gate, &up), a.pairs, a.tile_rows, stream);
}

Status moe_gemm_down(const GroupedGemmArgs& a, const DeviceNvfp4Experts& down, cudaStream_t stream) {
  NIB_RETURN_IF_ERROR(check_experts(down, "down"));
  NIB_RETURN_IF_ERROR(check_args(a));
  if (a.sorted_pairs) return Status::error("moe_gemm_down: reads the sorted rows directly (sorted_pairs must be null)");
  if (a.pairs == 0) return Status::ok();
  return dispatch<false>(params(a, down, nullptr), a.pairs, a.tile_rows, stream);
}

}  // namespace nibble::cuda

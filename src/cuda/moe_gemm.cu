// Grouped NVFP4 × BF16 GEMM with mma.sync m16n8k16 (fp32 accumulate). The weight tile is the MMA's
// A operand (16 output features per m-tile) and tokens are its B operand (8 per n-tile), so a tile
// of one token wastes little at decode. Per 64-wide k-step a CTA stages FP4 codes, E4M3 scales and
// gathered BF16 activation rows in shared memory (cp.async, multi-stage), and each warp decodes its
// A fragments in registers: E2M1 nibble → BF16 bits, × 2¹²⁶, × the block scale — exact, since an
// E2M1 · E4M3 product has ≤ 6 significant bits. Within each 32-wide k-chunk, thread c of a quad
// takes physical k 8c…8c+7 for both operands (MMA k order is free as long as A and B agree), so its
// codes are one 32-bit word and its activations one 16-byte load.
#include "cuda/moe_gemm.cuh"

#include <cuda_bf16.h>

#include <algorithm>

#include "cuda/check.cuh"

namespace nibble::cuda {
namespace {

constexpr int BK = 64;  // k per pipeline stage: 32 code bytes and 4 scales per weight row

template <int WARPS_M_, int WARPS_N_, int WM_, int WN_, int STAGES_>
struct Config {
  static constexpr int WARPS_M = WARPS_M_, WARPS_N = WARPS_N_, WM = WM_, WN = WN_, STAGES = STAGES_;
  static constexpr int BM = WARPS_M * WM * 16;  // weight rows per CTA
  static constexpr int BT = WARPS_N * WN * 8;   // sorted rows per CTA
  static constexpr int THREADS = WARPS_M * WARPS_N * 32;
  static constexpr int CODE_BYTES = BM * BK / 2;
  static constexpr int SCALE_BYTES = BM * BK / 16;
  static constexpr int ACT_BYTES = BT * BK * 2;
  static constexpr int STAGE_BYTES = CODE_BYTES + SCALE_BYTES + ACT_BYTES;
  static constexpr int SMEM_BYTES = STAGES * STAGE_BYTES + BT * int(sizeof(int));
};
// Chosen by the average rows per expert: decode (≤ 8), small batches (≤ 48), prefill.
using SmallConfig = Config<2, 1, 2, 1, 8>;
using MediumConfig = Config<2, 2, 2, 2, 6>;
using LargeConfig = Config<4, 2, 2, 8, 4>;

struct KernelParams {
  const uint8_t* codes[2];   // down: [0] only; gated: gate, up
  const uint8_t* scales[2];
  const float* global_scales[2];
  int n;                     // weight rows per expert (per projection)
  int k;
  const uint16_t* act;
  const int32_t* sorted_pairs;
  int top_k;
  const float* row_scales;
  const int32_t* expert_offsets;
  const int32_t* tile_offsets;
  int experts;
  void* out;
  bool out_fp32;
};

__device__ __forceinline__ void cp_async(void* smem, const void* gmem, int bytes_valid, int size) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if (size == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes_valid));
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes_valid));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  const __nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&a),
                                   *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}

constexpr uint32_t BF16X2_2POW126 = 0x7E807E80u;  // 2¹²⁶ in both halves
constexpr uint32_t BF16X2_2POW120 = 0x7B807B80u;  // 2¹²⁰ in both halves

// Two E2M1 codes (low nibble first) → BF16 pair of their values times 2⁻¹²⁶: the magnitude bits
// e1 e0 m become BF16 exponent bits 1..0 and the top mantissa bit (e = 0: a BF16 subnormal, m·2⁻¹²⁷).
__device__ __forceinline__ uint32_t e2m1x2_bits(uint32_t byte) {
  return ((byte & 0x7u) << 6) | ((byte & 0x8u) << 12) | ((byte & 0x70u) << 18) | ((byte & 0x80u) << 24);
}

// An E4M3 scale (non-negative) → BF16 pair: its bits eeee mmm placed at BF16 bits 10..4 give the
// value times 2⁻¹²⁰ (subnormals included), then × 2¹²⁰, exact.
__device__ __forceinline__ uint32_t e4m3_scale_bf16x2(uint32_t byte) {
  const uint32_t bits = (byte & 0x7Fu) << 4;
  return bf16x2_mul(bits | bits << 16, BF16X2_2POW120);
}

// Source row of each of the CTA's sorted rows (−1 past the tile), the expert, and the tile's first row.
struct TileInfo {
  int expert, row0, rows;
};

template <class C>
__device__ __forceinline__ bool find_tile(const KernelParams& p, TileInfo& info) {
  const int tile = blockIdx.y;
  if (tile >= p.tile_offsets[p.experts]) return false;
  int lo = 0, hi = p.experts;  // tile_offsets[lo] <= tile < tile_offsets[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (p.tile_offsets[mid] <= tile) lo = mid;
    else hi = mid;
  }
  info.expert = lo;
  info.row0 = p.expert_offsets[lo] + (tile - p.tile_offsets[lo]) * C::BT;
  info.rows = min(C::BT, p.expert_offsets[lo + 1] - info.row0);
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

template <class C, bool GATED>
__device__ __forceinline__ void load_stage(const KernelParams& p, int expert, const int* src_rows, uint8_t* stage,
                                           int kt, int tid) {
  uint8_t* codes = stage;
  uint8_t* scales = stage + C::CODE_BYTES;
  uint8_t* act = scales + C::SCALE_BYTES;
  const size_t code_row_bytes = p.k / 2, scale_row_bytes = p.k / 16;
  for (int c = tid; c < C::BM * 2; c += C::THREADS) {
    const int srow = c >> 1, j = c & 1;
    int which;
    const int row = weight_row<C, GATED>(srow, p.n, which);
    const uint8_t* src = (which ? p.codes[1] : p.codes[0]) + (size_t(expert) * p.n + max(row, 0)) * code_row_bytes + kt * 32 + j * 16;
    cp_async(codes + srow * 32 + ((j ^ ((srow >> 2) & 1)) * 16), src, row >= 0 ? 16 : 0, 16);
  }
  for (int srow = tid; srow < C::BM; srow += C::THREADS) {
    int which;
    const int row = weight_row<C, GATED>(srow, p.n, which);
    const uint8_t* src = (which ? p.scales[1] : p.scales[0]) + (size_t(expert) * p.n + max(row, 0)) * scale_row_bytes + kt * 4;
    cp_async(scales + srow * 4, src, row >= 0 ? 4 : 0, 4);
  }
  for (int c = tid; c < C::BT * 8; c += C::THREADS) {
    const int trow = c >> 3, chunk = c & 7;
    const int src_row = src_rows[trow];
    const uint16_t* src = p.act + size_t(max(src_row, 0)) * p.k + kt * BK + chunk * 8;
    cp_async(act + trow * 128 + ((chunk ^ ((trow & 1) << 2)) * 16), src, src_row >= 0 ? 16 : 0, 16);
  }
}

template <class C, bool GATED>
__global__ void __launch_bounds__(C::THREADS) moe_gemm_kernel(const KernelParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  TileInfo tile;
  if (!find_tile<C>(p, tile)) return;
  int* src_rows = reinterpret_cast<int*>(smem + C::STAGES * C::STAGE_BYTES);
  const int tid = threadIdx.x;
  for (int t = tid; t < C::BT; t += C::THREADS) {
    const int r = tile.row0 + t;
    src_rows[t] = t < tile.rows ? (p.sorted_pairs ? p.sorted_pairs[r] / p.top_k : r) : -1;
  }
  __syncthreads();

  const int k_tiles = p.k / BK;
#pragma unroll
  for (int s = 0; s < C::STAGES - 1; ++s) {
    if (s < k_tiles) load_stage<C, GATED>(p, tile.expert, src_rows, smem + s * C::STAGE_BYTES, s, tid);
    cp_async_commit();
  }

  const int lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp % C::WARPS_M, warp_n = warp / C::WARPS_M;
  const int g = lane >> 2, c = lane & 3;
  float acc[C::WM][C::WN][4] = {};

  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<C::STAGES - 2>();
    __syncthreads();
    const int next = kt + C::STAGES - 1;
    if (next < k_tiles)
      load_stage<C, GATED>(p, tile.expert, src_rows, smem + (next % C::STAGES) * C::STAGE_BYTES, next, tid);
    cp_async_commit();

    const uint8_t* stage = smem + (kt % C::STAGES) * C::STAGE_BYTES;
    const uint8_t* codes = stage;
    const uint8_t* scales = stage + C::CODE_BYTES;
    const uint8_t* act = scales + C::SCALE_BYTES;
#pragma unroll
    for (int j = 0; j < 2; ++j) {  // 32-wide k-chunks
      uint32_t a[C::WM][2][4];     // [m-tile][k16 step][fragment register]
#pragma unroll
      for (int t = 0; t < C::WM; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // rows g and g + 8
          const int srow = (warp_m * C::WM + t) * 16 + g + 8 * h;
          const uint32_t word =
              *reinterpret_cast<const uint32_t*>(codes + srow * 32 + ((j ^ ((srow >> 2) & 1)) * 16) + 4 * c);
          const uint32_t scale = e4m3_scale_bf16x2(scales[srow * 4 + 2 * j + (c >> 1)]);
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            const uint32_t pair = bf16x2_mul(bf16x2_mul(e2m1x2_bits((word >> (8 * b)) & 0xFFu), BF16X2_2POW126), scale);
            // byte b holds physical k 8c + 2b, +1: step b/2, registers {0,1} (first k half) or {2,3}.
            a[t][b >> 1][(b & 1) * 2 + h] = pair;
          }
        }
#pragma unroll
      for (int u = 0; u < C::WN; ++u) {
        const int trow = (warp_n * C::WN + u) * 8 + g;
        const uint4 v = *reinterpret_cast<const uint4*>(act + trow * 128 + (((4 * j + c) ^ ((trow & 1) << 2)) * 16));
#pragma unroll
        for (int t = 0; t < C::WM; ++t) {
          mma_bf16(acc[t][u], a[t][0], v.x, v.y);
          mma_bf16(acc[t][u], a[t][1], v.z, v.w);
        }
      }
    }
  }
  cp_async_wait<0>();

  // Epilogue: accumulator (t, u, q) is weight row g + 8·(q/2) of m-tile t, sorted row 2c + q%2 of n-tile u.
  const float scale0 = p.global_scales[0][tile.expert];
  const float scale1 = GATED ? p.global_scales[1][tile.expert] : 0.0f;
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
        if (p.out_fp32) static_cast<float*>(p.out)[out_row + feature] = value;
        else static_cast<__nv_bfloat16*>(p.out)[out_row + feature] = __float2bfloat16_rn(value);
      }
    }
}

template <class C, bool GATED>
Status launch(const KernelParams& p, int64_t pairs, cudaStream_t stream) {
  auto kernel = moe_gemm_kernel<C, GATED>;
  NIB_RETURN_IF_ERROR(cuda_status(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM_BYTES), "moe_gemm: shared memory"));
  const int rows_per_cta = GATED ? C::BM / 2 : C::BM;
  const int64_t tiles = (pairs + C::BT - 1) / C::BT + std::min<int64_t>(pairs, p.experts);
  const dim3 grid(unsigned((p.n + rows_per_cta - 1) / rows_per_cta), unsigned(tiles));
  kernel<<<grid, C::THREADS, C::SMEM_BYTES, stream>>>(p);
  return cuda_status(cudaGetLastError(), GATED ? "moe_gemm_gate_up launch" : "moe_gemm_down launch");
}

template <bool GATED>
Status dispatch(const KernelParams& p, int64_t pairs, cudaStream_t stream) {
  const int tile_rows = moe_tile_rows(pairs, p.experts);
  if (tile_rows == SmallConfig::BT) return launch<SmallConfig, GATED>(p, pairs, stream);
  if (tile_rows == MediumConfig::BT) return launch<MediumConfig, GATED>(p, pairs, stream);
  return launch<LargeConfig, GATED>(p, pairs, stream);
}

Status check_experts(const DeviceNvfp4Experts& w, const char* what) {
  if (!w.packed || !w.block_scales || !w.global_scales)
    return Status::error(std::string("moe_gemm: null ") + what + " weight pointer");
  if (w.experts < 1 || w.rows < 1 || w.cols < BK || w.cols % BK != 0 || w.rows > INT32_MAX || w.cols > INT32_MAX)
    return Status::error(std::string("moe_gemm: ") + what + " weight [" + std::to_string(w.experts) + ", " +
                         std::to_string(w.rows) + ", " + std::to_string(w.cols) +
                         "] needs in_features a positive multiple of 64 (use the dequant-cublas backend)");
  if (reinterpret_cast<uintptr_t>(w.packed) % 16 || reinterpret_cast<uintptr_t>(w.block_scales) % 4)
    return Status::error(std::string("moe_gemm: ") + what + " weight is not 16-byte aligned");
  return Status::ok();
}

Status check_args(const GroupedGemmArgs& a) {
  if (!a.act || !a.expert_offsets || !a.tile_offsets || !a.out) return Status::error("moe_gemm: null pointer");
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
  p.expert_offsets = a.expert_offsets, p.tile_offsets = a.tile_offsets, p.experts = int(w0.experts);
  p.out = a.out, p.out_fp32 = a.out_fp32;
  return p;
}

}  // namespace

int moe_tile_rows(int64_t pairs, int64_t experts) {
  const int64_t average = (pairs + experts - 1) / std::max<int64_t>(experts, 1);
  if (average <= 8) return SmallConfig::BT;
  if (average <= 48) return MediumConfig::BT;
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
  return dispatch<true>(params(a, gate, &up), a.pairs, stream);
}

Status moe_gemm_down(const GroupedGemmArgs& a, const DeviceNvfp4Experts& down, cudaStream_t stream) {
  NIB_RETURN_IF_ERROR(check_experts(down, "down"));
  NIB_RETURN_IF_ERROR(check_args(a));
  if (a.sorted_pairs) return Status::error("moe_gemm_down: reads the sorted rows directly (sorted_pairs must be null)");
  if (a.pairs == 0) return Status::ok();
  return dispatch<false>(params(a, down, nullptr), a.pairs, stream);
}

}  // namespace nibble::cuda

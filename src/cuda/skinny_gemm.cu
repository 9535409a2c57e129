// Skinny NVFP4 GEMM kernels. The k permutation: within each 128-wide k-block, lane (g, c) of a warp
// (g = lane / 4, c = lane % 4) holds physical k 32c … 32c + 31 of its two rows (g and g + 8 of the
// m16 tile): 16 code bytes per row, one load, and the scale codes 2c, 2c + 1 of the block. Its
// mma step s (8 per block) feeds physical k 32c + 4s … + 3 as the fragment's logical k 2c, 2c + 1,
// 2c + 8, 2c + 9 — and takes the same physical k of its token column g from x (one 16-byte load per
// two steps). A and B agree on the order, so the products are the plain dot products; every
// E2M1 · E4M3 value is exact in BF16 and the accumulation is fp32.
#include "cuda/skinny_gemm.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdlib>

#include "cuda/check.cuh"
#include "cuda/moe_grouping.cuh"
#include "cuda/nvfp4_fragments.cuh"
#include "cuda/pdl.cuh"

namespace nibble::cuda {
namespace {

constexpr int MAX_WARPS = 16;
constexpr int MAX_SEGMENTS = 3;

// Weights are read once: keep them out of L1.
__device__ __forceinline__ uint4 load_stream(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// One warp's weight fragments: rows g and g + 8 (h = 0, 1) over BLOCKS k-blocks.
template <int BLOCKS>
struct WeightFragments {
  uint4 codes[2][BLOCKS];
  uint32_t scales[2][BLOCKS];  // scale codes of blocks 2c (low byte) and 2c + 1

  // codes[h] / scales[h]: row g + 8h of the weight (null past the weight: zeros), from k-block kb0.
  __device__ void load(const uint8_t* const (&row_codes)[2], const uint8_t* const (&row_scales)[2], int kb0, int nkb,
                       int c) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int b = 0; b < BLOCKS; ++b) {
        if (b < nkb && row_codes[h]) {
          codes[h][b] = load_stream(row_codes[h] + (kb0 + b) * 64 + 16 * c);
          scales[h][b] = __ldg(reinterpret_cast<const uint16_t*>(row_scales[h] + (kb0 + b) * 8 + 2 * c));
        } else {
          codes[h][b] = make_uint4(0, 0, 0, 0);
          scales[h][b] = 0;
        }
      }
  }
};

__device__ __forceinline__ uint32_t word_of(const uint4& v, int q) { return q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w; }

// acc[n] += Ŵ(rows g, g+8) · x(column g of n-tile n) over the warp's k-blocks; x_rows[n] is the
// lane's token row (null: a zero column). With one n-tile every x load is issued before the first
// mma (one L2 round trip, not one per k-block); more n-tiles load per block (registers: preloading
// two n-tiles' x for two blocks took 114-118 registers and made dense M = 32-64 1.3x slower, H200).
template <int BLOCKS, int NT>
__device__ __forceinline__ void mma_blocks(const WeightFragments<BLOCKS>& w, const uint16_t* const (&x_rows)[NT],
                                           int kb0, int nkb, int c, float (&acc)[NT][4]) {
  constexpr int PRELOADED = NT == 1 ? BLOCKS : 1;
  uint4 x_all[PRELOADED][NT][4];
  auto load_x = [&](int b, uint4 (&xv)[NT][4]) {
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int q = 0; q < 4; ++q)
        xv[n][q] = b < nkb && x_rows[n] ? __ldg(reinterpret_cast<const uint4*>(x_rows[n] + (kb0 + b) * 128 + 32 * c) + q)
                                        : make_uint4(0, 0, 0, 0);
  };
  if constexpr (PRELOADED > 1)
#pragma unroll
    for (int b = 0; b < BLOCKS; ++b) load_x(b, x_all[b]);
#pragma unroll
  for (int b = 0; b < BLOCKS; ++b) {
    if (b >= nkb) break;
    if constexpr (PRELOADED == 1) load_x(b, x_all[0]);
    const uint4 (&xv)[NT][4] = x_all[PRELOADED > 1 ? b : 0];
    uint32_t scale[2][2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      scale[h][0] = block_scale_bf16x2(w.scales[h][b], 0);
      scale[h][1] = block_scale_bf16x2(w.scales[h][b], 1);
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {  // code word q: physical k 32c + 8q … + 7, mma steps 2q and 2q + 1
      uint32_t lo[4], hi[4];
      decode_code_word(word_of(w.codes[0][b], q), lo);
      decode_code_word(word_of(w.codes[1][b], q), hi);
#pragma unroll
      for (int i = 0; i < 4; ++i) lo[i] = bf16x2_mul(lo[i], scale[0][q >> 1]), hi[i] = bf16x2_mul(hi[i], scale[1][q >> 1]);
      const uint32_t a0[4] = {lo[0], hi[0], lo[1], hi[1]};
      const uint32_t a1[4] = {lo[2], hi[2], lo[3], hi[3]};
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        mma_bf16(acc[n], a0, xv[n][q].x, xv[n][q].y);
        mma_bf16(acc[n], a1, xv[n][q].z, xv[n][q].w);
      }
    }
  }
}

// The CTA's warps split k; warp 0 ends with the sum over warps in warp order (returns false for
// the other warps, which are done).
template <int NT>
__device__ __forceinline__ bool reduce_warps(float (&acc)[NT][4], float* partial) {
  const int warps = blockDim.x / 32, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (warps == 1) return true;
  if (warp > 0)
#pragma unroll
    for (int i = 0; i < NT * 4; ++i) partial[((warp - 1) * NT * 4 + i) * 32 + lane] = acc[i / 4][i % 4];
  __syncthreads();
  if (warp > 0) return false;
  for (int w = 0; w < warps - 1; ++w)
#pragma unroll
    for (int i = 0; i < NT * 4; ++i) acc[i / 4][i % 4] += partial[(w * NT * 4 + i) * 32 + lane];
  return true;
}

struct DenseSegment {
  const uint8_t* codes;
  const uint8_t* scales;
  float alpha;
  float* y;
  int rows;
  int tile_begin;  // first m-tile (blockIdx.x) of this weight
};

struct DenseParams {
  DenseSegment seg[MAX_SEGMENTS];
  int count;
  int k;         // this launch's k range: [k_offset, k_offset + k) of rows k_stride long
  int k_stride;
  int k_offset;
  bool accumulate;  // y += (a later k range of an in_features beyond SKINNY_MAX_K)
  const uint16_t* x;
  int m;
  const float* row_scales;
};

// Two n-tiles of 2 k-blocks a warp fit 64 registers: 2048 threads an SM. The scale codes' decode let
// ptxas take 71 without the bound (1.5x fewer resident CTAs), and launches of more CTAs than then fit
// took more waves: q_proj M = 64 16.4 -> 18.8 us, o_proj M = 64 16.9 -> 21.2 (H200; M = 17-32 launch
// half as many CTAs, still more than fit at 71). Two words spill, outside the k loop.
template <int BLOCKS, int NT>
__global__ void __launch_bounds__(MAX_WARPS * 32, BLOCKS == 2 && NT == 2 ? 2 : 1) skinny_dense_kernel(const DenseParams p) {
  extern __shared__ float partial[];
  int s = 0;
#pragma unroll
  for (int i = 1; i < MAX_SEGMENTS; ++i)
    if (i < p.count && int(blockIdx.x) >= p.seg[i].tile_begin) s = i;
  const DenseSegment& seg = p.seg[s];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int m0 = (int(blockIdx.x) - seg.tile_begin) * 16;
  const size_t code_row = size_t(p.k_stride) / 2, scale_row = size_t(p.k_stride) / 16;
  const uint8_t* row_codes[2];
  const uint8_t* row_scales[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = m0 + g + 8 * h;
    row_codes[h] = row < seg.rows ? seg.codes + row * code_row + p.k_offset / 2 : nullptr;
    row_scales[h] = seg.scales + min(row, seg.rows - 1) * scale_row + p.k_offset / 16;
  }
  const int kb0 = warp * BLOCKS, nkb = min(BLOCKS, p.k / 128 - kb0);
  WeightFragments<BLOCKS> w;
  w.load(row_codes, row_scales, kb0, nkb, c);  // the weights do not depend on earlier kernels
  pdl_wait();
  pdl_launch_dependents();
  const int t0 = blockIdx.y * 8 * NT;
  const uint16_t* x_rows[NT];
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const int t = t0 + 8 * n + g;
    x_rows[n] = t < p.m ? p.x + size_t(t) * p.k_stride + p.k_offset : nullptr;
  }
  float acc[NT][4] = {};
  mma_blocks<BLOCKS, NT>(w, x_rows, kb0, nkb, c, acc);
  if (!reduce_warps<NT>(acc, partial)) return;
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // acc i: row g + 8·(i / 2), token column 2c + i % 2
      const int t = t0 + 8 * n + 2 * c + (i & 1), row = m0 + g + 8 * (i >> 1);
      if (t >= p.m || row >= seg.rows) continue;
      const float scale = p.row_scales ? seg.alpha * p.row_scales[t] : seg.alpha;
      float& y = seg.y[size_t(t) * seg.rows + row];
      y = p.accumulate ? y + acc[n][i] * scale : acc[n][i] * scale;
    }
}

struct MoeParams {
  const uint8_t* codes[2];  // gate_up: gate, up; down: [0]
  const uint8_t* scales[2];
  const float* global_scales[2];
  int n;  // weight rows per expert
  int k;
  const uint16_t* act;
  const int32_t* sorted_pairs;  // gate_up: source row of a sorted row = sorted_pairs[r] / top_k
  int top_k;
  const float* row_scales;  // W4A4: per source row
  const int32_t* tile_count;  // tile_offsets[experts]
  const int4* tiles;
  void* out;
  bool out_fp32;
};

__device__ __forceinline__ int source_row(const MoeParams& p, int sorted_row) {
  return p.sorted_pairs ? p.sorted_pairs[sorted_row] / p.top_k : sorted_row;
}

// GATED: the m16 tile is gate rows f0 … f0 + 7 (fragment rows g) over up rows of the same features
// (rows g + 8), so one lane ends with gate and up of feature f0 + g for its two token columns.
// Otherwise 16 rows of the down weight.
// NT n-tiles: tiles of 8 · NT sorted rows, each weight fragment decoded once for all of them.
// MIN_CTAS > 0: at most 4 warps, registers capped so that MIN_CTAS CTAs fit an SM (more loads in
// flight per SM for the MoE at 2048-wide k, launch_moe); 0: up to MAX_WARPS warps.
template <int BLOCKS, bool GATED, int NT, int MIN_CTAS = 0>
__global__ void __launch_bounds__(MIN_CTAS ? 128 : MAX_WARPS * 32, MIN_CTAS ? MIN_CTAS : 1) skinny_moe_kernel(const MoeParams p) {
  extern __shared__ float partial[];
  pdl_wait();  // the tile list comes from the routing kernels
  pdl_launch_dependents();
  const int4 tile = p.tiles[blockIdx.y];  // in bounds (the grid never exceeds the list); read with the count
  if (int(blockIdx.y) >= *p.tile_count) return;
  const int expert = tile.x, row0 = tile.y, rows = tile.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const size_t code_row = size_t(p.k) / 2, scale_row = size_t(p.k) / 16;
  const uint8_t* row_codes[2];
  const uint8_t* row_scales[2];
  const int m0 = blockIdx.x * (GATED ? 8 : 16);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int which = GATED ? h : 0;
    const int row = GATED ? m0 + g : m0 + g + 8 * h;
    const size_t base = size_t(expert) * p.n + min(row, p.n - 1);
    row_codes[h] = row < p.n ? p.codes[which] + base * code_row : nullptr;
    row_scales[h] = p.scales[which] + base * scale_row;
  }
  const int kb0 = warp * BLOCKS, nkb = min(BLOCKS, p.k / 128 - kb0);
  WeightFragments<BLOCKS> w;
  w.load(row_codes, row_scales, kb0, nkb, c);
  const uint16_t* x_rows[NT];
#pragma unroll
  for (int n = 0; n < NT; ++n)
    x_rows[n] = 8 * n + g < rows ? p.act + size_t(source_row(p, row0 + 8 * n + g)) * p.k : nullptr;
  float acc[NT][4] = {};
  mma_blocks<BLOCKS, NT>(w, x_rows, kb0, nkb, c, acc);
  if (!reduce_warps<NT>(acc, partial)) return;
#pragma unroll
  for (int i = 0; i < 2 * NT; ++i) {  // token columns 8n + 2c + j of n-tile n = i / 2
    const int n = i >> 1, j = i & 1, r = 8 * n + 2 * c + j;
    if (r >= rows) continue;
    const float row_scale = p.row_scales ? p.row_scales[source_row(p, row0 + r)] : 1.0f;
    const size_t out_row = size_t(row0 + r) * p.n;
#pragma unroll
    for (int h = 0; h < (GATED ? 1 : 2); ++h) {
      float value;
      int feature;
      if constexpr (GATED) {
        const float gate = acc[n][j] * (p.global_scales[0][expert] * WEIGHT_DECODE_EPILOGUE) * row_scale;
        const float up = acc[n][2 + j] * (p.global_scales[1][expert] * WEIGHT_DECODE_EPILOGUE) * row_scale;
        value = gate / (1.0f + expf(-gate)) * up;  // silu(gate) · up, as ref::silu_mul
        feature = m0 + g;
      } else {
        value = acc[n][2 * h + j] * (p.global_scales[0][expert] * WEIGHT_DECODE_EPILOGUE) * row_scale;
        feature = m0 + g + 8 * h;
      }
      if (feature >= p.n) continue;
      if (p.out_fp32) static_cast<float*>(p.out)[out_row + feature] = value;
      else static_cast<__nv_bfloat16*>(p.out)[out_row + feature] = __float2bfloat16_rn(value);
    }
  }
}

// k-blocks per warp: 4 (more loads in flight per lane) for long k ranges, but 2 — twice the warps —
// for the MoE's 8-row tiles and dense launches of two n-tiles. H200, codes in the GPU layout
// (docs/perf.md "Repacked NVFP4 codes"), 4/2 blocks: MoE block T = 1 26.4/25.2 µs, T = 16 121/127;
// dense M = 16 k_proj 4.75/4.17, M = 32 q_proj 10.3/9.1, M = 1 q_proj 4.13/4.43.
// Never more than MAX_WARPS warps: 4 blocks a warp beyond 2 · MAX_WARPS blocks. NIBBLE_SKINNY_BLOCKS=2
// or 4 forces one where it fits (an experiment switch for scripts/device_ab.sh).
int blocks_per_warp(int k, bool dense, int nt) {
  static const int forced = std::getenv("NIBBLE_SKINNY_BLOCKS") ? std::atoi(std::getenv("NIBBLE_SKINNY_BLOCKS")) : 0;
  const int blocks = k / 128;
  if (blocks > 2 * MAX_WARPS) return 4;
  if (forced == 2 || (forced == 4 && blocks >= 4)) return forced;
  return blocks < 8 || (dense ? nt > 1 : nt == 1) ? 2 : 4;
}

// `kernel` is instantiated for per_warp k-blocks per warp and nt n-tiles.
template <class Kernel, class Params>
Status launch(Kernel kernel, dim3 grid, int k, int per_warp, int nt, const Params& p, cudaStream_t stream, const char* what) {
  const int warps = (k / 128 + per_warp - 1) / per_warp;
  const size_t smem = size_t(warps - 1) * nt * 4 * 32 * sizeof(float);
  return cuda_status(launch_pdl(kernel, grid, dim3(unsigned(warps * 32)), smem, stream, p), what);
}

Status check_in_features(int64_t k, bool dense, const char* what) {
  if (dense ? skinny_linear_supported(k) : skinny_supported(k)) return Status::ok();
  return Status::error(std::string(what) + ": in_features " + std::to_string(k) + " is not a multiple of 128" +
                       (dense ? "" : " up to " + std::to_string(SKINNY_MAX_K)) + " (use another backend)");
}

template <bool GATED>
Status launch_moe(const GroupedGemmArgs& a, const DeviceNvfp4Experts& w0, const DeviceNvfp4Experts* w1,
                  cudaStream_t stream) {
  const char* what = GATED ? "skinny_moe_gate_up" : "skinny_moe_down";
  NIB_RETURN_IF_ERROR(check_in_features(w0.cols, false, what));
  if (!a.act || !a.tile_offsets || !a.tiles || !a.out || !w0.packed || !w0.block_scales || !w0.global_scales)
    return Status::error(std::string(what) + ": null pointer");
  if (a.tile_rows != 8 && a.tile_rows != 16 && a.tile_rows != 32)
    return Status::error(std::string(what) + ": the grouping must use tiles of 8, 16 or 32 rows (skinny_moe_tile_rows)");
  if (reinterpret_cast<uintptr_t>(a.act) % 16 || reinterpret_cast<uintptr_t>(w0.packed) % 16)
    return Status::error(std::string(what) + ": activations and weights must be 16-byte aligned");
  if (a.pairs <= 0) return Status::ok();
  MoeParams p{};
  p.codes[0] = w0.packed, p.scales[0] = w0.block_scales, p.global_scales[0] = w0.global_scales;
  if (w1) p.codes[1] = w1->packed, p.scales[1] = w1->block_scales, p.global_scales[1] = w1->global_scales;
  p.n = int(w0.rows), p.k = int(w0.cols);
  p.act = a.act, p.sorted_pairs = a.sorted_pairs, p.top_k = int(a.top_k), p.row_scales = a.row_scales;
  p.tile_count = a.tile_offsets + w0.experts, p.tiles = a.tiles;
  p.out = a.out, p.out_fp32 = a.out_fp32;
  const int rows_per_cta = GATED ? 8 : 16;
  const dim3 grid(unsigned((p.n + rows_per_cta - 1) / rows_per_cta),
                  unsigned(max_expert_tiles(a.pairs, w0.experts, a.tile_rows)));
  const int nt = a.tile_rows / 8, per_warp = blocks_per_warp(p.k, false, nt);
  const bool four = per_warp == 4;
  // 16-row tiles at 2048-wide k (4 warps of 4 blocks): registers capped for 5 CTAs an SM (96, no
  // spills; 6 CTAs would spill), more loads in flight for a kernel that waits on memory. H200
  // (docs/perf.md "Repacked NVFP4 codes"): MoE block T = 64 193.9 → 183.6 µs, T = 95 211.6 → 199.5,
  // T = 32 unchanged; S_TG b64 4,722 → 4,828 tok/s.
  if (four && nt == 2 && p.k == 4 * 4 * 128)
    return launch(skinny_moe_kernel<4, GATED, 2, 5>, grid, p.k, 4, 2, p, stream, what);
  switch (nt) {
    case 4: return launch(four ? skinny_moe_kernel<4, GATED, 4> : skinny_moe_kernel<2, GATED, 4>, grid, p.k, per_warp, 4, p, stream, what);
    case 2: return launch(four ? skinny_moe_kernel<4, GATED, 2> : skinny_moe_kernel<2, GATED, 2>, grid, p.k, per_warp, 2, p, stream, what);
    default: return launch(four ? skinny_moe_kernel<4, GATED, 1> : skinny_moe_kernel<2, GATED, 1>, grid, p.k, per_warp, 1, p, stream, what);
  }
}

}  // namespace

int skinny_moe_tile_rows(int64_t pairs, int64_t experts) {
  return pairs < 4 * experts ? 8 : pairs < 16 * experts ? 16 : 32;
}

bool skinny_supported(int64_t in_features) {
  return in_features > 0 && in_features % SKINNY_K_BLOCK == 0 && in_features <= SKINNY_MAX_K;
}

bool skinny_linear_supported(int64_t in_features) {
  return in_features > 0 && in_features % SKINNY_K_BLOCK == 0 && in_features <= INT32_MAX / 2;
}

Status skinny_linear(const uint16_t* x, int64_t M, const DeviceNvfp4Weight* const* weights, float* const* outputs,
                     int count, const float* row_scales, cudaStream_t stream) {
  if (count < 1 || count > MAX_SEGMENTS) return Status::error("skinny_linear: 1 to 3 weights per launch");
  if (M <= 0 || M > INT32_MAX / 2) return Status::error("skinny_linear: M must be in [1, 2^30)");
  if (!x || reinterpret_cast<uintptr_t>(x) % 16) return Status::error("skinny_linear: x must be 16-byte aligned");
  DenseParams p{};
  p.count = count, p.k_stride = int(weights[0]->cols), p.x = x, p.m = int(M), p.row_scales = row_scales;
  NIB_RETURN_IF_ERROR(check_in_features(weights[0]->cols, true, "skinny_linear"));
  int tiles = 0;
  for (int i = 0; i < count; ++i) {
    const DeviceNvfp4Weight& w = *weights[i];
    if (!w.packed || !w.block_scales || !outputs[i]) return Status::error("skinny_linear: null pointer");
    if (w.cols != weights[0]->cols) return Status::error("skinny_linear: the weights of one launch share in_features");
    if (w.rows < 1 || w.rows > INT32_MAX / 2) return Status::error("skinny_linear: bad out_features");
    if (reinterpret_cast<uintptr_t>(w.packed) % 16) return Status::error("skinny_linear: weights must be 16-byte aligned");
    // The decoded weights are × 2⁻⁸ (nvfp4_layout.h): alpha's factor restores them, exactly.
    p.seg[i] = {w.packed, w.block_scales, w.weight_scale_2 * WEIGHT_DECODE_EPILOGUE, outputs[i], int(w.rows), tiles};
    tiles += int((w.rows + 15) / 16);
  }
  const int nt = M <= 8 ? 1 : 2;
  const dim3 grid(unsigned(tiles), unsigned((M + 8 * nt - 1) / (8 * nt)));
  // in_features beyond one CTA's SKINNY_MAX_K: launches over k ranges, each adding to y in k order
  // (deterministic; e.g. ERNIE-4.5's dense down_proj, K = 12,288, in two).
  for (p.k_offset = 0; p.k_offset < p.k_stride; p.k_offset += int(SKINNY_MAX_K)) {
    p.k = std::min(p.k_stride - p.k_offset, int(SKINNY_MAX_K));
    p.accumulate = p.k_offset > 0;
    const int per_warp = blocks_per_warp(p.k, true, nt);
    const bool four = per_warp == 4;
    const auto kernel = nt == 1 ? (four ? skinny_dense_kernel<4, 1> : skinny_dense_kernel<2, 1>)
                                : (four ? skinny_dense_kernel<4, 2> : skinny_dense_kernel<2, 2>);
    NIB_RETURN_IF_ERROR(launch(kernel, grid, p.k, per_warp, nt, p, stream, "skinny_linear"));
  }
  return Status::ok();
}

Status skinny_moe_gate_up(const GroupedGemmArgs& args, const DeviceNvfp4Experts& gate, const DeviceNvfp4Experts& up,
                          cudaStream_t stream) {
  if (up.experts != gate.experts || up.rows != gate.rows || up.cols != gate.cols || !up.packed)
    return Status::error("skinny_moe_gate_up: gate and up weights differ in shape");
  return launch_moe<true>(args, gate, &up, stream);
}

Status skinny_moe_down(const GroupedGemmArgs& args, const DeviceNvfp4Experts& down, cudaStream_t stream) {
  if (args.sorted_pairs) return Status::error("skinny_moe_down: reads the sorted rows directly (sorted_pairs must be null)");
  return launch_moe<false>(args, down, nullptr, stream);
}

}  // namespace nibble::cuda

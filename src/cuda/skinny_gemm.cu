// Skinny NVFP4 GEMM kernels. The k permutation: within each 128-wide k-block, lane (g, c) of a warp
// (g = lane / 4, c = lane % 4) holds physical k 32c … 32c + 31 of its two rows (g and g + 8 of the
// m16 tile): 16 code bytes per row, one load, and the scale codes 2c, 2c + 1 of the block. Its
// mma step s (8 per block) feeds physical k 32c + 4s … + 3 as the fragment's logical k 2c, 2c + 1,
// 2c + 8, 2c + 9 — and takes the same physical k of its token column g from x (one 16-byte load per
// two steps). A and B agree on the order, so the products are the plain dot products; every
// E2M1 · E4M3 value is exact in BF16 and the accumulation is fp32.
#include "cuda/skinny_gemm.cuh"

#include <algorithm>
#include <string>

#include "cuda/nvfp4_act_quant.cuh"
#include "cuda/skinny_fragments.cuh"

namespace nibble::cuda {
namespace {

using namespace skinny;

constexpr int MAX_SEGMENTS = 3;

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

// The CTA's m-tile: which weight of the launch (segment s), its first row m0, and the warp's k-blocks
// [kb0, kb0 + nkb) of the launch's k range, whose weight fragments are loaded into w (they do not
// depend on earlier kernels: both dense kernels call this before their PDL wait).
struct DenseTile {
  int s, m0, kb0, nkb;
};
template <int BLOCKS>
__device__ __forceinline__ DenseTile load_dense_tile(const DenseParams& p, WeightFragments<BLOCKS>& w) {
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
  w.load(row_codes, row_scales, kb0, nkb, c);
  return {s, m0, kb0, nkb};
}

// Two n-tiles of 2 k-blocks a warp fit 64 registers: 2048 threads an SM. The scale codes' decode let
// ptxas take 71 without the bound (1.5x fewer resident CTAs), and launches of more CTAs than then fit
// took more waves: q_proj M = 64 16.4 -> 18.8 us, o_proj M = 64 16.9 -> 21.2 (H200; M = 17-32 launch
// half as many CTAs, still more than fit at 71). Two words spill, outside the k loop.
template <int BLOCKS, int NT>
__global__ void __launch_bounds__(MAX_WARPS * 32, BLOCKS == 2 && NT == 2 ? 2 : 1) skinny_dense_kernel(const DenseParams p) {
  extern __shared__ float partial[];
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  WeightFragments<BLOCKS> w;
  const DenseTile tile = load_dense_tile(p, w);
  const DenseSegment& seg = p.seg[tile.s];
  const int m0 = tile.m0, kb0 = tile.kb0, nkb = tile.nkb;
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

// One token's W4A4 GEMM with its quantize inside (M = 1, in_features ≤ SKINNY_MAX_K: the CTA's warps
// span the row): each warp quantizes its own k range of x cooperatively — a lane a 16-value block, as
// quantize_dequantize_activation_bf16 computes it (per-token: the row amax met over the CTA's warps) —
// into shared memory, from which its token-column lanes take their fragments; the separate quantize
// launch goes. CTA (0, 0) also writes x̂ and the row scale where asked (the workspace linear_nvfp4
// fills). alpha holds static's input_scale (folded as linear_nvfp4 folds it); per-token multiplies
// by the row scale in the epilogue, as the kernel above does with row_scales.
template <int BLOCKS>
__global__ void __launch_bounds__(MAX_WARPS * 32) skinny_dense_quant_kernel(const DenseParams p, float quant_scale,
                                                                           uint16_t* x_hat_out, float* row_scale_out) {
  extern __shared__ float partial[];  // reduce_warps' sums, then x̂ of the row (BF16)
  __shared__ float warp_amax[MAX_WARPS];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int warps = blockDim.x / 32;
  WeightFragments<BLOCKS> w;
  const DenseTile tile = load_dense_tile(p, w);  // (k_offset 0: one launch covers the row)
  const DenseSegment& seg = p.seg[tile.s];
  const int m0 = tile.m0, kb0 = tile.kb0, nkb = tile.nkb;
  pdl_wait();
  pdl_launch_dependents();
  uint16_t* xq = reinterpret_cast<uint16_t*>(partial + (warps - 1) * 4 * 32);
  // The warp's k range, a 16-value block a lane (BLOCKS · 128 ≤ 512 values: one round).
  const int k0 = kb0 * 128 + 16 * lane;
  const bool holds = 16 * lane < nkb * 128;
  uint4 raw[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
  if (holds) raw[0] = __ldg(reinterpret_cast<const uint4*>(p.x + k0)), raw[1] = __ldg(reinterpret_cast<const uint4*>(p.x + k0) + 1);
  const uint32_t words[8] = {raw[0].x, raw[0].y, raw[0].z, raw[0].w, raw[1].x, raw[1].y, raw[1].z, raw[1].w};
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i)
    amax = fmaxf(amax, fmaxf(fabsf(__uint_as_float(words[i] << 16)), fabsf(__uint_as_float(words[i] & 0xFFFF0000u))));
  float row_amax = 0.0f;
  if (quant_scale == 0.0f) {  // per-token: the row's amax over the CTA's warps
    float m = amax;
    for (int offset = 16; offset > 0; offset >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, offset));
    if (lane == 0) warp_amax[warp] = m;
    __syncthreads();
    for (int i = 0; i < warps; ++i) row_amax = fmaxf(row_amax, warp_amax[i]);
  }
  float global, row_scale;
  act_row_scales(quant_scale, row_amax, global, row_scale);
  if (holds) {
    const ActBlockScale block(amax, global);
    uint32_t out[8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
      out[i] = block.bf16(__uint_as_float(words[i] << 16)) | block.bf16(__uint_as_float(words[i] & 0xFFFF0000u)) << 16;
    const uint4 lo = make_uint4(out[0], out[1], out[2], out[3]), hi = make_uint4(out[4], out[5], out[6], out[7]);
    reinterpret_cast<uint4*>(xq + k0)[0] = lo, reinterpret_cast<uint4*>(xq + k0)[1] = hi;
    if (x_hat_out && blockIdx.x == 0) reinterpret_cast<uint4*>(x_hat_out + k0)[0] = lo, reinterpret_cast<uint4*>(x_hat_out + k0)[1] = hi;
  }
  if (row_scale_out && blockIdx.x == 0 && threadIdx.x == 0) *row_scale_out = row_scale;
  __syncwarp();  // a warp reads only the k range it wrote
  float acc[1][4] = {};
#pragma unroll
  for (int b = 0; b < BLOCKS; ++b) {
    if (b >= nkb) break;
    uint4 xv[1][4];
    token_x_fragment<false>(xq, kb0 + b, g == 0, c, xv[0]);
    mma_kblock<1>({w.codes[0][b], w.codes[1][b]}, {w.scales[0][b], w.scales[1][b]}, xv, acc);
  }
  if (!reduce_warps<1>(acc, partial)) return;
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // acc i: row g + 8·(i / 2), token column 2c + i % 2: only column 0 exists
    const int t = 2 * c + (i & 1), row = m0 + g + 8 * (i >> 1);
    if (t != 0 || row >= seg.rows) continue;
    seg.y[row] = acc[0][i] * (quant_scale == 0.0f ? seg.alpha * row_scale : seg.alpha);
  }
}

}  // namespace

// p's segments, one a weight of the launch (checked: 1 to MAX_SEGMENTS of them sharing in_features,
// aligned, x too), the m-tiles of all of them into `tiles`. input_scale > 0 (static W4A4) is folded
// into each alpha in linear_nvfp4's order: weight_scale_2 · input_scale, then × 2⁸, which restores
// the decoded weights' 2⁻⁸ exactly (nvfp4_layout.h).
static Status fill_segments(const uint16_t* x, const DeviceNvfp4Weight* const* weights, float* const* outputs, int count,
                            float input_scale, const char* what, DenseParams& p, int& tiles) {
  const std::string name(what);
  if (count < 1 || count > MAX_SEGMENTS) return Status::error(name + ": 1 to 3 weights per launch");
  if (!x || reinterpret_cast<uintptr_t>(x) % 16) return Status::error(name + ": x must be 16-byte aligned");
  p.count = count, p.x = x;
  tiles = 0;
  for (int i = 0; i < count; ++i) {
    const DeviceNvfp4Weight& w = *weights[i];
    if (!w.packed || !w.block_scales || !outputs[i]) return Status::error(name + ": null pointer");
    if (w.cols != weights[0]->cols) return Status::error(name + ": the weights of one launch share in_features");
    if (w.rows < 1 || w.rows > INT32_MAX / 2) return Status::error(name + ": bad out_features");
    if (reinterpret_cast<uintptr_t>(w.packed) % 16) return Status::error(name + ": weights must be 16-byte aligned");
    const float scale_2 = input_scale > 0.0f ? w.weight_scale_2 * input_scale : w.weight_scale_2;
    p.seg[i] = {w.packed, w.block_scales, scale_2 * WEIGHT_DECODE_EPILOGUE, outputs[i], int(w.rows), tiles};
    tiles += int((w.rows + 15) / 16);
  }
  return Status::ok();
}

Status skinny_linear_quantizing(const uint16_t* x, const DeviceNvfp4Weight* const* weights, float* const* outputs, int count,
                                float input_scale, uint16_t* x_hat_out, float* row_scale_out, cudaStream_t stream) {
  DenseParams p{};
  int tiles = 0;
  NIB_RETURN_IF_ERROR(fill_segments(x, weights, outputs, count, input_scale, "skinny_linear_quantizing", p, tiles));
  const int64_t K = weights[0]->cols;
  if (!skinny_supported(K)) return Status::error("skinny_linear_quantizing: in_features must be a multiple of 128 up to SKINNY_MAX_K");
  p.k_stride = int(K), p.k = int(K), p.m = 1;
  const int per_warp = blocks_per_warp(p.k, true, 1);
  const int warps = (p.k / 128 + per_warp - 1) / per_warp;
  const size_t smem = size_t(warps - 1) * 4 * 32 * sizeof(float) + size_t(K) * 2;
  const auto kernel = per_warp == 4 ? skinny_dense_quant_kernel<4> : skinny_dense_quant_kernel<2>;
  return cuda_status(launch_pdl(kernel, dim3(unsigned(tiles)), dim3(unsigned(warps * 32)), smem, stream, p, input_scale,
                                x_hat_out, row_scale_out),
                     "skinny_linear_quantizing");
}

bool skinny_supported(int64_t in_features) {
  return in_features > 0 && in_features % SKINNY_K_BLOCK == 0 && in_features <= SKINNY_MAX_K;
}

bool skinny_linear_supported(int64_t in_features) {
  return in_features > 0 && in_features % SKINNY_K_BLOCK == 0 && in_features <= INT32_MAX / 2;
}

Status skinny_linear(const uint16_t* x, int64_t M, const DeviceNvfp4Weight* const* weights, float* const* outputs,
                     int count, const float* row_scales, cudaStream_t stream) {
  if (M <= 0 || M > INT32_MAX / 2) return Status::error("skinny_linear: M must be in [1, 2^30)");
  DenseParams p{};
  int tiles = 0;
  NIB_RETURN_IF_ERROR(fill_segments(x, weights, outputs, count, 0.0f, "skinny_linear", p, tiles));
  NIB_RETURN_IF_ERROR(check_in_features(weights[0]->cols, true, "skinny_linear"));
  p.k_stride = int(weights[0]->cols), p.m = int(M), p.row_scales = row_scales;
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

}  // namespace nibble::cuda

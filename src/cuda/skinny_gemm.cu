// Skinny NVFP4 GEMM kernels. The k permutation: within each 128-wide k-block, lane (g, c) of a warp
// (g = lane / 4, c = lane % 4) holds physical k 32c … 32c + 31 of its two rows (g and g + 8 of the
// m16 tile): 16 code bytes per row, one load, and the scale codes 2c, 2c + 1 of the block. Its
// mma step s (8 per block) feeds physical k 32c + 4s … + 3 as the fragment's logical k 2c, 2c + 1,
// 2c + 8, 2c + 9 — and takes the same physical k of its token column g from x (one 16-byte load per
// two steps). A and B agree on the order, so the products are the plain dot products; every
// E2M1 · E4M3 value is exact in BF16 and the accumulation is fp32.
#include "cuda/skinny_gemm.cuh"

#include <algorithm>

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

}  // namespace

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

}  // namespace nibble::cuda

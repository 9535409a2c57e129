// Skinny NVFP4 GEMM kernels. The k permutation: within each 128-wide k-block, lane (g, c) of a warp
// (g = lane / 4, c = lane % 4) holds physical k 32c … 32c + 31 of its two rows (g and g + 8 of the
// m16 tile): 16 code bytes per row, one load, and the scale codes 2c, 2c + 1 of the block. Its
// mma step s (8 per block) feeds physical k 32c + 4s … + 3 as the fragment's logical k 2c, 2c + 1,
// 2c + 8, 2c + 9 — and takes the same physical k of its token column g from x (one 16-byte load per
// two steps). A and B agree on the order, so the products are the plain dot products; every
// E2M1 · E4M3 value is exact in BF16 and the accumulation is fp32.
#include "cuda/gemm/skinny_gemm.cuh"

#include <cooperative_groups.h>

#include <algorithm>
#include <string>

#include "cuda/common/async_copy.cuh"
#include "cuda/common/device_context.cuh"
#include "cuda/nvfp4/nvfp4_act_quant.cuh"
#include "cuda/gemm/skinny_dense.cuh"
#include "cuda/gemm/skinny_fragments.cuh"

namespace nibble::cuda {
namespace {

using namespace skinny;
using namespace skinny_dense;

// Two n-tiles of 2 k-blocks a warp fit 64 registers: 2048 threads an SM. The scale codes' decode let
// ptxas take 71 without the bound (1.5x fewer resident CTAs), and launches of more CTAs than then fit
// took more waves: q_proj M = 64 16.4 -> 18.8 us, o_proj M = 64 16.9 -> 21.2 (H200; M = 17-32 launch
// half as many CTAs, still more than fit at 71). Two words spill, outside the k loop.
template <int BLOCKS, int NT>
__global__ void __launch_bounds__(MAX_WARPS * 32, BLOCKS == 2 && NT == 2 ? 2 : 1)
    skinny_dense_kernel(const DenseParams p) {
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
__global__ void __launch_bounds__(MAX_WARPS * 32)
    skinny_dense_quant_kernel(const DenseParams p, float quant_scale, uint16_t* x_hat_out, float* row_scale_out) {
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
  if (holds)
    raw[0] = __ldg(reinterpret_cast<const uint4*>(p.x + k0)),
    raw[1] = __ldg(reinterpret_cast<const uint4*>(p.x + k0) + 1);
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
    if (x_hat_out && blockIdx.x == 0)
      reinterpret_cast<uint4*>(x_hat_out + k0)[0] = lo, reinterpret_cast<uint4*>(x_hat_out + k0)[1] = hi;
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

// Split-K for up to 64 token rows (SKINNY_SPLIT). The kernel above gives each CTA 16 weight rows and
// all of k, so every CTA reads its token tile's whole x from L2 and a weight is decoded once per token
// tile: at M = 64 q_proj's 4.7 MB of weights brought 67 MB of x (docs/lab/perf-notebook.md). Here a CTA's 4-8
// warps take as many m16 tiles (64-128 rows) over a 512-wide k range (a split) and all the tokens: the
// CTA stages that slice of x in shared memory once (64 KB at M = 64), and each warp decodes each
// weight word once and runs it against every n-tile. Enough CTAs for every SM come from the splits:
// a thread-block cluster of up to 8 CTAs shares a column of tiles, rank r taking splits r, r + 8, …
// (q/k/v at Qwen3's shapes: 64 clusters of 4). The ranks' fp32 partial sums meet in distributed
// shared memory, each rank adding a share of the column's outputs in rank order (the same bits in
// every run) and writing them to y.
constexpr int SPLIT_MAX_WARPS = 8;                       // a CTA's m16 tiles: 4 … 8 (split_warps)
constexpr int SPLIT_BLOCKS = 4;                          // k-blocks of a split
constexpr int SPLIT_ROW_BYTES = SPLIT_BLOCKS * 128 * 2;  // a token's x slice in shared memory
constexpr int SPLIT_MAX_RANKS = 8;                       // the portable cluster size
constexpr int SPLIT_MAX_NT = 8;

// The 16-byte chunk j of a token row t's slice sits at chunk split_chunk(j, t): lane (g, c)'s loads
// take chunk 16b + 4c + q of rows 8n + g, and with this swizzle the 8 lanes of each quarter-warp
// (g = 2p, 2p + 1; c = 0 … 3) hit 8 different 16-byte bank groups.
__device__ __forceinline__ int split_chunk(int j, int t) { return j ^ (((j >> 3) & 1) << 1) ^ (t & 1); }

// y of value i (an mma accumulator register: row g + 8·((i % 4) / 2), token column 8·(i / 4) + 2c + i % 2)
// of lane (g, c) of m16 tile `tile`: the sum × alpha (× the token's row scale).
__device__ __forceinline__ void split_store_value(const DenseParams& p, int tiles, int tile, int i, int lane,
                                                  float sum) {
  if (tile >= tiles) return;
  const DenseSegment& out = p.seg[segment_of(p, tile)];
  const int t = 8 * (i / 4) + 2 * (lane & 3) + (i & 1),
            row = (tile - out.tile_begin) * 16 + (lane >> 2) + 8 * ((i % 4) >> 1);
  if (t >= p.m || row >= out.rows) return;
  out.y[size_t(t) * out.rows + row] = sum * (p.row_scales ? out.alpha * p.row_scales[t] : out.alpha);
}

// Grid (ranks, columns of blockDim / 32 tiles), clusters of `ranks` along x; `splits` of SPLIT_BLOCKS
// k-blocks over k.
template <int NT>
__global__ void __launch_bounds__(SPLIT_MAX_WARPS * 32, 2)
    skinny_dense_split_kernel(const DenseParams p, int tiles, int splits) {
  extern __shared__ __align__(16) uint8_t x_slice[];  // [8 · NT tokens][SPLIT_ROW_BYTES], chunks swizzled
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  const int ranks = int(gridDim.x), rank = int(blockIdx.x);  // the cluster spans x: its size and rank
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3, warps = int(blockDim.x) / 32;
  const int tile = int(blockIdx.y) * warps + warp, k_blocks = p.k / 128;
  const TileRows rows = tile_rows(p, tile, tile < tiles);  // (k_offset 0)
  WeightFragments<SPLIT_BLOCKS> w;  // the first split's before the PDL wait: weights do not depend on earlier kernels
  w.load(rows.codes, rows.scales, rank * SPLIT_BLOCKS, min(SPLIT_BLOCKS, k_blocks - rank * SPLIT_BLOCKS), c);
  pdl_wait();
  pdl_launch_dependents();
  const uint32_t slice = smem_address(x_slice);
  float acc[NT][4] = {};
  for (int split = rank; split < splits; split += ranks) {
    const int kb0 = split * SPLIT_BLOCKS, nkb = min(SPLIT_BLOCKS, k_blocks - kb0);
    if (split != rank) {  // (only where k has more than 8 splits) every warp is done with the last slice
      __syncthreads();
      w.load(rows.codes, rows.scales, kb0, nkb, c);
    }
    // The split's x slice, a commit group a k-block (tokens past M copy row M − 1: their columns are
    // never stored, and an mma column depends only on its own x column).
#pragma unroll
    for (int b = 0; b < SPLIT_BLOCKS; ++b) {
      if (b < nkb)
        for (int i = int(threadIdx.x); i < 8 * NT * 16; i += int(blockDim.x)) {
          const int t = i >> 4, j = 16 * b + (i & 15);
          const uint16_t* src = p.x + size_t(min(t, p.m - 1)) * p.k_stride + (kb0 * 128 + 8 * j);
          cp_async_shared<16>(slice + t * SPLIT_ROW_BYTES + split_chunk(j, t) * 16, src);
        }
      cp_async_commit();
    }
    static_assert(SPLIT_BLOCKS == 4, "the waits below count four groups");
#pragma unroll
    for (int b = 0; b < SPLIT_BLOCKS; ++b) {
      if (b == 0)
        cp_async_wait<SPLIT_BLOCKS - 1>();
      else if (b == 1)
        cp_async_wait<SPLIT_BLOCKS - 2>();
      else if (b == 2)
        cp_async_wait<SPLIT_BLOCKS - 3>();
      else
        cp_async_wait<0>();
      __syncthreads();
      if (b >= nkb) break;
      uint32_t scale[2][2];
      kblock_scales<false>({w.scales[0][b], w.scales[1][b]}, scale);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        uint32_t a0[4], a1[4];
        decode_word_fragments<false>({w.codes[0][b], w.codes[1][b]}, scale, q, a0, a1);
        const int j = 16 * b + x_chunk<false>(c, q);
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          const int t = 8 * n + g;
          const uint4 xv = *reinterpret_cast<const uint4*>(x_slice + t * SPLIT_ROW_BYTES + split_chunk(j, t) * 16);
          mma_bf16(acc[n], a0, xv.x, xv.y);
          mma_bf16(acc[n], a1, xv.z, xv.w);
        }
      }
    }
  }
  // The CTA's partial sums, [warp][value][lane], over its x slice (every warp is past its last read).
  constexpr int VALUES = NT * 4;
  __syncthreads();
  float* partial = reinterpret_cast<float*>(x_slice);
#pragma unroll
  for (int i = 0; i < VALUES; ++i) partial[(warp * VALUES + i) * 32 + lane] = acc[i / 4][i % 4];
  cluster.sync();  // release / acquire: every rank's partial sums are visible to the cluster
  // Rank r adds its share of the column's outputs over the ranks, in rank order, all loads first: a
  // thread four lanes' values of one (warp, value) a time, 16 bytes from each rank.
  const int quads = warps * VALUES * 8, share = (quads + ranks - 1) / ranks, end = min(quads, (rank + 1) * share);
  for (int quad = rank * share + int(threadIdx.x); quad < end; quad += int(blockDim.x)) {
    float4 v[SPLIT_MAX_RANKS];
#pragma unroll
    for (int r = 0; r < SPLIT_MAX_RANKS; ++r)
      v[r] = r < ranks ? reinterpret_cast<const float4*>(cluster.map_shared_rank(partial, r))[quad]
                       : make_float4(0, 0, 0, 0);
    float4 sum = make_float4(0, 0, 0, 0);
#pragma unroll
    for (int r = 0; r < SPLIT_MAX_RANKS; ++r)
      if (r < ranks) sum.x += v[r].x, sum.y += v[r].y, sum.z += v[r].z, sum.w += v[r].w;
    const int w = quad / (VALUES * 8), i = quad / 8 % VALUES, l0 = quad % 8 * 4;
    const float values[4] = {sum.x, sum.y, sum.z, sum.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) split_store_value(p, tiles, int(blockIdx.y) * warps + w, i, l0 + e, values[e]);
  }
  // No rank leaves while another may still read its shared memory.
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
}

}  // namespace

namespace skinny_dense {

// p's segments, one a weight of the launch (checked: 1 to MAX_SEGMENTS of them sharing in_features,
// aligned, x too; outputs null where the kernel writes no y), the m-tiles of all of them into
// `tiles`. input_scale > 0 (static W4A4) is folded into each alpha in linear_nvfp4's order:
// weight_scale_2 · input_scale, then × 2⁸, which restores the decoded weights' 2⁻⁸ exactly
// (nvfp4_layout.h).
Status fill_segments(const uint16_t* x, const DeviceNvfp4Weight* const* weights, float* const* outputs, int count,
                     float input_scale, const char* what, DenseParams& p, int& tiles) {
  const std::string name(what);
  if (count < 1 || count > MAX_SEGMENTS) return Status::error(name + ": 1 to 3 weights per launch");
  if (!x || reinterpret_cast<uintptr_t>(x) % 16) return Status::error(name + ": x must be 16-byte aligned");
  p.count = count, p.x = x;
  tiles = 0;
  for (int i = 0; i < count; ++i) {
    const DeviceNvfp4Weight& w = *weights[i];
    if (!w.packed || !w.block_scales || (outputs && !outputs[i])) return Status::error(name + ": null pointer");
    if (w.cols != weights[0]->cols) return Status::error(name + ": the weights of one launch share in_features");
    if (w.rows < 1 || w.rows > INT32_MAX / 2) return Status::error(name + ": bad out_features");
    if (reinterpret_cast<uintptr_t>(w.packed) % 16) return Status::error(name + ": weights must be 16-byte aligned");
    const float scale_2 = input_scale > 0.0f ? w.weight_scale_2 * input_scale : w.weight_scale_2;
    p.seg[i] = {w.packed, w.block_scales, scale_2 * WEIGHT_DECODE_EPILOGUE, outputs ? outputs[i] : nullptr, int(w.rows),
                tiles};
    tiles += int((w.rows + 15) / 16);
  }
  return Status::ok();
}

}  // namespace skinny_dense

Status skinny_linear_quantizing(const uint16_t* x, const DeviceNvfp4Weight* const* weights, float* const* outputs,
                                int count, float input_scale, uint16_t* x_hat_out, float* row_scale_out,
                                cudaStream_t stream) {
  DenseParams p{};
  int tiles = 0;
  NIB_RETURN_IF_ERROR(fill_segments(x, weights, outputs, count, input_scale, "skinny_linear_quantizing", p, tiles));
  const int64_t K = weights[0]->cols;
  if (!skinny_supported(K))
    return Status::error("skinny_linear_quantizing: in_features must be a multiple of 128 up to SKINNY_MAX_K");
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

// Warps a CTA (m16 tiles; 4 … 8) so that the busiest SM's share is smallest: CTAs spread evenly,
// ⌈CTAs / SMs⌉ of W warps each; ties to more warps (fewer x slices). q/k/v at Qwen3's shapes (320
// tiles, 4 splits): 5 warps, 256 CTAs (8 would put 160 CTAs on 132 SMs, 28 of them holding two).
static int split_warps(int tiles, int ranks) {
  const int sms = std::max(1, device_limits().sms);
  int best = SPLIT_MAX_WARPS, best_load = INT32_MAX;
  for (int w = SPLIT_MAX_WARPS; w >= 4; --w) {
    const int ctas = (tiles + w - 1) / w * ranks, load = (ctas + sms - 1) / sms * w;
    if (load < best_load) best = w, best_load = load;
  }
  return best;
}

static int split_n_tiles(int64_t M) { return M <= 8 ? 1 : M <= 16 ? 2 : M <= 32 ? 4 : M <= 48 ? 6 : 8; }

Status skinny_linear_split(const uint16_t* x, int64_t M, const DeviceNvfp4Weight* const* weights, float* const* outputs,
                           int count, const float* row_scales, cudaStream_t stream) {
  if (M <= 0 || M > SKINNY_SPLIT_MAX_M) return Status::error("skinny_linear_split: M must be in [1, 64]");
  DenseParams p{};
  int tiles = 0;
  NIB_RETURN_IF_ERROR(fill_segments(x, weights, outputs, count, 0.0f, "skinny_linear_split", p, tiles));
  NIB_RETURN_IF_ERROR(check_in_features(weights[0]->cols, true, "skinny_linear_split"));
  p.k_stride = p.k = int(weights[0]->cols), p.k_offset = 0, p.m = int(M), p.row_scales = row_scales;
  const int nt = split_n_tiles(M);
  const int splits = (p.k / 128 + SPLIT_BLOCKS - 1) / SPLIT_BLOCKS, ranks = std::min(splits, SPLIT_MAX_RANKS);
  const int warps = split_warps(tiles, ranks);
  const dim3 grid(unsigned(ranks), unsigned((tiles + warps - 1) / warps));
  const size_t smem = size_t(8 * nt) * SPLIT_ROW_BYTES;
  static_assert(8 * SPLIT_MAX_NT == SKINNY_SPLIT_MAX_M);
  auto kernel = nt == 1   ? skinny_dense_split_kernel<1>
                : nt == 2 ? skinny_dense_split_kernel<2>
                : nt == 4 ? skinny_dense_split_kernel<4>
                : nt == 6 ? skinny_dense_split_kernel<6>
                          : skinny_dense_split_kernel<8>;
  if (smem > 48 * 1024)
    NIB_RETURN_IF_ERROR(
        cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
                    "skinny_linear_split: shared memory"));
  return cuda_status(
      launch_pdl_cluster(kernel, grid, dim3(unsigned(warps * 32)), smem, unsigned(ranks), stream, p, tiles, splits),
      "skinny_linear_split");
}

}  // namespace nibble::cuda

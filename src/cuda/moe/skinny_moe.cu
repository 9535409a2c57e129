// The skinny NVFP4 MoE projections: gate_up (+SwiGLU) and down over group_by_expert's tile list,
// each warp's weight fragments loaded straight into registers (skinny_fragments.cuh; the k
// permutation is skinny_gemm.cu's, the expert weights in line order), the tokens of a tile as the
// mma's n dimension.
#include <algorithm>

#include "cuda/moe/moe_grouping.cuh"
#include "cuda/gemm/skinny_fragments.cuh"
#include "cuda/gemm/skinny_gemm.cuh"

namespace nibble::cuda {
namespace {

using namespace skinny;

struct MoeParams {
  const uint8_t* codes[2];  // gate_up: gate, up; down: [0]
  const uint8_t* scales[2];
  const float* global_scales[2];
  int n;  // weight rows per expert
  int k;
  const uint16_t* act;
  const int32_t* sorted_pairs;  // gate_up: source row of a sorted row = sorted_pairs[r] / top_k
  int top_k;
  float inv_top_k;            // 1 / top_k rounded
  const float* row_scales;    // W4A4: per source row
  const int32_t* tile_count;  // tile_offsets[experts]
  const int4* tiles;
  void* out;
  bool out_fp32;
};

// sorted_pairs[r] / top_k without an integer division by a variable (~25 instructions): for pair <
// 2²⁴ (launch_moe checks) float(pair) is exact and the float quotient within 2 / top_k of the true
// one (exact for top_k 1 and 2), so it truncates to it or one either side, and the remainder corrects it.
__device__ __forceinline__ int source_row(const MoeParams& p, int sorted_row) {
  if (!p.sorted_pairs) return sorted_row;
  const int pair = p.sorted_pairs[sorted_row];
  const int q = int(float(pair) * p.inv_top_k), rem = pair - q * p.top_k;
  return rem >= p.top_k ? q + 1 : rem < 0 ? q - 1 : q;
}

// Weight rows of one slice: GATED, the m16 tile is gate rows m0 … m0 + 7 (fragment rows g) over up
// rows of the same features (rows g + 8), so one lane ends with gate and up of feature m0 + g for its
// two token columns; otherwise rows m0 … m0 + 15 of the down weight. Rows past the weight read its
// last row (store_slice drops their features), or with NULL_PAST have null codes (zeros).
template <bool GATED, bool NULL_PAST>
__device__ __forceinline__ void slice_rows(const MoeParams& p, int expert, int m0, int g,
                                           const uint8_t* (&row_codes)[2], const uint8_t* (&row_scales)[2]) {
  const size_t code_row = size_t(p.k) / 2, scale_row = size_t(p.k) / 16;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int which = GATED ? h : 0;
    const int row = GATED ? m0 + g : m0 + g + 8 * h;
    const size_t base = size_t(expert) * p.n + min(row, p.n - 1);
    row_codes[h] = !NULL_PAST || row < p.n ? p.codes[which] + base * code_row : nullptr;
    row_scales[h] = p.scales[which] + base * scale_row;
  }
}

// The lane's token rows of a tile (8 · NT sorted rows from tile.y): rows past the tile read its last
// row (store_slice drops those columns), or with NULL_PAST are null (zero columns).
template <int NT, bool NULL_PAST>
__device__ __forceinline__ void token_rows(const MoeParams& p, int4 tile, int g, const uint16_t* (&x_rows)[NT]) {
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const int r = 8 * n + g;
    if constexpr (NULL_PAST)
      x_rows[n] = r < tile.z ? p.act + size_t(source_row(p, tile.y + r)) * p.k : nullptr;
    else
      x_rows[n] = p.act + size_t(source_row(p, tile.y + min(r, tile.z - 1))) * p.k;
  }
}

// Warp 0's epilogue: the summed accumulators of tile (expert, row0, rows) × slice m0, scaled (and
// SwiGLU'd when GATED) into the sorted output rows.
template <bool GATED, int NT>
__device__ __forceinline__ void store_slice(const MoeParams& p, int4 tile, int m0, const float (&acc)[NT][4]) {
  const int expert = tile.x, row0 = tile.y, rows = tile.z;
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  // Everything the outputs are scaled by, read before the first store: out may alias these pointers
  // for all ptxas knows, so each store would order the next column's reloads behind it.
  const float scale0 = p.global_scales[0][expert] * WEIGHT_DECODE_EPILOGUE;
  const float scale1 = GATED ? p.global_scales[1][expert] * WEIGHT_DECODE_EPILOGUE : 0.0f;
  float row_scales[2 * NT];
#pragma unroll
  for (int i = 0; i < 2 * NT; ++i) {
    const int r = 8 * (i >> 1) + 2 * c + (i & 1);
    row_scales[i] = p.row_scales && r < rows ? p.row_scales[source_row(p, row0 + r)] : 1.0f;
  }
#pragma unroll
  for (int i = 0; i < 2 * NT; ++i) {  // token columns 8n + 2c + j of n-tile n = i / 2
    const int n = i >> 1, j = i & 1, r = 8 * n + 2 * c + j;
    if (r >= rows) continue;
    const float row_scale = row_scales[i];
    const size_t out_row = size_t(row0 + r) * p.n;
#pragma unroll
    for (int h = 0; h < (GATED ? 1 : 2); ++h) {
      float value;
      int feature;
      if constexpr (GATED) {
        const float gate = acc[n][j] * scale0 * row_scale;
        const float up = acc[n][2 + j] * scale1 * row_scale;
        value = gate / (1.0f + expf(-gate)) * up;  // silu(gate) · up, as ref::silu_mul
        feature = m0 + g;
      } else {
        value = acc[n][2 * h + j] * scale0 * row_scale;
        feature = m0 + g + 8 * h;
      }
      if (feature >= p.n) continue;
      if (p.out_fp32)
        static_cast<float*>(p.out)[out_row + feature] = value;
      else
        static_cast<__nv_bfloat16*>(p.out)[out_row + feature] = __float2bfloat16_rn(value);
    }
  }
}

// Few pairs (8-row tiles, fewer than half a row per expert): one CTA per (slice, tile), blockIdx.x
// the slice (8 gated features or 16 down rows), blockIdx.y the tile; its warps split the k range,
// BLOCKS k-blocks each, and warp 0 sums them (reduce_warps) and stores the slice. FULL: every warp has
// BLOCKS k-blocks and every slice all its rows (launch_moe checks), so the loads need no guards, and a
// lane past the tile's rows reads its last row instead of a zero column (store_slice drops it):
// gate_up 1,056 → 976 instructions a warp at 2 k-blocks, 1,448 → 1,296 at 4 (SASS).
// (The explicit minimum of one CTA an SM matters: without it ptxas schedules the weight loads later,
// 86 → 54 registers for 4 k-blocks, half of them issued before the first mma.)
template <int BLOCKS, bool GATED, bool FULL>
__global__ void __launch_bounds__(MAX_WARPS * 32, 1) skinny_moe_split_kernel(const MoeParams p) {
  extern __shared__ float partial[];
  pdl_wait();  // the tile list comes from the routing kernels
  pdl_launch_dependents();
  const int4 tile = p.tiles[blockIdx.y];  // in bounds (the grid never exceeds the list); read with the count
  if (int(blockIdx.y) >= *p.tile_count) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int m0 = blockIdx.x * (GATED ? 8 : 16);
  const int kb0 = warp * BLOCKS, nkb = FULL ? BLOCKS : min(BLOCKS, p.k / 128 - kb0);
  WeightFragments<BLOCKS, true> w;
  const uint8_t* row_codes[2];
  const uint8_t* row_scales[2];
  slice_rows<GATED, !FULL>(p, tile.x, m0, g, row_codes, row_scales);
  if constexpr (FULL)
    w.load_all(row_codes, row_scales, kb0, c);
  else
    w.load(row_codes, row_scales, kb0, nkb, c);
  const uint16_t* x_rows[1];
  token_rows<1, !FULL>(p, tile, g, x_rows);
  float acc[1][4] = {};
  mma_blocks<BLOCKS, 1, !FULL, true>(w, x_rows, kb0, nkb, c, acc);
  if (!reduce_warps<1>(acc, partial)) return;
  store_slice<GATED, 1>(p, tile, m0, acc);
}

// One warp's whole k range for its slice (row_codes / row_scales, slice_rows) and NT n-tiles of the
// tile, WINDOW k-blocks of weight fragments in flight (block kb + WINDOW is loaded once block kb is
// done), then the epilogue. Rows and tokens past the weight or the tile read the last one (no
// guards); only the prefetch is predicated. Pointers advance a window at a time, so each block's
// loads take immediate offsets. L2_FETCH: load_stream's L2 fetch size.
// EARLY: the first window's weight loads are issued before the PDL wait (the kernel has not waited yet).
template <int WINDOW, bool GATED, int NT, int L2_FETCH, bool EARLY>
__device__ __forceinline__ void long_warp_slice(const MoeParams& p, int4 tile, int m0,
                                                const uint8_t* const (&row_codes)[2],
                                                const uint8_t* const (&row_scales)[2]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const uint8_t* code_at[2] = {row_codes[0] + 16 * c, row_codes[1] + 16 * c};
  const uint2* scale_at[2] = {reinterpret_cast<const uint2*>(row_scales[0]),
                              reinterpret_cast<const uint2*>(row_scales[1])};
  const uint32_t selector = line_scale_selector(c);  // load_scales<true>
  const uint16_t* x_rows[NT];
  token_rows<NT, false>(p, tile, g, x_rows);
  const uint4* x_at[NT];
#pragma unroll
  for (int n = 0; n < NT; ++n) x_at[n] = reinterpret_cast<const uint4*>(x_rows[n]) + x_chunk<true>(c, 0);
  const int nkb = p.k / 128;
  uint4 codes[2][WINDOW];
  uint32_t scales[2][WINDOW];
#pragma unroll
  for (int j = 0; j < WINDOW; ++j)
    if (j < nkb)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        codes[h][j] = load_stream<L2_FETCH>(code_at[h] + j * 64),
        scales[h][j] = load_line_scales<L2_FETCH>(scale_at[h] + j, selector);
  if constexpr (EARLY) {  // the activations (and the epilogue's row scales) come from the kernels before
    pdl_wait();
    pdl_launch_dependents();
  }
  float acc[NT][4] = {};
  for (int kb0 = 0; kb0 < nkb; kb0 += WINDOW) {
#pragma unroll
    for (int j = 0; j < WINDOW; ++j) {
      if (kb0 + j >= nkb) break;
      uint4 xv[NT][4];
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int q = 0; q < 4; ++q) xv[n][q] = __ldg(x_at[n] + j * 16 + x_chunk<true>(0, q));  // 128 values a block
      mma_kblock<NT, true>({codes[0][j], codes[1][j]}, {scales[0][j], scales[1][j]}, xv, acc);
      if (kb0 + j + WINDOW < nkb)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          codes[h][j] = load_stream<L2_FETCH>(code_at[h] + (j + WINDOW) * 64),
          scales[h][j] = load_line_scales<L2_FETCH>(scale_at[h] + j + WINDOW, selector);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) code_at[h] += WINDOW * 64, scale_at[h] += WINDOW;
#pragma unroll
    for (int n = 0; n < NT; ++n) x_at[n] += WINDOW * 16;
  }
  store_slice<GATED, NT>(p, tile, m0, acc);
}

// Long warps: a CTA of 4 warps takes 4 adjacent slices of one tile (blockIdx.x: the group of slices,
// blockIdx.y the tile) and each warp walks the whole k range of its slice alone (long_warp_slice).
// The split kernel above gives each warp 2-4 k-blocks, and its fixed work — addresses, token rows, the
// k-split sum through shared memory, the epilogue — was about half of what a warp executed at T = 64
// (docs/lab/perf-notebook.md, "where the mid-batch MoE's time goes"); here it is paid once per slice, and the four
// warps read the same x rows at about the same time (L1 hits for three). A tile takes only the n-tiles
// its rows fill (a 16- or 32-row tile of at most 8 rows one, of at most 16 two), so the tiles can be
// tall enough that an expert's rows rarely need a second tile's weight reads, and the x loads and mma
// of empty n-tiles are skipped.
// The down projection's first weights are loaded before its PDL wait: its tile list is the routing
// kernels' (at least two launches back, complete before gate_up's wait returned, so before this grid
// started; read through L2 with ld.cg, never from an L1 line an earlier layer's launch left there) and
// its weights are constants, so they stream in while gate_up (or the SwiGLU quantize) drains. gate_up's
// tile list is its own predecessor's output: it waits first.
template <int WINDOW, bool GATED, int NT, int MIN_CTAS, int L2_FETCH, bool EARLY>
__global__ void __launch_bounds__(128, MIN_CTAS) skinny_moe_long_kernel(const MoeParams p) {
  static_assert(!(GATED && EARLY), "gate_up's tile list is its predecessor's output");
  if constexpr (!EARLY) {
    pdl_wait();  // the tile list comes from the routing kernels
    pdl_launch_dependents();
  }
  const int4 tile = EARLY ? __ldcg(p.tiles + blockIdx.y) : p.tiles[blockIdx.y];
  if (int(blockIdx.y) >= (EARLY ? __ldcg(p.tile_count) : *p.tile_count)) return;
  constexpr int M_TILE = GATED ? 8 : 16;
  const int m0 = (blockIdx.x * 4 + (threadIdx.x >> 5)) * M_TILE;
  if (m0 >= p.n) return;
  const uint8_t* row_codes[2];
  const uint8_t* row_scales[2];
  slice_rows<GATED, false>(p, tile.x, m0, (threadIdx.x & 31) >> 2, row_codes, row_scales);
  if (NT >= 2 && tile.z <= 8)
    long_warp_slice<WINDOW, GATED, 1, L2_FETCH, EARLY>(p, tile, m0, row_codes, row_scales);
  else if (NT == 4 && tile.z <= 16)
    long_warp_slice<WINDOW, GATED, 2, L2_FETCH, EARLY>(p, tile, m0, row_codes, row_scales);
  else
    long_warp_slice<WINDOW, GATED, NT, L2_FETCH, EARLY>(p, tile, m0, row_codes, row_scales);
}

template <bool GATED>
Status launch_moe(const GroupedGemmArgs& a, const DeviceNvfp4Experts& w0, const DeviceNvfp4Experts* w1,
                  cudaStream_t stream) {
  const char* what = GATED ? "skinny_moe_gate_up" : "skinny_moe_down";
  NIB_RETURN_IF_ERROR(check_in_features(w0.cols, false, what));
  if (!a.act || !a.tile_offsets || !a.tiles || !a.out || !w0.packed || !w0.block_scales || !w0.global_scales)
    return Status::error(std::string(what) + ": null pointer");
  if (a.tile_rows != 8 && a.tile_rows != 16 && a.tile_rows != 32)
    return Status::error(std::string(what) +
                         ": the grouping must use tiles of 8, 16 or 32 rows (skinny_moe_tile_rows)");
  if (reinterpret_cast<uintptr_t>(a.act) % 16 || reinterpret_cast<uintptr_t>(w0.packed) % 16 ||
      reinterpret_cast<uintptr_t>(w0.block_scales) % 8)
    return Status::error(std::string(what) + ": activations and weights must be 16-byte aligned (scale codes 8)");
  if (a.pairs <= 0) return Status::ok();
  if (a.pairs >= int64_t{1} << 24)
    return Status::error(std::string(what) + ": more than 2^24 rows (source_row's float quotient)");
  MoeParams p{};
  p.codes[0] = w0.packed, p.scales[0] = w0.block_scales, p.global_scales[0] = w0.global_scales;
  if (w1) p.codes[1] = w1->packed, p.scales[1] = w1->block_scales, p.global_scales[1] = w1->global_scales;
  p.n = int(w0.rows), p.k = int(w0.cols);
  p.act = a.act, p.sorted_pairs = a.sorted_pairs, p.top_k = int(a.top_k), p.row_scales = a.row_scales;
  p.inv_top_k = 1.0f / float(a.top_k);
  p.tile_count = a.tile_offsets + w0.experts, p.tiles = a.tiles;
  p.out = a.out, p.out_fp32 = a.out_fp32;
  const int nt = a.tile_rows / 8;
  const int64_t max_tiles = max_expert_tiles(a.pairs, w0.experts, a.tile_rows);
  constexpr int SLICE_ROWS = GATED ? 8 : 16;  // gated features, or down rows, of a slice
  const int slices = (p.n + SLICE_ROWS - 1) / SLICE_ROWS;
  using Kernel = void (*)(MoeParams);
  // Long warps from half a row per expert on average (and for any taller tiles): S_TG b16 +17% (H200).
  // Below it the split kernels: one warp a slice would leave too few warps to keep loads in flight.
  if (nt > 1 || 2 * a.pairs >= w0.experts) {
    const dim3 grid{unsigned((slices + 3) / 4), unsigned(max_tiles)};
    // More warps beat a deeper window: one block ahead for 16- and 32-row tiles, two for 8-row ones;
    // 8 CTAs an SM, 4 for 32-row tiles. 8-row tiles ask the L2 for 128-byte runs (MoE block T = 16 −3%;
    // nothing from 16 rows up).
    auto pick = [&]<bool EARLY>() -> Kernel {
      return nt == 4   ? skinny_moe_long_kernel<1, GATED, 4, 4, 0, EARLY>
             : nt == 2 ? skinny_moe_long_kernel<1, GATED, 2, 8, 0, EARLY>
                       : skinny_moe_long_kernel<2, GATED, 1, 8, 128, EARLY>;
    };
    // Down issues its first weight window before its PDL wait; gate_up cannot (its tile list is its
    // predecessor's output).
    const Kernel kernel = pick.template operator()<!GATED>();
    return cuda_status(launch_pdl(kernel, grid, dim3(128), 0, stream, p), what);
  }
  // The unguarded split kernels (FULL) wherever the shape gives every warp its k-blocks and every
  // slice its rows (all the models' shapes: S_TG b16 +2%); the guarded ones for other shapes.
  const int per_warp = blocks_per_warp(p.k, false, 1);
  const bool full = p.n % SLICE_ROWS == 0 && (p.k / 128) % per_warp == 0;
  const Kernel kernel =
      per_warp == 4 ? (full ? skinny_moe_split_kernel<4, GATED, true> : skinny_moe_split_kernel<4, GATED, false>)
                    : (full ? skinny_moe_split_kernel<2, GATED, true> : skinny_moe_split_kernel<2, GATED, false>);
  return launch(kernel, dim3(unsigned(slices), unsigned(max_tiles)), p.k, per_warp, 1, p, stream, what);
}

}  // namespace

// 8-row tiles below 3 rows per expert, 16 below 16, then 32: 16-row tiles from 3 rather than 4 rows
// spare the busier experts a second 8-row tile (S_TG b56 +1%, H200); from 2 lost 2%.
int skinny_moe_tile_rows(int64_t pairs, int64_t experts) {
  return pairs < 3 * experts ? 8 : pairs < 16 * experts ? 16 : 32;
}

Status skinny_moe_gate_up(const GroupedGemmArgs& args, const DeviceNvfp4Experts& gate, const DeviceNvfp4Experts& up,
                          cudaStream_t stream) {
  if (up.experts != gate.experts || up.rows != gate.rows || up.cols != gate.cols || !up.packed)
    return Status::error("skinny_moe_gate_up: gate and up weights differ in shape");
  return launch_moe<true>(args, gate, &up, stream);
}

Status skinny_moe_down(const GroupedGemmArgs& args, const DeviceNvfp4Experts& down, cudaStream_t stream) {
  if (args.sorted_pairs)
    return Status::error("skinny_moe_down: reads the sorted rows directly (sorted_pairs must be null)");
  return launch_moe<false>(args, down, nullptr, stream);
}

}  // namespace nibble::cuda

// The launches of the NVFP4 × BF16 wgmma GEMMs (nvfp4_wgmma.cuh): the copy engine's tensor maps, the
// kernel's shape for a tile height (MMA width, m-tiles, consumer warpgroups, two CTAs an SM), and the
// grouped (MoE) and dense entry points. The kernel itself: nvfp4_wgmma_kernel.cuh.
#include <algorithm>
#include <string>

#include "cuda/common/check.cuh"
#include "cuda/gemm/nvfp4_wgmma_kernel.cuh"

namespace nibble::cuda {
namespace {

// The copy engine's maps of the line-order code tensors (rows × in_features / 2 bytes; boxes of one
// 16-byte lane slot × box_rows), kept per tensor: graph captures and replays see the same maps, and
// /update_weights_from_disk loads in place (same addresses and shapes).
Status set_code_maps(Params& p, int box_rows, int projections) {
  for (int w = 0; w < projections; ++w)
    NIB_RETURN_IF_ERROR(cached_tensor_map(
        {CU_TENSOR_MAP_DATA_TYPE_UINT8, p.codes[w], uint64_t(p.k / 2), uint64_t(p.experts) * uint64_t(p.n),
         uint64_t(p.k / 2), 16, uint32_t(box_rows), CU_TENSOR_MAP_SWIZZLE_NONE},
        &p.code_maps[w]));
  return Status::ok();
}

// The activations of a GEMM whose rows are in order (down, dense) as a BF16 tensor of act_rows × k:
// boxes of 64 k × 32 rows in the 128-byte swizzle wgmma reads. Encoded each launch (the rows change
// with the batch; a capture keeps the map it was launched with, for the same buffers and rows).
Status set_act_map(Params& p) {
  return encode_tensor_map({CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, p.act, uint64_t(p.k), uint64_t(p.act_rows),
                            uint64_t(p.k) * 2, BK, 32, CU_TENSOR_MAP_SWIZZLE_128B},
                           &p.act_map);
}

template <bool GATED, int N, bool LINE, int WG, int TMA, bool FRAG = false>
Status launch_kernel(Params p, int64_t row_tiles, cudaStream_t stream) {
  auto kernel = nvfp4_wgmma_kernel<GATED, N, LINE, WG, TMA, FRAG>;
  if constexpr ((TMA & 1) != 0) NIB_RETURN_IF_ERROR(set_code_maps(p, BM<WG> / (GATED ? 2 : 1), GATED ? 2 : 1));
  if constexpr ((TMA & 2) != 0) NIB_RETURN_IF_ERROR(set_act_map(p));
  constexpr int bytes = Layout<N, LINE, WG>::BYTES;
  // Set once per instantiation and process, not per launch.
  static const cudaError_t limit = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  NIB_RETURN_IF_ERROR(cuda_status(limit, "wgmma gemm: shared memory"));
  const int rows_per_cta = GATED ? BM<WG> / 2 : BM<WG>;
  p.slices = (p.n + rows_per_cta - 1) / rows_per_cta;
  const int64_t items = int64_t{p.slices} * row_tiles;  // the host's bound: the device knows the tile count
  if (items > INT32_MAX) return Status::error("wgmma gemm: more than 2^31 work items");
  // Persistent: CTAS_PER_SM CTAs an SM walk the items (pp2048 +5% against a CTA an item, H200).
  int device = 0, sms = 0;
  NIB_RETURN_IF_ERROR(cuda_status(cudaGetDevice(&device), "wgmma gemm: device"));
  NIB_RETURN_IF_ERROR(
      cuda_status(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "wgmma gemm: SMs"));
  const int64_t grid = std::min<int64_t>(items, int64_t{sms} * CTAS_PER_SM<N>);
  // With PDL: the barrier set-up overlaps the previous kernel's tail (pp2048 +1.8%, docs/lab/perf-notebook.md).
  return cuda_status(launch_pdl(kernel, dim3(unsigned(grid)), dim3(CONSUMER_THREADS<WG> + PRODUCERS), bytes, stream, p),
                     GATED ? "wgmma gate_up launch" : "wgmma gemm launch");
}

// The copy engine (TMA) brings line-order expert codes and activations whose rows are in order (down's
// input, dense x); the producers' cp.async copies the rest. H200 (docs/lab/perf-notebook.md), against cp.async for
// both: MoE block T = 512 304 -> 272 µs, 8,192 1,529 -> 1,462. Dense weights are never in line order,
// expert weights are where in_features are a multiple of 128 (expert_line_order).
template <bool GATED, int N, int WG = 2>
Status launch_n(const Params& p, int64_t row_tiles, cudaStream_t stream) {
  // The copy engine: codes in line order; activations whose rows are in order (not gate_up's rows read
  // through sorted_pairs).
  const bool act = !p.sorted_pairs;
  if (p.line_order) {
    if (p.act_fragment_order)
      return act ? launch_kernel<GATED, N, true, WG, 3, true>(p, row_tiles, stream)
                 : launch_kernel<GATED, N, true, WG, 1, true>(p, row_tiles, stream);
    return act ? launch_kernel<GATED, N, true, WG, 3>(p, row_tiles, stream)
               : launch_kernel<GATED, N, true, WG, 1>(p, row_tiles, stream);
  }
  if (p.act_fragment_order) return Status::error("wgmma gemm: activations in fragment order need line-order codes");
  return act ? launch_kernel<GATED, N, false, WG, 2>(p, row_tiles, stream)
             : launch_kernel<GATED, N, false, WG, 0>(p, row_tiles, stream);
}

// Three consumer warpgroups on 128-row tiles: an expert's 16–95 rows leave each decoded weight few MMA
// columns, and two warps a scheduler could not hide the decode's latency (H200: MoE block T = 512 −11%;
// 256-row tiles have no registers for a third). Two m-tiles a warpgroup lost (docs/lab/perf-notebook.md).
template <bool GATED>
Status launch(const Params& p, int tile_rows, int64_t row_tiles, cudaStream_t stream) {
  switch (tile_rows) {
    case 32:
      return launch_n<GATED, 32>(p, row_tiles, stream);
    case 64:
      return launch_n<GATED, 64>(p, row_tiles, stream);
    case 128:
      return launch_n<GATED, 128, 3>(p, row_tiles, stream);
    case 256:
      return launch_n<GATED, 256>(p, row_tiles, stream);
    default:
      return Status::error("wgmma gemm: tile rows " + std::to_string(tile_rows) + " (32, 64, 128 or 256)");
  }
}

Status check_weight(const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t cols) {
  if (!packed || !scales) return Status::error("wgmma gemm: null weight pointer");
  if (!wgmma_supported(rows, cols) || rows > INT32_MAX || cols > INT32_MAX)
    return Status::error("wgmma gemm: weight [" + std::to_string(rows) + ", " + std::to_string(cols) +
                         "] needs in_features a multiple of 64");
  if (reinterpret_cast<uintptr_t>(packed) % 16 || reinterpret_cast<uintptr_t>(scales) % 4)
    return Status::error("wgmma gemm: weight is not 16-byte aligned");
  return Status::ok();
}

Status grouped(const GroupedGemmArgs& a, const DeviceNvfp4Experts& w0, const DeviceNvfp4Experts* w1,
               cudaStream_t stream) {
  NIB_RETURN_IF_ERROR(check_weight(w0.packed, w0.block_scales, w0.rows, w0.cols));
  if (w1 && (w1->rows != w0.rows || w1->cols != w0.cols || w1->experts != w0.experts))
    return Status::error("wgmma gate_up: gate and up weights differ in shape");
  if (!a.act || !a.tile_offsets || !a.tiles || !a.out || !w0.global_scales || (w1 && !w1->global_scales))
    return Status::error("wgmma moe gemm: null pointer");
  if (reinterpret_cast<uintptr_t>(a.act) % 16) return Status::error("wgmma moe gemm: activations not 16-byte aligned");
  if (a.pairs == 0) return Status::ok();
  // The producers keep activation rows' byte offsets in 32 bits.
  if (a.pairs * w0.cols * 2 >= (int64_t(1) << 32))
    return Status::error("wgmma moe gemm: rows · in_features · 2 bytes ≥ 2^32");
  Params p{};
  p.codes[0] = w0.packed, p.scales[0] = w0.block_scales, p.global_scales[0] = w0.global_scales;
  if (w1) p.codes[1] = w1->packed, p.scales[1] = w1->block_scales, p.global_scales[1] = w1->global_scales;
  p.n = int(w0.rows), p.k = int(w0.cols);
  p.act = a.act, p.sorted_pairs = a.sorted_pairs, p.top_k = int(a.top_k), p.row_scales = a.row_scales;
  p.tile_offsets = a.tile_offsets, p.tiles = a.tiles, p.experts = int(w0.experts);
  p.out = a.out, p.out_fp32 = a.out_fp32;
  p.act_rows = a.pairs;
  p.line_order = expert_line_order(w0.cols);
  p.act_fragment_order = a.act_fragment_order, p.out_fragment_order = a.out_fragment_order;
  if (a.out_fragment_order && (a.out_fp32 || p.n % 32 != 0))
    return Status::error("wgmma moe gemm: fragment-order outputs need BF16 rows of a multiple of 32");
  const int64_t row_tiles = max_expert_tiles(a.pairs, p.experts, a.tile_rows);
  return w1 ? launch<true>(p, a.tile_rows, row_tiles, stream) : launch<false>(p, a.tile_rows, row_tiles, stream);
}

}  // namespace

bool wgmma_fragment_order(int64_t in_features) { return expert_line_order(in_features); }

bool wgmma_supported(int64_t rows, int64_t cols) { return cols >= BK && cols % BK == 0 && rows >= 1; }

// From 96 rows per expert 256-row tiles win everywhere (H200). At ~32 the best height depends on the
// routing, which the host does not see; 128 is never more than 17% off the best (docs/lab/perf-notebook.md).
int wgmma_tile_rows(int64_t rows, int64_t experts) {
  const int64_t per_expert = rows / std::max<int64_t>(experts, 1);
  return per_expert >= 96 ? 256 : per_expert >= 16 ? 128 : per_expert >= 8 ? 64 : 32;
}

Status wgmma_moe_gate_up(const GroupedGemmArgs& a, const DeviceNvfp4Experts& gate, const DeviceNvfp4Experts& up,
                         cudaStream_t stream) {
  return grouped(a, gate, &up, stream);
}

Status wgmma_moe_down(const GroupedGemmArgs& a, const DeviceNvfp4Experts& down, cudaStream_t stream) {
  return grouped(a, down, nullptr, stream);
}

Status wgmma_linear(const uint16_t* x, int64_t M, const DeviceNvfp4Weight& w, float* y, const float* row_scales,
                    cudaStream_t stream) {
  NIB_RETURN_IF_ERROR(check_weight(w.packed, w.block_scales, w.rows, w.cols));
  if (!x || !y) return Status::error("wgmma linear: null activation or output");
  if (reinterpret_cast<uintptr_t>(x) % 16) return Status::error("wgmma linear: x not 16-byte aligned");
  if (M <= 0 || M * w.cols * 2 >= (int64_t(1) << 32))
    return Status::error("wgmma linear: M must be ≥ 1 with M · K · 2 bytes < 2^32");
  Params p{};
  p.codes[0] = w.packed, p.scales[0] = w.block_scales, p.scale = w.weight_scale_2;
  p.n = int(w.rows), p.k = int(w.cols), p.m = int(M);
  p.act = x, p.top_k = 1, p.row_scales = row_scales, p.act_rows = M;
  p.out = y, p.out_fp32 = true;
  const int tile_rows = wgmma_tile_rows(M, 1);
  return launch<false>(p, tile_rows, (M + tile_rows - 1) / tile_rows, stream);
}

}  // namespace nibble::cuda

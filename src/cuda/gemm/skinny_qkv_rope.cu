// q/k/v with the q/k norm, RoPE and KV store in the epilogue (skinny_qkv_rope.cuh). The grid is
// skinny_linear's (an m16 tile of one weight a CTA, the warps splitting k) in clusters of D / 16
// CTAs: one head's rows. Each CTA leaves its 16 rows' y (as skinny_linear would write them) in shared
// memory; after a cluster barrier rank 0 reads the head in qk_norm_rope_store's lane layout through
// distributed shared memory and runs its head code (norm_rope_head, store_pairs), a warp a token; a
// second barrier keeps the ranks' shared memory alive until it has read. One launch and one L2 round
// trip of the fp32 rows fewer a decode layer than skinny_linear + qk_norm_rope_store.
#include "cuda/gemm/skinny_qkv_rope.cuh"

#include <cooperative_groups.h>

#include <algorithm>
#include <string>

#include "cuda/common/check.cuh"
#include "cuda/common/device_context.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/gemm/skinny_dense.cuh"
#include "cuda/gemm/skinny_gemm.cuh"
#include "cuda/ops/qk_norm_rope_device.cuh"

namespace nibble::cuda {
namespace {

using namespace skinny;
using namespace skinny_dense;

constexpr int TILE_ROWS = 16;

template <typename KV>
struct RopeArgs {
  QkvLayout l;
  const uint16_t *q_norm, *k_norm;
  float eps;
  uint16_t* q_out;
  KV *k_cache, *v_cache;
  float k_scale, v_scale;
};

// PAIRS rotation pairs a lane: head_dim 64 · PAIRS, a cluster of 4 · PAIRS CTAs.
template <int BLOCKS, int PAIRS, typename KV>
__global__ void __launch_bounds__(MAX_WARPS * 32) skinny_qkv_rope_kernel(const DenseParams p, const RopeArgs<KV> r) {
  constexpr int D = 64 * PAIRS, HALF = D / 2;
  extern __shared__ float partial[];
  __shared__ float head_part[QKV_ROPE_MAX_M * TILE_ROWS];  // [token][row of the CTA's tile]
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int warps = int(blockDim.x) / 32, rank = int(cluster.block_rank());
  WeightFragments<BLOCKS> w;
  const DenseTile tile = load_dense_tile(p, w);
  const DenseSegment& seg = p.seg[tile.s];
  const int which = tile.s, head = tile.m0 / D;  // q, k or v (the launch's segments in that order)
  // Rank 0's norm weights and RoPE frequencies: constants, read before the wait.
  const int i0 = lane * PAIRS;
  const uint16_t* norm = which == 0 ? r.q_norm : r.k_norm;
  float w_lo[PAIRS] = {}, w_hi[PAIRS] = {}, freq[PAIRS] = {};
  if (rank == 0 && which < 2) {
    if (norm) load_pairs<PAIRS>(norm, i0, HALF, r.l.interleaved, w_lo, w_hi);
#pragma unroll
    for (int q = 0; q < PAIRS; ++q) freq[q] = r.l.inv_freq[i0 + q];
  }
  pdl_wait();
  pdl_launch_dependents();
  const uint16_t* x_rows[1] = {g < p.m ? p.x + size_t(g) * p.k_stride : nullptr};
  float acc[1][4] = {};
  mma_blocks<BLOCKS, 1>(w, x_rows, tile.kb0, tile.nkb, c, acc);
  if (reduce_warps<1>(acc, partial)) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // acc i: row g + 8·(i / 2), token column 2c + i % 2 (skinny_linear's y)
      const int t = 2 * c + (i & 1), row = g + 8 * (i >> 1);
      if (t < p.m)
        head_part[t * TILE_ROWS + row] = acc[0][i] * (p.row_scales ? seg.alpha * p.row_scales[t] : seg.alpha);
    }
  }
  cluster.sync();  // release / acquire: every rank's rows are visible to rank 0
  if (rank == 0) {
    const int kv_width = int(r.l.n_kv_heads) * D;
    for (int t = warp; t < p.m; t += warps) {
      // Row j of the head: rank j / 16's head_part[t][j % 16]; a lane's pairs as qk_norm_rope_store loads them.
      auto row = [&](int j) {
        return cluster.map_shared_rank(head_part, j / TILE_ROWS)[t * TILE_ROWS + j % TILE_ROWS];
      };
      float lo[PAIRS], hi[PAIRS];
#pragma unroll
      for (int q = 0; q < PAIRS; ++q)
        lo[q] = row(r.l.interleaved ? 2 * (i0 + q) : i0 + q),
        hi[q] = row(r.l.interleaved ? 2 * (i0 + q) + 1 : HALF + i0 + q);
      const int64_t slot = r.l.slots[t];
      if (which == 2) {  // v: stored as it is (an FP8 cache: / v_scale)
        if constexpr (sizeof(KV) == 1)
#pragma unroll
          for (int q = 0; q < PAIRS; ++q) lo[q] /= r.v_scale, hi[q] /= r.v_scale;
        store_pairs<PAIRS>(r.v_cache + slot * kv_width + head * D, i0, HALF, r.l.interleaved, lo, hi);
        continue;
      }
      float cos_p[PAIRS], sin_p[PAIRS], x0[PAIRS], x1[PAIRS];
      const float position = static_cast<float>(r.l.positions[t]);
#pragma unroll
      for (int q = 0; q < PAIRS; ++q) {
        sincosf(position * freq[q], &sin_p[q], &cos_p[q]);
        sin_p[q] *= r.l.rope_scaling, cos_p[q] *= r.l.rope_scaling;
      }
      norm_rope_head<PAIRS>(lo, hi, true, norm != nullptr, w_lo, w_hi, r.eps, float(D), cos_p, sin_p, x0, x1);
      if (which == 0) {
        store_pairs<PAIRS>(r.q_out + (int64_t(t) * r.l.n_heads + head) * D, i0, HALF, r.l.interleaved, x0, x1);
      } else {
        if constexpr (sizeof(KV) == 1)
#pragma unroll
          for (int q = 0; q < PAIRS; ++q) x0[q] /= r.k_scale, x1[q] /= r.k_scale;
        store_pairs<PAIRS>(r.k_cache + slot * kv_width + head * D, i0, HALF, r.l.interleaved, x0, x1);
      }
    }
  }
  cluster.sync();  // no rank leaves while rank 0 may still read its rows
}

template <typename KV>
Status launch_for(const DenseParams& p, int tiles, int per_warp, const QkvRopeStore& out, cudaStream_t stream) {
  RopeArgs<KV> r{out.layout, out.q_norm, out.k_norm, out.eps, out.q_out_bf16};
  r.k_cache = static_cast<KV*>(out.k_cache), r.v_cache = static_cast<KV*>(out.v_cache);
  r.k_scale = out.k_scale, r.v_scale = out.v_scale;
  using Kernel = void (*)(DenseParams, RopeArgs<KV>);
  const bool four = per_warp == 4, d128 = out.layout.head_dim == 128;
  const Kernel kernel = four ? (d128 ? skinny_qkv_rope_kernel<4, 2, KV> : skinny_qkv_rope_kernel<4, 1, KV>)
                             : (d128 ? skinny_qkv_rope_kernel<2, 2, KV> : skinny_qkv_rope_kernel<2, 1, KV>);
  const int warps = (p.k / 128 + per_warp - 1) / per_warp;
  // Shared memory for reduce_warps' sums, but over a quarter of an SM's (58 KB on Hopper): at most
  // three CTAs an SM, with room left for the attention kernel's CTAs, which PDL places beside them.
  // Four an SM (registers allow it) lost tg128 2.4% against the two-launch chain; capped at three,
  // the step gains 1.5-1.8% (H100; docs/lab/2026-12-07-qkv-rope.md).
  const size_t sums = size_t(warps - 1) * 4 * 32 * sizeof(float);
  const size_t smem = std::max(sums, size_t(device_limits().smem_per_sm / 4 + 1024));
  if (smem > 48 * 1024)
    NIB_RETURN_IF_ERROR(
        cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
                    "skinny_qkv_rope_store: shared memory"));
  const unsigned ranks = unsigned(out.layout.head_dim / TILE_ROWS);
  return cuda_status(
      launch_pdl_cluster(kernel, dim3(unsigned(tiles)), dim3(unsigned(warps * 32)), smem, ranks, stream, p, r),
      "skinny_qkv_rope_store");
}

}  // namespace

bool skinny_qkv_rope_supported(int64_t M, int64_t in_features, int64_t head_dim) {
  return M >= 1 && M <= QKV_ROPE_MAX_M && skinny_supported(in_features) && (head_dim == 64 || head_dim == 128);
}

Status skinny_qkv_rope_store(const uint16_t* x, int64_t M, const DeviceNvfp4Weight* const* qkv, const float* row_scales,
                             const QkvRopeStore& out, cudaStream_t stream) {
  const QkvLayout& l = out.layout;
  if (!skinny_qkv_rope_supported(M, qkv[0]->cols, l.head_dim))
    return Status::error("skinny_qkv_rope_store: needs 1-" + std::to_string(QKV_ROPE_MAX_M) +
                         " tokens, head_dim 64 or 128 and in_features a multiple of 128 up to " +
                         std::to_string(SKINNY_MAX_K));
  if (l.tokens != M)
    return Status::error("skinny_qkv_rope_store: " + std::to_string(M) + " tokens, the layout has " +
                         std::to_string(l.tokens));
  if (qkv[0]->rows != l.n_heads * l.head_dim || qkv[1]->rows != l.n_kv_heads * l.head_dim ||
      qkv[2]->rows != l.n_kv_heads * l.head_dim)
    return Status::error("skinny_qkv_rope_store: the weights' rows are not the layout's heads · head_dim");
  if (!out.q_out_bf16 || !out.k_cache || !out.v_cache || !l.inv_freq || !l.positions || !l.slots)
    return Status::error("skinny_qkv_rope_store: null pointer");
  if (out.kv_format == KvFormat::FP8 && !(out.k_scale > 0.0f && out.v_scale > 0.0f))
    return Status::error("skinny_qkv_rope_store: an FP8 cache's k_scale and v_scale must be > 0");
  // store_pairs writes runs of 2 · PAIRS values (PAIRS = head_dim / 64), as qk_norm_rope_store checks.
  const size_t run = size_t(l.head_dim / 32), kv_element = out.kv_format == KvFormat::FP8 ? 1 : 2;
  const auto aligned = [&](const void* ptr, size_t element) {
    return reinterpret_cast<uintptr_t>(ptr) % (run * element) == 0;
  };
  if (!aligned(out.q_out_bf16, 2) || !aligned(out.k_cache, kv_element) || !aligned(out.v_cache, kv_element))
    return Status::error("skinny_qkv_rope_store: q and the caches must be aligned to " + std::to_string(run) +
                         " elements");
  DenseParams p{};
  int tiles = 0;
  NIB_RETURN_IF_ERROR(skinny_dense::fill_segments(x, qkv, nullptr, 3, 0.0f, "skinny_qkv_rope_store", p, tiles));
  p.k_stride = p.k = int(qkv[0]->cols), p.k_offset = 0, p.m = int(M), p.row_scales = row_scales;
  const int per_warp = blocks_per_warp(p.k, true, 1);
  return out.kv_format == KvFormat::FP8 ? launch_for<uint8_t>(p, tiles, per_warp, out, stream)
                                        : launch_for<uint16_t>(p, tiles, per_warp, out, stream);
}

}  // namespace nibble::cuda

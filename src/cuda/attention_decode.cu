// The attention half of a decode layer for one token in one launch (attention_decode.cuh). CTA c
// owns o-projection features 16c … 16c + 15 and a share of the q/k/v m-tiles; the copy engine brings
// in both weight slices before the PDL wait (they are constants), so the weights stream while the
// previous kernel ends. Phases, with a grid barrier after each: q/k/v from the staged tiles → (KV
// head, split) per CTA: q/k norm + RoPE, the new K/V stored, 16-key blocks a warp on mma.sync (the
// cached keys prefetched into L2 before the wait) → the splits' merge, 32 outputs a CTA → the o
// projection. Fragments and k order: skinny_gemm.cu's; attention: decode_attention_device.cuh's.
#include "cuda/attention_decode.cuh"

#include <cuda_bf16.h>

#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <string>

#include "cuda/async_copy.cuh"
#include "cuda/check.cuh"
#include "cuda/decode_attention_device.cuh"
#include "cuda/decode_block.cuh"
#include "cuda/nvfp4_act_quant.cuh"
#include "cuda/nvfp4_layout.h"
#include "cuda/pdl.cuh"
#include "cuda/phase_stamps.cuh"
#include "cuda/qk_norm_rope_device.cuh"

namespace nibble::cuda {
namespace {

using namespace decode_block;
using namespace decode_attention_device;

constexpr int WARPS = 8, THREADS = WARPS * 32;
constexpr int FEATURES = 16;      // o-projection outputs of a CTA: one m16 tile
constexpr int MAX_QKV_TILES = 4;  // q/k/v m-tiles a CTA (Qwen3-30B-A3B: 320 over 128 CTAs, 2 or 3)
constexpr int PAIRS = 2;          // RoPE pairs a lane: D / 2 over 32 lanes
constexpr int MAX_OUT = 4;        // merge outputs a lane (n_out ≤ 128)
constexpr int STATIC_SMEM = 1024;

// Shared memory: the q/k/v m-tiles and the o tile as they lie in global memory (load_kblock's
// layout), the GEMV input row, the k-split sums, the CTA's group of q rows + k + v (fp32, then q
// after RoPE in BF16), and each warp's softmax state (later the merge's).
struct Layout {
  int qkv_tile, o_off, x_off, sums_off, stage_off, q_off, soft_off, bytes;
};
__host__ __device__ inline Layout block_layout(int hidden, int width, int cta_tiles, int group) {
  Layout l;
  l.qkv_tile = tile_bytes(hidden);
  l.o_off = cta_tiles * l.qkv_tile;
  l.x_off = l.o_off + tile_bytes(width);
  l.sums_off = l.x_off + (hidden > width ? hidden : width) * 2;
  l.stage_off = l.sums_off + WARPS * 4 * 32 * 4;
  l.q_off = l.stage_off + (group + 2) * D * 4;
  l.soft_off = l.q_off + group * D * 2;
  l.bytes = l.soft_off + WARPS * MAX_GROUP * (D + 2) * 4;
  return l;
}

struct SoftShared {  // at soft_off: the warps' softmax states (store_softmax's arrays)
  float m[WARPS][MAX_GROUP], l[WARPS][MAX_GROUP];
  float o[WARPS][MAX_GROUP][D];
};
struct MergeShared {  // the same bytes in the merge phase
  float m[WARPS], l[WARPS];
  float o[WARPS][32 * MAX_OUT];
};

struct BlockParams {
  const uint16_t* x;
  const float* x_row_scale;  // W4A4: x is x̂, this its row scale; null: W4A16
  float* out;
  int o_quant;               // the o projection's input: 0 as it is, 1 static (o_input_scale), 2 per-token
  float o_input_scale;
  const uint8_t* codes[4];  // q, k, v, o
  const uint8_t* scales[4];
  float alpha[4];           // weight_scale_2 · WEIGHT_DECODE_EPILOGUE
  const uint16_t *q_norm, *k_norm;
  const float* inv_freq;
  bool interleaved;
  float eps, scale_log2;
  const int32_t *positions, *token_seq, *block_tables;
  const int64_t* slots;
  int max_blocks, page_size;
  uint16_t *k_cache, *v_cache;
  int hidden, n_heads, n_kv_heads, tiles, cta_tiles;  // tiles: the q/k/v m-tiles of all CTAs
  float* qkv;       // fp32 [(n_heads + 2 · n_kv_heads) · D]
  float* partials;  // fp32 [CTAs, group, D + 2]: m, l, o of each head of a split
  uint16_t* attn;   // BF16 [n_heads · D]
  unsigned* barrier;
  long long* stamps;  // NIBBLE_DECODE_BLOCK_TIMING=1: [CTAs, STAMPS] clock64 at each phase's end; else null
};

// Phases of attention_decode_kernel, timed when stamps are asked for (attention_decode_block_timing).
constexpr int STAMPS = 9;
constexpr const char* STAMP_NAMES[STAMPS] = {"start",         "input ready", "q/k/v",   "barrier 1", "q/k norm + RoPE",
                                            "attention",     "barrier 2",   "merge (+ barrier 3)", "o projection"};

// Which of q, k, v (0, 1, 2) the q/k/v m-tile starting at row0 of their concatenation belongs to, and
// its first row there (their rows are multiples of 16: no tile straddles two).
__device__ __forceinline__ int qkv_weight(int row0, int q_rows, int kv_rows, int& local) {
  const int w = row0 < q_rows ? 0 : row0 < q_rows + kv_rows ? 1 : 2;
  local = row0 - (w == 0 ? 0 : w == 1 ? q_rows : q_rows + kv_rows);
  return w;
}

// Warp 0's lanes hand the copy engine the CTA's weights: each q/k/v m-tile (codes, then scale codes:
// two runs) signalling landed[t], the o tile landed[MAX_QKV_TILES].
__device__ __forceinline__ void copy_weights(const BlockParams& p, const Layout& L, uint8_t* smem, int t0, int my_tiles,
                                             uint64_t* landed) {
  const int lane = threadIdx.x & 31, H = p.hidden, width = p.n_heads * D, kv_rows = p.n_kv_heads * D;
  if (lane == 0) {
    for (int t = 0; t < my_tiles; ++t) barrier_arrive_expect_tx(&landed[t], uint32_t(L.qkv_tile));
    barrier_arrive_expect_tx(&landed[MAX_QKV_TILES], uint32_t(tile_bytes(width)));
  }
  for (int r = lane; r < 2 * my_tiles + 2; r += 32) {
    const bool scales = r & 1;
    if (r < 2 * my_tiles) {
      int local;
      const int t = r >> 1, w = qkv_weight(16 * (t0 + t), width, kv_rows, local);
      uint8_t* tile = smem + t * L.qkv_tile;
      // Selects, not p.codes[w]: a parameter array indexed at run time goes through local memory.
      const uint8_t* codes = w == 0 ? p.codes[0] : w == 1 ? p.codes[1] : p.codes[2];
      const uint8_t* scale_codes = w == 0 ? p.scales[0] : w == 1 ? p.scales[1] : p.scales[2];
      bulk_copy_to_shared(scales ? tile + 16 * (H / 2) : tile,
                          scales ? scale_codes + size_t(local) * (H / 16) : codes + size_t(local) * (H / 2),
                          uint32_t(scales ? 16 * (H / 16) : 16 * (H / 2)), &landed[t]);
    } else {
      const size_t row0 = size_t(FEATURES) * blockIdx.x;
      uint8_t* tile = smem + L.o_off;
      bulk_copy_to_shared(scales ? tile + 16 * (width / 2) : tile,
                          scales ? p.scales[3] + row0 * (width / 16) : p.codes[3] + row0 * (width / 2),
                          uint32_t(scales ? 16 * (width / 16) : 16 * (width / 2)), &landed[MAX_QKV_TILES]);
    }
  }
}

// W4A4: the o projection's input row in shared memory (BF16, `width` values) → its x̂ in place, a
// thread per 16-value block, as quantize_dequantize_activation_bf16 makes it (static: input_scale;
// per-token, 0: from the row's amax, which the CTA holds whole). Returns the row scale, which the
// GEMM epilogue multiplies in. Every thread calls it; partial: WARPS floats of shared memory.
__device__ __forceinline__ float quantize_stage(uint16_t* row, int width, float input_scale, float* partial) {
  constexpr int MAX_BLOCKS = 4;  // a thread's blocks: width ≤ 16 · 4 · THREADS
  float amax[MAX_BLOCKS], thread_amax = 0.0f;
#pragma unroll
  for (int j = 0; j < MAX_BLOCKS; ++j) {
    const int b = int(threadIdx.x) + j * THREADS;
    amax[j] = 0.0f;
    if (b >= width / 16) continue;
    for (int i = 0; i < 16; ++i) amax[j] = fmaxf(amax[j], fabsf(__uint_as_float(uint32_t(row[16 * b + i]) << 16)));
    thread_amax = fmaxf(thread_amax, amax[j]);
  }
  const float row_amax = input_scale == 0.0f ? cta_max(thread_amax, partial) : 0.0f;
  float global, row_scale;
  act_row_scales(input_scale, row_amax, global, row_scale);
#pragma unroll
  for (int j = 0; j < MAX_BLOCKS; ++j) {
    const int b = int(threadIdx.x) + j * THREADS;
    if (b >= width / 16) continue;
    const ActBlockScale scale(amax[j], global);
    for (int i = 0; i < 16; ++i) row[16 * b + i] = uint16_t(scale.bf16(__uint_as_float(uint32_t(row[16 * b + i]) << 16)));
  }
  __syncthreads();
  return row_scale;
}

__global__ void __launch_bounds__(THREADS, 1) attention_decode_kernel(const BlockParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ uint64_t landed[MAX_QKV_TILES + 1];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int cta = blockIdx.x, ctas = gridDim.x;
  // width: the attention row (n_heads · D), also the q rows of the q/k/v concatenation.
  const int H = p.hidden, NKV = p.n_kv_heads, group = p.n_heads / NKV, width = p.n_heads * D, kv_rows = NKV * D;
  const Layout L = block_layout(H, width, p.cta_tiles, group);
  const int t0 = cta * p.tiles / ctas, my_tiles = (cta + 1) * p.tiles / ctas - t0;

  // Before the PDL wait (constants and the staged step): the weights in flight, the cached keys
  // toward L2, the norm weights and RoPE frequencies in registers.
  if (threadIdx.x == 0) {
    for (int t = 0; t <= MAX_QKV_TILES; ++t) barrier_init(&landed[t], 1);
    fence_barrier_init();
  }
  __syncthreads();
  if (warp == 0) copy_weights(p, L, smem, t0, my_tiles, landed);
  const int ctx = p.positions[0] + 1, splits = ctas / NKV, kv_head = cta / splits, split = cta % splits;
  // Each split a whole number of 16-key blocks; a short context leaves the last splits empty.
  const int chunk = ((ctx + splits - 1) / splits + BLOCK_KEYS - 1) / BLOCK_KEYS * BLOCK_KEYS;
  const int active_splits = (ctx + chunk - 1) / chunk;
  const int key0 = split * chunk, key_end = min(ctx, key0 + chunk);
  const int32_t* table = p.block_tables + int64_t(p.token_seq[0]) * p.max_blocks;
  const int64_t key_stride = int64_t(NKV) * D, slot = p.slots[0];
  for (int i = threadIdx.x; i < (key_end - key0) * 4; i += THREADS) {  // a key's K and V rows: two 128-byte lines each
    const int key = key0 + i / 4;
    if (key == ctx - 1) continue;  // this launch writes it
    const int64_t row = (int64_t(table[key / p.page_size]) * p.page_size + key % p.page_size) * key_stride + kv_head * D;
    const uint16_t* line = (i & 2 ? p.v_cache : p.k_cache) + row + (i & 1) * 64;
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(line));
  }
  const int i0 = lane * PAIRS;
  float qw_lo[PAIRS] = {}, qw_hi[PAIRS] = {}, kw_lo[PAIRS] = {}, kw_hi[PAIRS] = {}, freq[PAIRS];
  if (p.q_norm) load_pairs<PAIRS>(p.q_norm, i0, D / 2, p.interleaved, qw_lo, qw_hi);
  if (p.k_norm) load_pairs<PAIRS>(p.k_norm, i0, D / 2, p.interleaved, kw_lo, kw_hi);
#pragma unroll
  for (int q = 0; q < PAIRS; ++q) freq[q] = p.inv_freq[i0 + q];
  phase_stamp(p.stamps, STAMPS, 0);
  pdl_wait();
  unsigned generation = 0;  // thread 0's: the barriers passed
  if (threadIdx.x == 0) generation = first_generation(p.barrier);

  // q/k/v: `split_w` warps share an m-tile's k-blocks.
  uint16_t* x_stage = reinterpret_cast<uint16_t*>(smem + L.x_off);
  float* sums = reinterpret_cast<float*>(smem + L.sums_off);
  for (int i = threadIdx.x; i < H / 8; i += THREADS) reinterpret_cast<uint4*>(x_stage)[i] = __ldcg(reinterpret_cast<const uint4*>(p.x) + i);
  __syncthreads();
  phase_stamp(p.stamps, STAMPS, 1);
  {
    const int split_w = max(1, WARPS / max(1, my_tiles)), part = warp % split_w, t = warp / split_w;
    const bool active = t < my_tiles;
    const int kb_total = H / 128, kb_per = (kb_total + split_w - 1) / split_w;
    float acc[1][4] = {};
    if (active) {
      barrier_wait(&landed[t], 0);
      tile_mma(smem + t * L.qkv_tile, H, g == 0 ? x_stage : nullptr, part * kb_per, min(kb_total, (part + 1) * kb_per), acc);
    }
    sum_split(acc, split_w, active, sums);
    if (active && part == 0 && c == 0) {  // token column 0: acc[0] row g, acc[2] row g + 8
      int local;
      const int row0 = 16 * (t0 + t), w = qkv_weight(row0, width, kv_rows, local);
      // W4A4: (alpha · row scale), as the skinny kernel's epilogue applies the norm's row scale.
      const float alpha = (w == 0 ? p.alpha[0] : w == 1 ? p.alpha[1] : p.alpha[2]) * (p.x_row_scale ? __ldcg(p.x_row_scale) : 1.0f);
      p.qkv[row0 + g] = acc[0][0] * alpha;
      p.qkv[row0 + g + 8] = acc[0][2] * alpha;
    }
  }
  phase_stamp(p.stamps, STAMPS, 2);
  grid_barrier(p.barrier, ctas, generation);
  phase_stamp(p.stamps, STAMPS, 3);

  // Attention of (kv_head, split): the group's q rows, k and v into shared memory; a warp a head for
  // the norm + RoPE (qk_norm_rope_store's bits), the split holding the newest key stores its K/V.
  SoftShared& soft = *reinterpret_cast<SoftShared*>(smem + L.soft_off);
  if (key0 >= ctx) phase_stamp(p.stamps, STAMPS, 4);  // no keys: the phases after barrier 1 are empty
  if (key0 < ctx) {
    float* stage = reinterpret_cast<float*>(smem + L.stage_off);
    uint16_t* q_stage = reinterpret_cast<uint16_t*>(smem + L.q_off);
    for (int i = threadIdx.x; i < (group + 2) * D / 4; i += THREADS) {
      const int row = i / (D / 4), col = (i % (D / 4)) * 4;
      const float* src = row < group    ? p.qkv + (kv_head * group + row) * D
                         : row == group ? p.qkv + width + kv_head * D
                                        : p.qkv + width + kv_rows + kv_head * D;
      reinterpret_cast<float4*>(stage)[i] = __ldcg(reinterpret_cast<const float4*>(src + col));
    }
    __syncthreads();
    float cos_p[PAIRS], sin_p[PAIRS];
#pragma unroll
    for (int q = 0; q < PAIRS; ++q) sincosf(float(ctx - 1) * freq[q], &sin_p[q], &cos_p[q]);
    const bool newest = ctx - 1 < key_end;
    for (int item = warp; item < group + (newest ? 2 : 0); item += WARPS) {
      float lo[PAIRS], hi[PAIRS];
      load_pairs<PAIRS>(stage + item * D, i0, D / 2, p.interleaved, lo, hi);
      uint16_t* kv_row = (item == group ? p.k_cache : p.v_cache) + slot * key_stride + kv_head * D;
      if (item == group + 1) {  // v: stored as it is
        store_pairs<PAIRS>(kv_row, i0, D / 2, p.interleaved, lo, hi);
        continue;
      }
      const bool is_q = item < group;
      float x0[PAIRS], x1[PAIRS];
      norm_rope_head<PAIRS>(lo, hi, true, (is_q ? p.q_norm : p.k_norm) != nullptr, is_q ? qw_lo : kw_lo, is_q ? qw_hi : kw_hi,
                            p.eps, float(D), cos_p, sin_p, x0, x1);
      store_pairs<PAIRS>(is_q ? q_stage + item * D : kv_row, i0, D / 2, p.interleaved, x0, x1);  // q in BF16, as FlashInfer's input
    }
    __threadfence_block();  // the new K/V, read back below through L2 by another warp
    __syncthreads();
    phase_stamp(p.stamps, STAMPS, 4);
    uint32_t qw[16];
    const uint4* q_src = reinterpret_cast<const uint4*>(q_stage + g * D + 32 * c);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 v = g < group ? q_src[i] : make_uint4(0, 0, 0, 0);
      qw[4 * i] = v.x, qw[4 * i + 1] = v.y, qw[4 * i + 2] = v.z, qw[4 * i + 3] = v.w;
    }
    WarpSoftmax w;
    for (int first = key0 + warp * BLOCK_KEYS; first < key_end; first += WARPS * BLOCK_KEYS) {
      BlockFragments f;
      load_block(f, p.k_cache, p.v_cache, table, p.page_size, key_stride, kv_head * D, first, ctx, g, c);
      attend_block(w, f, qw, first, ctx, p.scale_log2, c);
    }
    w.l += __shfl_xor_sync(0xFFFFFFFFu, w.l, 1);
    w.l += __shfl_xor_sync(0xFFFFFFFFu, w.l, 2);
    store_softmax(w, soft.m[warp], soft.l[warp], soft.o[warp]);
    __syncthreads();
    // The warps' states merged: the output itself when one split holds the whole context, else the
    // split's m, l, o.
    const int d = threadIdx.x % D;
    for (int h = threadIdx.x / D; h < group; h += THREADS / D) {
      float m, l, o;
      merge_warps(soft.m, soft.l, soft.o, h, d, m, l, o);
      if (active_splits == 1) {
        p.attn[(kv_head * group + h) * D + d] = __bfloat16_as_ushort(__float2bfloat16(o / l));
      } else {
        float* part = p.partials + (size_t(cta) * group + h) * (D + 2);
        if (d == 0) part[0] = m, part[1] = l;
        part[2 + d] = o;
      }
    }
  }
  phase_stamp(p.stamps, STAMPS, 5);
  grid_barrier(p.barrier, ctas, generation);
  phase_stamp(p.stamps, STAMPS, 6);

  // The splits' merge: this CTA's n_out consecutive outputs (one head's), a warp per split in turn.
  if (active_splits > 1) {
    MergeShared& merge = *reinterpret_cast<MergeShared*>(smem + L.soft_off);
    const int n_out = width / ctas, o0 = cta * n_out, head = o0 / D, d0 = o0 % D;
    const float* head_part = p.partials + (size_t(head / group) * splits * group + head % group) * (D + 2);
    const size_t split_stride = size_t(group) * (D + 2);
    float m = -FLT_MAX;
    for (int s = warp; s < active_splits; s += WARPS) m = fmaxf(m, __ldcg(head_part + s * split_stride));
    float l = 0.0f, o[MAX_OUT] = {};
    for (int s = warp; s < active_splits; s += WARPS) {
      const float* part = head_part + s * split_stride;
      const float weight = exp2f(__ldcg(part) - m);
      l += __ldcg(part + 1) * weight;
#pragma unroll
      for (int j = 0; j < MAX_OUT; ++j)
        if (32 * j < n_out) o[j] += __ldcg(part + 2 + d0 + 32 * j + lane) * weight;
    }
    if (lane == 0) merge.m[warp] = m, merge.l[warp] = l;
#pragma unroll
    for (int j = 0; j < MAX_OUT; ++j)
      if (32 * j < n_out) merge.o[warp][32 * j + lane] = o[j];
    __syncthreads();
    if (warp == 0) {
      float mm = -FLT_MAX;
#pragma unroll
      for (int i = 0; i < WARPS; ++i) mm = fmaxf(mm, merge.m[i]);
      float ll = 0.0f, oo[MAX_OUT] = {};
#pragma unroll
      for (int i = 0; i < WARPS; ++i) {
        const float weight = merge.m[i] == -FLT_MAX ? 0.0f : exp2f(merge.m[i] - mm);
        ll += merge.l[i] * weight;
#pragma unroll
        for (int j = 0; j < MAX_OUT; ++j)
          if (32 * j < n_out) oo[j] += merge.o[i][32 * j + lane] * weight;
      }
#pragma unroll
      for (int j = 0; j < MAX_OUT; ++j)
        if (32 * j < n_out) p.attn[o0 + 32 * j + lane] = __bfloat16_as_ushort(__float2bfloat16(oo[j] / ll));
    }
    grid_barrier(p.barrier, ctas, generation);
  }

  phase_stamp(p.stamps, STAMPS, 7);

  // The o projection: 16 features, the k-blocks split over every warp.
  pdl_launch_dependents();
  for (int i = threadIdx.x; i < width / 8; i += THREADS)
    reinterpret_cast<uint4*>(x_stage)[i] = __ldcg(reinterpret_cast<const uint4*>(p.attn) + i);
  __syncthreads();
  const float o_alpha = p.o_quant ? quantize_stage(x_stage, width, p.o_quant == 1 ? p.o_input_scale : 0.0f, sums) * p.alpha[3]
                                  : p.alpha[3];
  const int kb_total = width / 128, kb_per = (kb_total + WARPS - 1) / WARPS;
  float acc[1][4] = {};
  barrier_wait(&landed[MAX_QKV_TILES], 0);
  tile_mma(smem + L.o_off, width, g == 0 ? x_stage : nullptr, warp * kb_per, min(kb_total, (warp + 1) * kb_per), acc);
  sum_split(acc, WARPS, true, sums);
  if (warp == 0 && c == 0) {
    p.out[FEATURES * cta + g] = acc[0][0] * o_alpha;
    p.out[FEATURES * cta + g + 8] = acc[0][2] * o_alpha;
  }
  phase_stamp(p.stamps, STAMPS, 8);
}

// NIBBLE_DECODE_BLOCK_TIMING=1: the phase stamps of the last launch, in device memory (one buffer).
__device__ long long attention_decode_stamps[PHASE_STAMP_MAX_CTAS * STAMPS];
long long* timing_stamps() {
  static long long* stamps = phase_stamp_buffer(attention_decode_stamps);
  return stamps;
}

struct BlockShape {
  int ctas = 0, tiles = 0, cta_tiles = 0;
  Layout layout{};
};

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The grid and shared memory for these shapes; false where they do not fit the kernel or this GPU.
bool block_shape(const AttentionDecodeWeights& w, const AttentionDecodeStep& s, BlockShape& shape) {
  const int64_t H = s.hidden, NH = s.n_heads, NKV = s.n_kv_heads, width = NH * D;
  if (s.head_dim != D || NKV < 1 || NH % NKV || NH / NKV > MAX_GROUP || s.page_size < 1 || s.page_size % BLOCK_KEYS ||
      H < 256 || H % 256 || width % 128)
    return false;
  const DeviceNvfp4Weight* weights[4] = {w.q, w.k, w.v, w.o};
  const int64_t rows[4] = {width, NKV * D, NKV * D, H}, cols[4] = {H, H, H, width};
  for (int i = 0; i < 4; ++i)
    if (!weights[i] || !weights[i]->packed || !weights[i]->block_scales || weights[i]->rows != rows[i] ||
        weights[i]->cols != cols[i] || !aligned16(weights[i]->packed) || !aligned16(weights[i]->block_scales))
      return false;
  if ((w.q_norm == nullptr) != (w.k_norm == nullptr)) return false;
  if (width > 16 * 4 * THREADS) return false;  // quantize_stage's blocks a thread
  if (s.act_quant == formats::ActQuant::STATIC && !(w.o_input_scale > 0.0f)) return false;
  const DeviceLimits& limits = device_limits();
  shape.ctas = int(H / FEATURES);
  if (shape.ctas > limits.sms || shape.ctas % NKV) return false;  // co-resident CTAs; whole splits a KV head
  const int64_t n_out = width / shape.ctas;                       // merge outputs a CTA: one head's, 32 a lane-step
  if (width % shape.ctas || n_out % 32 || n_out > 32 * MAX_OUT || D % n_out) return false;
  shape.tiles = int((NH + 2 * NKV) * D / 16);
  shape.cta_tiles = (shape.tiles + shape.ctas - 1) / shape.ctas;
  if (shape.cta_tiles > MAX_QKV_TILES) return false;
  shape.layout = block_layout(int(H), int(width), shape.cta_tiles, int(NH / NKV));
  return shape.layout.bytes + STATIC_SMEM <= limits.smem_optin;
}

}  // namespace

int64_t attention_decode_workspace_floats(const AttentionDecodeStep& step) {
  const int64_t ctas = step.hidden / FEATURES, group = step.n_kv_heads > 0 ? step.n_heads / step.n_kv_heads : 0;
  return (step.n_heads + 2 * step.n_kv_heads) * step.head_dim + ctas * group * (step.head_dim + 2);
}

bool attention_decode_block_enabled() {
  static const bool on = [] {
    const char* env = std::getenv("NIBBLE_ATTENTION_DECODE_BLOCK");
    return env && std::string(env) == "1";
  }();
  return on;
}

bool attention_decode_block_supported(const AttentionDecodeWeights& w, const AttentionDecodeStep& step) {
  BlockShape shape;
  return block_shape(w, step, shape);
}

Status attention_decode_block(const uint16_t* x, const AttentionDecodeWeights& w, const AttentionDecodeStep& step,
                              uint16_t* k_cache, uint16_t* v_cache, const AttentionDecodeWorkspace& ws, float* out,
                              cudaStream_t stream) {
  BlockShape shape;
  if (!block_shape(w, step, shape)) return Status::error("attention_decode_block: these shapes do not fit the one-launch kernel");
  if (!x || !out || !k_cache || !v_cache || !ws.scratch || !ws.attn || !ws.barrier || !step.positions || !step.slots ||
      !step.token_seq || !step.block_tables || !step.inv_freq || !aligned16(x) || !aligned16(ws.attn) || !aligned16(ws.scratch))
    return Status::error("attention_decode_block: null or misaligned pointer");
  const bool w4a4 = step.act_quant != formats::ActQuant::NONE;
  if (w4a4 && !step.x_row_scale) return Status::error("attention_decode_block: W4A4 needs the input norm's row scale");
  BlockParams p{};
  p.x = x, p.out = out, p.x_row_scale = w4a4 ? step.x_row_scale : nullptr;
  p.o_quant = step.act_quant == formats::ActQuant::STATIC ? 1 : step.act_quant == formats::ActQuant::PER_TOKEN ? 2 : 0;
  p.o_input_scale = w.o_input_scale;
  const DeviceNvfp4Weight* weights[4] = {w.q, w.k, w.v, w.o};
  for (int i = 0; i < 4; ++i)  // the decoded weights are × 2⁻⁸ (nvfp4_layout.h): alpha's factor restores them
    p.codes[i] = weights[i]->packed, p.scales[i] = weights[i]->block_scales,
    p.alpha[i] = weights[i]->weight_scale_2 * WEIGHT_DECODE_EPILOGUE;
  p.q_norm = w.q_norm, p.k_norm = w.k_norm, p.inv_freq = step.inv_freq, p.interleaved = step.interleaved, p.eps = step.eps;
  p.scale_log2 = float(1.4426950408889634 / std::sqrt(double(D)));  // log2(e) / sqrt(head_dim)
  p.positions = step.positions, p.token_seq = step.token_seq, p.block_tables = step.block_tables, p.slots = step.slots;
  p.max_blocks = int(step.max_blocks), p.page_size = int(step.page_size);
  p.k_cache = k_cache, p.v_cache = v_cache;
  p.hidden = int(step.hidden), p.n_heads = int(step.n_heads), p.n_kv_heads = int(step.n_kv_heads);
  p.tiles = shape.tiles, p.cta_tiles = shape.cta_tiles;
  p.qkv = ws.scratch, p.partials = ws.scratch + (step.n_heads + 2 * step.n_kv_heads) * D;
  p.attn = ws.attn, p.barrier = ws.barrier;
  p.stamps = shape.ctas <= PHASE_STAMP_MAX_CTAS ? timing_stamps() : nullptr;
  static const cudaError_t attribute = cudaFuncSetAttribute(attention_decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                            device_limits().smem_optin - STATIC_SMEM);
  NIB_RETURN_IF_ERROR(cuda_status(attribute, "attention_decode_block: shared memory attribute"));
  // Launched after the previous kernel's trigger (PDL); its CTAs first resident wait for that
  // kernel's end in pdl_wait, so the grid barriers only ever wait on CTAs that are sure to start.
  return cuda_status(launch_pdl(attention_decode_kernel, dim3(unsigned(shape.ctas)), dim3(THREADS),
                                size_t(shape.layout.bytes), stream, p),
                     "attention_decode_block launch");
}

std::string attention_decode_block_timing(int64_t hidden) {
  return phase_report("attention_decode_block", timing_stamps(), int(hidden / FEATURES), STAMPS, STAMP_NAMES);
}

}  // namespace nibble::cuda

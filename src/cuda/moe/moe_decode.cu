// The MoE block of one token in one launch (single-stream decode). CTA c owns output features
// 16c … 16c + 15. Every CTA computes the input norm (add_rmsnorm's bits) and one expert's router
// logit, stored beside the launch's tag; warp 0 of every CTA polls the tagged logits and runs the
// top-k (every CTA alike; in place of a grid barrier: +0.2% tg128, H100). Then the copy engine brings
// in all the weights the CTA uses — its share of the chosen experts' gate/up m-tiles, and its 16 down rows of
// each chosen expert — so the block's weight bytes are in flight at once, where the kernel chain
// waited on three launches for them. gate_up + SwiGLU as the tiles land → act (global) → a grid
// barrier, inside which each warp decodes its down fragments → down → combine → residual; the last
// CTA to arrive computes the next norm. H200, Qwen3-30B-A3B (docs/lab/perf-notebook.md): 17.4 µs against the
// chain's 21.7 (bench kernels), tg128 457 against 436 tok/s. Fragments and k order: skinny_gemm.cu's,
// the experts in line order. W4A4 (both modes) quantizes as the chain does: x̂ of the input in every
// CTA (the router reads x), the SwiGLU rows (static: by the CTAs that produce their 16-value blocks;
// per-token: the fp32 rows after the grid barrier, by every CTA), the next norm's x̂ in the last CTA.
#include "cuda/moe/moe_decode.cuh"

#include <cuda_bf16.h>

#include <string>

#include "cuda/common/async_copy.cuh"
#include "cuda/common/check.cuh"
#include "cuda/moe/decode_block.cuh"
#include "cuda/moe/decode_block_quant.cuh"
#include "cuda/common/device_context.cuh"
#include "cuda/moe/moe_routing_device.cuh"
#include "cuda/nvfp4/nvfp4_act_quant.cuh"
#include "cuda/nvfp4/nvfp4_layout.h"
#include "cuda/common/pdl.cuh"
#include "cuda/diagnostics/phase_stamps.cuh"
#include "cuda/ops/rmsnorm_row.cuh"

namespace nibble::cuda {
namespace {

using namespace decode_block;

constexpr int FEATURES = 16;  // output features of a CTA: one m16 tile of the down projection
constexpr int MAX_TOP_K = DECODE_BLOCK_MAX_TOP_K;
constexpr int MAX_GATE_TILES = 16;  // gate_up m-tiles a CTA (shared memory holds fewer at Qwen3's sizes)
constexpr int DOWN_BLOCKS = 3;      // down k-blocks a warp holds decoded (I ≤ 128 · 3 · WARPS / top_k)
constexpr int MAX_CHUNKS = 16;      // hidden ≤ 256 · 16
// The kernels' __shared__ arrays (ptxas: 1,024 bytes in W4A16, 1,664 in W4A4), with room: the dynamic
// part they opt into is the rest of what a CTA may have (a 1,024 reserve fell short of W4A4's arrays
// and the attribute call failed on the device).
constexpr int STATIC_SMEM = 2048;

// Shared memory: each weight tile as it lies in global memory, rows dense (so a tile is a few
// contiguous runs for the copy engine). A gate_up m-tile of 8 features: codes of its 8 gate rows then
// its 8 up rows, then their scale codes likewise; a down tile: codes then scale codes of 16 rows.
struct DecodeLayout {
  int gate_tile, down_tile;                       // bytes
  int down_off, act_off, sums_off, x_off, bytes;  // gate_up tiles at 0; act: the SwiGLU rows; sums: k-split sums
};

__host__ __device__ inline DecodeLayout decode_layout(int hidden, int inter, int top_k, int gate_tiles) {
  DecodeLayout l;
  l.gate_tile = tile_bytes(hidden), l.down_tile = tile_bytes(inter);
  l.down_off = max(gate_tiles * l.gate_tile, top_k * inter * 4);  // W4A4 reuses it for the fp32 SwiGLU rows
  l.act_off = l.down_off + top_k * l.down_tile;
  l.sums_off = l.act_off + top_k * inter * 2;
  l.x_off = l.sums_off + WARPS * 4 * 32 * 4;
  l.bytes = l.x_off + hidden * 2;
  return l;
}

struct DecodeParams {
  const uint16_t* x;  // BF16 [hidden] without an input norm
  InputNorm in;
  bool has_in;
  ResidualNorm next;
  bool has_next;
  float* out;  // fp32 [hidden] without a next norm
  const uint16_t* router;
  const float* score_bias;
  float norm_min;
  bool renormalize;
  int hidden, inter, experts, top_k, gate_tiles;  // gate_tiles: gate_up m-tiles (8 features) a CTA
  const uint8_t *gate_codes, *gate_scales, *up_codes, *up_scales, *down_codes, *down_scales;
  const float *gate_global, *up_global, *down_global;
  // W4A4: the gate_up and down inputs quantized with these input scales (static; 0: per-token), the
  // SwiGLU rows kept in fp32 (act_f32) for down's quantization, as moe_forward's chain.
  float x_input_scale, act_input_scale;
  // Static W4A4 where every 16-value block of a SwiGLU row is one CTA's (gate_tiles even: a block is
  // two of its m-tiles): the producers write x̂ in BF16 to act, and no CTA re-quantizes the rows.
  bool local_act_quant;
  float* act_f32;        // [top_k, inter] (W4A4)
  unsigned long long* logits;  // [experts] tagged (decode_block.cuh's store_tagged)
  int32_t* expert_ids;   // [top_k]
  float* route_weights;  // [top_k]
  uint16_t* act;         // BF16 [top_k, inter]
  // [2, MAX_TOP_K] per-token W4A4: each SwiGLU row's amax (fp32 bits), the producing CTAs' maxima met
  // by atomics in L2; set generation % 2 serves a launch (one grid barrier a launch), which clears
  // the other set for the next (the last launch that used it has ended: PDL wait).
  unsigned* slot_amax;
  float* partials;    // [CTAs]: the next norm's sums of squares
  unsigned* barrier;  // {arrived, generation}
  long long* stamps;  // NIBBLE_DIAG_PHASE_TIMING=1: [CTAs, STAMPS] clock64 at each phase's end; else null
};

// Phases of moe_decode_kernel, timed when stamps are asked for (moe_decode_block_timing).
constexpr int STAMPS = 12;
constexpr const char* STAMP_NAMES[STAMPS] = {"start",   "input ready", "router", "x̂ (W4A4)",
                                             "logits met, top-k", "copies out", "gate_up",
                                             "barrier (down decode inside)", "act in", "down", "combine",
                                             "arrive (the last CTA then norms)"};
__device__ __forceinline__ void stamp(const DecodeParams& p, int phase) { phase_stamp(p.stamps, STAMPS, phase); }

// The down input of one warp: its own k range (nkb 128-value blocks from kb0) of slot s's SwiGLU row
// into `stage` (the CTA's [top_k, inter] BF16 rows), so no CTA barrier stands between the grid
// barrier and the mma. BF16 rows (W4A16; static W4A4 where the producers wrote x̂) by cp.async;
// fp32 rows (per-token W4A4, and static where a 16-value block spans CTAs) by cp.async into `rows`
// (the gate_up tiles' space, done with; not registers, which the down fragments held meanwhile
// take), then x̂ bit for bit quantize_dequantize_activation_f32 (per-token: the row's amax as the
// producing CTAs' atomics left it in `slot_amax`), a quad of lanes a 16-value block. Returns the
// row's scale (W4A4; 1 for W4A16). The warp's lanes all call it.
template <bool W4A4>
__device__ float warp_act_rows(const DecodeParams& p, int s, int kb0, int nkb, float* rows, uint16_t* stage,
                               const unsigned* slot_amax) {
  const int lane = threadIdx.x & 31, k0 = s * p.inter + kb0 * 128;
  if constexpr (W4A4) {
    if (!p.local_act_quant) {  // per-token: fp32 rows in, quantized here
      for (int i = lane; i < nkb * 32; i += 32) cp_async<16>(rows + k0 + i * 4, p.act_f32 + size_t(k0) + i * 4, 16);
      cp_async_commit();
      const float amax = p.act_input_scale == 0.0f ? __uint_as_float(__ldcg(slot_amax + s)) : 0.0f;
      float global, row_scale;
      act_row_scales(p.act_input_scale, amax, global, row_scale);
      cp_async_wait<0>();
      __syncwarp();
#pragma unroll
      for (int j = 0; j < DOWN_BLOCKS; ++j) {
        if (j >= nkb) break;
        const float4 v = reinterpret_cast<const float4*>(rows + k0)[j * 32 + lane];
        reinterpret_cast<uint2*>(stage + k0)[j * 32 + lane] = quantize_quad(v, global);
      }
      __syncwarp();
      return row_scale;
    }
  }
  for (int i = lane; i < nkb * 16; i += 32) cp_async<16>(stage + k0 + i * 8, p.act + size_t(k0) + i * 8, 16);
  cp_async_commit();
  cp_async_wait<0>();
  __syncwarp();
  return W4A4 ? p.act_input_scale : 1.0f;
}

// The CTA's weights into shared memory by the copy engine, each tile signalling landed[t] (the down
// tiles landed[MAX_GATE_TILES]) as its bytes arrive. A tile is a few contiguous runs (4 a gate_up
// tile, 2 a down tile): warp 0's lanes hand out the gate_up runs, the last warp the down runs once a
// third of the gate_up tiles have landed, so the gate_up bytes, needed first, come at full bandwidth.
// Copy-engine runs, not 16-byte cp.async chunks from every thread: those took 8.4 µs to issue an SM's
// 173 KB, the copy engine 1.6 µs (H200).
__device__ __forceinline__ void copy_weights(const DecodeParams& p, const DecodeLayout& L, uint8_t* smem,
                                             const int32_t* ids, int t0, int my_tiles, int f0, uint64_t* landed) {
  const int H = p.hidden, I = p.inter, K = p.top_k, tiles_per_slot = I / 8;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (warp == 0) {
    if (lane == 0) {
      for (int t = 0; t < my_tiles; ++t) barrier_arrive_expect_tx(&landed[t], uint32_t(L.gate_tile));
      barrier_arrive_expect_tx(&landed[MAX_GATE_TILES], uint32_t(K * L.down_tile));
    }
    for (int r = lane; r < 4 * my_tiles; r += 32) {  // tile r / 4: gate codes, up codes, gate scales, up scales
      const int t = r >> 2, run = r & 3, j = t0 + t, s = j / tiles_per_slot;
      const size_t row0 = size_t(ids[s]) * I + (j - s * tiles_per_slot) * 8;
      uint8_t* tile = smem + t * L.gate_tile;
      const bool up = run & 1, scales = run >= 2;
      const uint8_t* src = scales ? (up ? p.up_scales : p.gate_scales) + row0 * (H / 16)
                                  : (up ? p.up_codes : p.gate_codes) + row0 * (H / 2);
      uint8_t* dst = scales ? tile + 16 * (H / 2) + (up ? 8 * (H / 16) : 0) : tile + (up ? 8 * (H / 2) : 0);
      bulk_copy_to_shared(dst, src, uint32_t(scales ? 8 * (H / 16) : 8 * (H / 2)), &landed[t]);
    }
  } else if (warp == WARPS - 1) {
    if (my_tiles > 0) barrier_wait(&landed[my_tiles / 3], 0);
    for (int r = lane; r < 2 * K; r += 32) {  // slot r / 2: its 16 rows' codes, then their scales
      const int s = r >> 1;
      const bool scales = r & 1;
      const size_t row0 = size_t(ids[s]) * H + f0;
      uint8_t* tile = smem + L.down_off + s * L.down_tile;
      bulk_copy_to_shared(scales ? tile + 16 * (I / 2) : tile,
                          scales ? p.down_scales + row0 * (I / 16) : p.down_codes + row0 * (I / 2),
                          uint32_t(scales ? 16 * (I / 16) : 16 * (I / 2)), &landed[MAX_GATE_TILES]);
    }
  }
}

// W4A4: a kernel of its own, so that W4A16's registers (its down fragments are live across the
// act rows' quantization) stay as they were, without spills.
template <int CHUNKS, bool W4A4>
__global__ void __launch_bounds__(THREADS, 1) moe_decode_kernel(const DecodeParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ float partial[WARPS];
  __shared__ int32_t ids[MAX_TOP_K];
  __shared__ float route_w[MAX_TOP_K];
  __shared__ float ys[MAX_TOP_K][FEATURES];
  // Brought in by cp.async long before their use after the grid barrier (loaded there, each put an L2
  // or HBM round trip on the block's critical path): each slot's down weight scale, and the combine's
  // residual and delta of the CTA's features.
  __shared__ float down_scale[MAX_TOP_K];
  __shared__ float kept_in[2][FEATURES];
  __shared__ uint64_t landed[MAX_GATE_TILES + 1];  // each gate_up tile's weights, then all the down tiles'
  __shared__ float x_scale;  // W4A4: x̂'s row scale
  // Per-token W4A4: the CTA's share of its first and next SwiGLU rows' amaxes; each warp's of the input
  // x; this launch's set of p.slot_amax.
  __shared__ unsigned cta_amax[2];
  __shared__ float warp_amax[WARPS];
  __shared__ unsigned amax_set, tag;
  __shared__ __align__(
      16) float tile_values[MAX_GATE_TILES * 8];  // local_act_quant: the CTA's SwiGLU values, tile-major
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int cta = blockIdx.x, ctas = gridDim.x;
  const int H = p.hidden, I = p.inter, E = p.experts, K = p.top_k;
  const DecodeLayout L = decode_layout(H, I, K, p.gate_tiles);
  uint16_t* x_stage = reinterpret_cast<uint16_t*>(smem + L.x_off);
  unsigned generation = 0;  // thread 0's: the barriers passed, read after the PDL wait
  if (threadIdx.x == 0) {
    for (int t = 0; t <= MAX_GATE_TILES; ++t) barrier_init(&landed[t], 1);
    cta_amax[0] = cta_amax[1] = 0u;
    fence_barrier_init();  // (the __syncthreads after the input norm publishes them)
  }

  // Before the PDL wait (constants): warp w's router row (expert c + w · CTAs) and the norm weights.
  const int expert = cta + ctas * warp;
  uint4 router_row[CHUNKS];
#pragma unroll
  for (int i = 0; i < CHUNKS; ++i)
    router_row[i] = expert < E && i < H / 256
                        ? __ldg(reinterpret_cast<const uint4*>(p.router + size_t(expert) * H + i * 256) + lane)
                        : make_uint4(0, 0, 0, 0);
  float norm_weight[CHUNKS];
  const bool norm_thread = threadIdx.x < NORM_THREADS;
  if (p.has_in) load_norm_weight(p.in.weight, H, norm_thread, norm_weight);
  stamp(p, 0);
  pdl_wait();
  // The last launch's final generation (read after the wait: its writes are visible only then).
  // The launch's tag: the generation its one barrier will publish (unique to the launch).
  if (threadIdx.x == 0) generation = first_generation(p.barrier), amax_set = generation & 1, tag = generation + 1;
  if (p.has_next && threadIdx.x < FEATURES) {  // warp 0's lanes 0-15: the combine's inputs (o's output is here now)
    cp_async<4>(&kept_in[0][threadIdx.x], p.next.residual + cta * FEATURES + threadIdx.x, 4);
    if (p.has_in) cp_async<4>(&kept_in[1][threadIdx.x], p.in.delta + cta * FEATURES + threadIdx.x, 4);
    cp_async_commit();
  }

  // The router's input: the block's input norm (the same bits as add_rmsnorm), or x. Per-token W4A4:
  // each warp's amax of it too, so x̂'s row amax needs no reduction of its own.
  float x_amax = 0.0f;
  if (p.has_in) {
    float v[CHUNKS];
    load_row(p.in.residual, p.in.delta, H, norm_thread, v);
    normalize_row(v, norm_weight, H, p.in.eps, partial);
#pragma unroll
    for (int k = 0; k < CHUNKS; ++k) {
      const int i = int(threadIdx.x) + k * NORM_THREADS;
      if (!norm_thread || i >= H) continue;
      const uint16_t bits = uint16_t(__float_as_uint(v[k]) >> 16);  // v holds exact BF16 values
      x_stage[i] = bits;
      if (cta == 0) p.in.out[i] = bits;
      x_amax = fmaxf(x_amax, fabsf(v[k]));
    }
  } else {
    for (int i = threadIdx.x; i < H / 8; i += THREADS) {
      const uint4 v = reinterpret_cast<const uint4*>(p.x)[i];
      reinterpret_cast<uint4*>(x_stage)[i] = v;
      for (uint32_t word : {v.x, v.y, v.z, v.w})
        x_amax = fmaxf(x_amax, max_abs4(__uint_as_float(word << 16), __uint_as_float(word & 0xFFFF0000u), 0.0f, 0.0f));
    }
  }
  const bool per_token = W4A4 && p.x_input_scale == 0.0f;
  if (per_token) publish_warp_amax(x_amax, warp_amax);
  __syncthreads();
  // The next launch's set of slot amaxes starts from zero (this launch and the next read only their own).
  if (W4A4 && p.act_input_scale == 0.0f && cta == 0 && threadIdx.x < MAX_TOP_K)
    p.slot_amax[(amax_set ^ 1) * MAX_TOP_K + threadIdx.x] = 0u;
  stamp(p, 1);
  if (expert < E) {  // the logit as route_and_group_small computes it: the same routing
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < CHUNKS; ++i)
      if (i < H / 256) acc = dot8(router_row[i], reinterpret_cast<const uint4*>(x_stage)[i * 32 + lane], acc);
    for (int offset = 16; offset > 0; offset >>= 1) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, offset);
    if (lane == 0) store_tagged(p.logits + expert, tag, acc);
  }
  stamp(p, 2);
  // W4A4 quantizes x in place while the other CTAs' logits come: the router has read x, gate_up reads
  // x̂ (CTA 0 also writes it where the input norm's quant asks).
  __syncthreads();
  if constexpr (W4A4) {
    const float scale =
        quantize_row_bf16(x_stage, x_stage, H, p.x_input_scale, per_token ? warps_amax(warp_amax) : -1.0f, partial);
    if (threadIdx.x == 0) x_scale = scale;
    if (cta == 0 && p.has_in && p.in.quant.x_hat) {
      for (int i = threadIdx.x; i < H / 8; i += THREADS)
        reinterpret_cast<uint4*>(p.in.quant.x_hat)[i] = reinterpret_cast<const uint4*>(x_stage)[i];
      if (threadIdx.x == 0) p.in.quant.row_scales[0] = scale;
    }
  }
  stamp(p, 3);
  if (warp == 0) {
    float logits[ROUTER_MAX_PER_LANE];
    poll_tagged(p.logits, E, tag, logits, "the router logits");
    warp_softmax_topk_values(logits, E, K, p.renormalize, p.score_bias, p.norm_min, ids, route_w);
    __syncwarp();  // ids from the lanes that wrote them
    if (lane < K) cp_async<4>(&down_scale[lane], p.down_global + ids[lane], 4);
    cp_async_commit();
  }
  __syncthreads();
  stamp(p, 4);
  if (cta == 0 && int(threadIdx.x) < K)
    p.expert_ids[threadIdx.x] = ids[threadIdx.x], p.route_weights[threadIdx.x] = route_w[threadIdx.x];

  // Every weight byte this CTA reads, in flight at once: gate_up m-tiles t0 … (8 features of one
  // slot), then the down rows of its 16 features for every slot; each tile is computed as it lands.
  const int tiles_per_slot = I / 8, t0 = cta * p.gate_tiles, f0 = cta * FEATURES;
  const int my_tiles = max(0, min(p.gate_tiles, K * tiles_per_slot - t0));
  copy_weights(p, L, smem, ids, t0, my_tiles, f0, landed);
  stamp(p, 5);

  // gate_up + SwiGLU: `split` warps share an m-tile's k-blocks.
  float* split_sums = reinterpret_cast<float*>(smem + L.sums_off);
  {
    // Per-token W4A4: this thread's amax of the values it writes of the CTA's first row (slot t0 / I · 8) and the next.
    float first_max = 0.0f, next_max = 0.0f;
    const int split = max(1, WARPS / p.gate_tiles), groups = WARPS / split, part = warp % split;
    const int kb_total = H / 128, kb_per = (kb_total + split - 1) / split;
    for (int round = 0; round < my_tiles; round += groups) {  // the same trip count in every warp
      const int t = round + warp / split;
      const bool active = warp < groups * split && t < my_tiles;
      float acc[1][4] = {};
      if (active) {
        barrier_wait(&landed[t], 0);
        tile_mma(smem + t * L.gate_tile, H, g == 0 ? x_stage : nullptr, part * kb_per,
                 min(kb_total, (part + 1) * kb_per), acc);
      }
      sum_split(acc, split, active, split_sums);
      if (active && part == 0 && c == 0) {  // token column 0: acc[0] gate, acc[2] up of feature m0 + g
        const int j = t0 + t, s = j / tiles_per_slot, feature = (j - s * tiles_per_slot) * 8 + g, e = ids[s];
        const float row_scale = W4A4 ? x_scale : 1.0f;  // (× 1 is exact: W4A16's bits unchanged)
        const float gate = acc[0][0] * (p.gate_global[e] * WEIGHT_DECODE_EPILOGUE) * row_scale;
        const float up = acc[0][2] * (p.up_global[e] * WEIGHT_DECODE_EPILOGUE) * row_scale;
        const float value = gate / (1.0f + expf(-gate)) * up;  // silu(gate) · up, as the skinny epilogue
        if (W4A4 && p.local_act_quant) {
          tile_values[t * 8 + g] = value;
        } else if constexpr (W4A4) {
          p.act_f32[size_t(s) * I + feature] = value;
          if (s == t0 / tiles_per_slot)
            first_max = fmaxf(first_max, fabsf(value));
          else
            next_max = fmaxf(next_max, fabsf(value));
        } else {
          p.act[size_t(s) * I + feature] = __bfloat16_as_ushort(__float2bfloat16_rn(value));
        }
      }
    }
    if (W4A4 && p.act_input_scale == 0.0f)
#pragma unroll
      for (int r = 0; r < 2; ++r) {  // (a CTA's ≤ 16 tiles of 8 features span at most two rows of ≥ 256)
        const unsigned m = __reduce_max_sync(0xFFFFFFFFu, __float_as_uint(r ? next_max : first_max));
        if (lane == 0 && m) atomicMax(&cta_amax[r], m);
      }
  }
  if (W4A4 && p.local_act_quant) {  // x̂ of the CTA's blocks (m-tiles 2b, 2b + 1) by warp 0, a quad of lanes a block
    __syncthreads();
    if (warp == 0) {
      float global, row_scale;
      act_row_scales(p.act_input_scale, 0.0f, global, row_scale);
      for (int b0 = 0; b0 < my_tiles / 2; b0 += 8) {  // the same trip count in every lane (quad_max)
        const int b = b0 + lane / 4, q = lane & 3;
        const bool real = b < my_tiles / 2;
        const float4 v =
            real ? reinterpret_cast<const float4*>(tile_values)[4 * b + q] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const uint2 x_hat = quantize_quad(v, global);
        if (real) {
          const int j = t0 + 2 * b, s = j / tiles_per_slot;
          reinterpret_cast<uint2*>(p.act + size_t(s) * I + (j - s * tiles_per_slot) * 8)[q] = x_hat;
        }
      }
    }
  }
  // The barrier (every act row written) in two halves: between its arrival and its wait, each warp
  // decodes its down fragments (slot s, k-blocks kb0 …), which landed while gate_up computed.
  // Per-token W4A4: thread 0 first meets its CTA's row amaxes with the other CTAs' in L2 (atomics
  // released by its arrival).
  // Warp 0's copies (the combine's inputs and the down scales, issued ~10 µs ago), for every warp after it.
  if (warp == 0) cp_async_wait<0>();
  __syncthreads();
  if (threadIdx.x == 0) {
    if (W4A4 && p.act_input_scale == 0.0f)
      for (int r = 0; r < 2; ++r) {
        const int slot = t0 / tiles_per_slot + r;
        if (cta_amax[r] && slot < K) atomicMax(p.slot_amax + amax_set * MAX_TOP_K + slot, cta_amax[r]);
      }
    grid_arrive(p.barrier, ctas, ++generation);
  }
  stamp(p, 6);
  const int split = WARPS / K, s = warp / split, part = warp % split;  // K ≤ WARPS (decode_shape)
  const int kb_total = I / 128, kb_per = (kb_total + split - 1) / split;
  const int kb0 = part * kb_per, nkb = min(kb_total - kb0, kb_per);  // ≤ DOWN_BLOCKS (decode_shape)
  const bool active = s < K;
  uint32_t a[DOWN_BLOCKS][4][8];
  if (active) {
    barrier_wait(&landed[MAX_GATE_TILES], 0);
    const uint8_t* tile = smem + L.down_off + s * L.down_tile;
#pragma unroll
    for (int j = 0; j < DOWN_BLOCKS; ++j) {
      if (j >= nkb) break;
      uint4 codes[2];
      uint32_t scales[2];
      load_kblock(tile, I, kb0 + j, codes, scales);
      skinny::decode_kblock<true>(codes, scales, a[j]);
    }
  }
  if (threadIdx.x == 0) grid_wait(p.barrier, generation);
  __syncthreads();
  stamp(p, 7);

  // down: each warp's part of its slot's SwiGLU row into shared memory (through L2), then the decoded
  // fragments' mma.
  uint16_t* act_stage = reinterpret_cast<uint16_t*>(smem + L.act_off);
  const float act_row_scale = active ? warp_act_rows<W4A4>(p, s, kb0, nkb, reinterpret_cast<float*>(smem), act_stage,
                                                           p.slot_amax + amax_set * MAX_TOP_K)
                                     : 1.0f;
  stamp(p, 8);
  float acc[1][4] = {};
  if (active) {
    const uint16_t* x_row = act_stage + s * I;
#pragma unroll
    for (int j = 0; j < DOWN_BLOCKS; ++j) {
      if (j >= nkb) break;
      uint4 xv[1][4];
      skinny::token_x_fragment<true>(x_row, kb0 + j, g == 0, c, xv[0]);
      skinny::mma_decoded<1>(a[j], xv, acc);
    }
  }
  sum_split(acc, split, active, split_sums);
  if (active && part == 0 && c == 0) {  // BF16 as the chain's y rows: acc[0] feature f0 + g, acc[2] f0 + g + 8
    const float scale = down_scale[s] * WEIGHT_DECODE_EPILOGUE;  // (× 1 is exact: W4A16's bits unchanged)
    ys[s][g] = __bfloat162float(__float2bfloat16_rn(acc[0][0] * scale * act_row_scale));
    ys[s][g + 8] = __bfloat162float(__float2bfloat16_rn(acc[0][2] * scale * act_row_scale));
  }
  __syncthreads();
  stamp(p, 9);

  // The combine (slot order from 0, as ref::moe) in warp 0's lanes 0-15, the residual, and the next
  // norm: every CTA writes its kept values and their sum of squares and arrives; the last to arrive
  // normalizes the whole row while the others leave (their SMs free for the next kernel at once).
  __shared__ unsigned last;
  if (warp == 0) {
    const int i = lane & (FEATURES - 1), f = f0 + i;  // lanes 16-31 mirror 0-15 and write nothing
    float sum = 0.0f;
    for (int s = 0; s < K; ++s) sum += route_w[s] * ys[s][i];
    if (!p.has_next) {
      if (lane < FEATURES) p.out[f] = sum;
    } else {
      const float residual = kept_in[0][i];  // (landed before the grid barrier: lanes 16-31 read them too)
      const float kept = (p.has_in ? residual + kept_in[1][i] : residual) + sum;
      if (lane < FEATURES) p.next.residual[f] = kept;
      float sum_sq = lane < FEATURES ? kept * kept : 0.0f;
      for (int offset = 16; offset > 0; offset >>= 1) sum_sq += __shfl_xor_sync(0xFFFFFFFFu, sum_sq, offset);
      if (lane == 0) p.partials[cta] = sum_sq;
    }
  }
  stamp(p, 10);
  if (!p.has_next) {
    pdl_launch_dependents();
    stamp(p, 11);
    return;
  }
  __syncthreads();
  if (threadIdx.x == 0) last = arrive_last(p.barrier, ctas);  // no generation: nobody waits
  __syncthreads();
  pdl_launch_dependents();
  stamp(p, 11);
  if (!last) return;
  __shared__ float inv;
  if (warp == 0) {
    float total = 0.0f;
    for (int k = lane; k < ctas; k += 32) total += __ldcg(p.partials + k);
    for (int offset = 16; offset > 0; offset >>= 1) total += __shfl_xor_sync(0xFFFFFFFFu, total, offset);
    if (lane == 0) inv = 1.0f / sqrtf(total / float(H) + p.next.eps);
  }
  __syncthreads();
  float out_amax = 0.0f;  // per-token x̂ below: the thread's share of the output's amax
  for (int j = threadIdx.x * 4; j < H; j += THREADS * 4) {  // kept values through L2 (other CTAs wrote them)
    const float4 v = __ldcg(reinterpret_cast<const float4*>(p.next.residual + j));
    const float x[4] = {v.x, v.y, v.z, v.w};
    uint32_t out[2];
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const float lo = x[2 * q] * inv * __uint_as_float(uint32_t(p.next.weight[j + 2 * q]) << 16);
      const float hi = x[2 * q + 1] * inv * __uint_as_float(uint32_t(p.next.weight[j + 2 * q + 1]) << 16);
      out[q] = pack_bf16x2(lo, hi);
      out_amax = max_abs4(__uint_as_float(out[q] << 16), __uint_as_float(out[q] & 0xFFFF0000u), out_amax, 0.0f);
    }
    *reinterpret_cast<uint2*>(p.next.out + j) = make_uint2(out[0], out[1]);
    if (p.next.quant.x_hat) *reinterpret_cast<uint2*>(x_stage + j) = make_uint2(out[0], out[1]);
  }
  if (p.next.quant.x_hat) {  // x̂ of the next norm's output for the next W4A4 GEMM, as the chain's combine
    const bool next_per_token = p.next.quant.input_scale == 0.0f;
    if (next_per_token) publish_warp_amax(out_amax, warp_amax);
    __syncthreads();  // (the x̂ stage's)
    const float scale = quantize_row_bf16(x_stage, p.next.quant.x_hat, H, p.next.quant.input_scale,
                                          next_per_token ? warps_amax(warp_amax) : -1.0f, partial);
    if (threadIdx.x == 0) p.next.quant.row_scales[0] = scale;
  }
}

struct DecodeShape {
  int ctas = 0, gate_tiles = 0;
  DecodeLayout layout{};
};

// NIBBLE_DIAG_PHASE_TIMING=1: the phase stamps of the last launch, in device memory (one buffer).
__device__ long long moe_decode_stamps[PHASE_STAMP_MAX_CTAS * STAMPS];
long long* timing_stamps() {
  static long long* stamps = phase_stamp_buffer(moe_decode_stamps);
  return stamps;
}

// The grid and shared memory for w's shapes; false where they do not fit this GPU.
bool decode_shape(const DeviceMoeWeights& w, DecodeShape& shape) {
  const int64_t H = w.hidden, I = w.intermediate, E = w.experts, K = w.top_k;
  for (const DeviceNvfp4Experts* x : {&w.gate, &w.up, &w.down})  // 16-byte copies of whole rows
    if (reinterpret_cast<uintptr_t>(x->packed) % 16 || reinterpret_cast<uintptr_t>(x->block_scales) % 16) return false;
  if (H % 256 || I % 256 || H > 256 * MAX_CHUNKS || K < 1 || K > MAX_TOP_K || E < K || E > 32 * ROUTER_MAX_PER_LANE)
    return false;
  const DeviceLimits& limits = device_limits();
  shape.ctas = int(H / FEATURES);
  if (shape.ctas > limits.sms || (E + shape.ctas - 1) / shape.ctas > WARPS)
    return false;  // co-resident CTAs; a warp per expert
  shape.gate_tiles = int((K * I / 8 + shape.ctas - 1) / shape.ctas);
  if (shape.gate_tiles > MAX_GATE_TILES) return false;
  const int64_t split = WARPS / K;  // warps a slot's down k-blocks
  if ((I / 128 + split - 1) / split > DOWN_BLOCKS) return false;
  shape.layout = decode_layout(int(H), int(I), int(K), shape.gate_tiles);
  return shape.layout.bytes + STATIC_SMEM <= limits.smem_optin;
}

}  // namespace

bool moe_decode_block_supported(int64_t tokens, const DeviceMoeWeights& w, formats::ActQuant mode,
                                const ResidualNorm* norm, const float* add, const InputNorm* input_norm) {
  DecodeShape shape;
  const bool w4a4 = mode != formats::ActQuant::NONE;
  if (mode == formats::ActQuant::STATIC && !(w.gate_up_input_scale > 0.0f && w.down_input_scale > 0.0f)) return false;
  // An input norm's x̂ is the block's own (written from CTA 0), so it must be asked with the block's scale.
  const float x_scale = mode == formats::ActQuant::STATIC ? w.gate_up_input_scale : 0.0f;
  const bool input_ok = !input_norm || (norm && !input_norm->delta_row_scales &&
                                        (!input_norm->quant.x_hat || (w4a4 && input_norm->quant.row_scales &&
                                                                      input_norm->quant.input_scale == x_scale)));
  // Every expert on this GPU (its slots take any of them; not expert parallelism).
  const bool all_experts = w.gate.experts == w.experts;
  return tokens == 1 && w.router && !w.router_f32 && !add && (!norm || !norm->pending) && input_ok && all_experts &&
         decode_shape(w, shape);
}

Status moe_decode_block(const uint16_t* x, const DeviceMoeWeights& w, formats::ActQuant mode, MoeWorkspace& ws,
                        float* out, const ResidualNorm* norm, const InputNorm* input_norm, cudaStream_t stream) {
  DecodeShape shape;
  if (!decode_shape(w, shape))
    return Status::error("moe_decode_block: these MoE shapes do not fit the one-launch kernel");
  if (!ws.block_barrier || !ws.block_partials || !ws.block_slot_amax || !ws.block_logits)
    return Status::error("moe_decode_block: the workspace has no barrier");
  DecodeParams p{};
  p.x = x, p.out = out;
  if (input_norm) p.in = *input_norm, p.has_in = true;
  if (norm) p.next = *norm, p.has_next = true;
  p.router = w.router, p.score_bias = w.score_bias, p.norm_min = w.norm_min, p.renormalize = w.norm_topk_prob;
  p.hidden = int(w.hidden), p.inter = int(w.intermediate), p.experts = int(w.experts), p.top_k = int(w.top_k);
  p.gate_tiles = shape.gate_tiles;
  p.x_input_scale = mode == formats::ActQuant::STATIC ? w.gate_up_input_scale : 0.0f;
  p.act_input_scale = mode == formats::ActQuant::STATIC ? w.down_input_scale : 0.0f;
  p.act_f32 = static_cast<float*>(ws.act);
  p.local_act_quant = mode == formats::ActQuant::STATIC && shape.gate_tiles % 2 == 0;
  p.gate_codes = w.gate.packed, p.gate_scales = w.gate.block_scales, p.gate_global = w.gate.global_scales;
  p.up_codes = w.up.packed, p.up_scales = w.up.block_scales, p.up_global = w.up.global_scales;
  p.down_codes = w.down.packed, p.down_scales = w.down.block_scales, p.down_global = w.down.global_scales;
  p.logits = ws.block_logits, p.expert_ids = ws.expert_ids, p.route_weights = ws.route_weights;
  p.act = static_cast<uint16_t*>(ws.act), p.slot_amax = ws.block_slot_amax, p.partials = ws.block_partials,
  p.barrier = ws.block_barrier;
  p.stamps = shape.ctas <= PHASE_STAMP_MAX_CTAS ? timing_stamps() : nullptr;
  using Kernel = void (*)(DecodeParams);
  static constexpr Kernel kernels[2][2] = {
      {moe_decode_kernel<MAX_CHUNKS / 2, false>, moe_decode_kernel<MAX_CHUNKS / 2, true>},
      {moe_decode_kernel<MAX_CHUNKS, false>, moe_decode_kernel<MAX_CHUNKS, true>}};
  const Kernel kernel = kernels[w.hidden > 256 * MAX_CHUNKS / 2][mode != formats::ActQuant::NONE];
  const size_t smem = size_t(shape.layout.bytes);
  // Every kernel may take all the shared memory a CTA can have (set once; decode_shape checked the fit).
  static const cudaError_t attributes = [] {
    const int bytes = device_limits().smem_optin - STATIC_SMEM;
    cudaError_t e = cudaSuccess;
    for (const auto& row : kernels)
      for (Kernel k : row)
        if (e == cudaSuccess) e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    return e;
  }();
  NIB_RETURN_IF_ERROR(cuda_status(attributes, "moe_decode_block: shared memory attribute"));
  // Launched after the previous kernel's trigger (PDL) like the chain; the CTAs first resident wait
  // for its end in pdl_wait, so the barriers only ever wait on CTAs that are sure to start.
  return cuda_status(launch_pdl(kernel, dim3(unsigned(shape.ctas)), dim3(THREADS), smem, stream, p),
                     "moe_decode_block launch");
}

std::string moe_decode_block_timing(int64_t hidden) {
  return phase_report("moe_decode_block", timing_stamps(), int(hidden / FEATURES), STAMPS, STAMP_NAMES);
}

}  // namespace nibble::cuda

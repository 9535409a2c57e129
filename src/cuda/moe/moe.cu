// The MoE block: router → group_by_expert → gate_up(+SwiGLU) → down → combine. GROUPED_MMA runs the
// grouped NVFP4 GEMMs (moe_gemm.cu) and SKINNY the register-fed ones for few tokens
// (skinny_gemm.cu), both with no host round trip (small batches route and group in one launch);
// CUBLAS dequantizes the active experts to BF16 and calls cublasGemmGroupedBatchedEx (a
// fallback and the in-house baseline).
// W4A4 modes quantize the gate_up input per token (x̂) and the fp32 SwiGLU output per sorted row.
#include "cuda/moe/moe.cuh"

#include <cuda_bf16.h>

#include <algorithm>

#include "cuda/common/check.cuh"
#include "cuda/nvfp4/nvfp4_act_quant.cuh"
#include "cuda/nvfp4/nvfp4_fragments.cuh"
#include "cuda/nvfp4/nvfp4_layout.h"
#include "cuda/moe/moe_decode.cuh"
#include "cuda/moe/moe_dequant_cublas.cuh"
#include "cuda/moe/moe_router.cuh"
#include "cuda/gemm/nvfp4_wgmma.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/ops/qk_norm_rope_device.cuh"  // load_run / store_run: 16-byte runs of floats
#include "cuda/nvfp4/quantize_nvfp4.cuh"
#include "cuda/gemm/skinny_gemm.cuh"
#include "cuda/diagnostics/step_profiler.cuh"
#include "formats/bf16.h"

namespace nibble::cuda {
namespace {

constexpr int THREADS = 256;

constexpr int MAX_TOP_K = 64;

constexpr int COMBINE_SLOTS_IN_FLIGHT = 8;  // the combine's loads in flight a thread
constexpr int COMBINE_MAX_CHUNKS = 4;       // hidden ≤ THREADS · 8 · 4 with the fused norm

// x̂ of the fused norm's BF16 output (kept: this thread's 8 consecutive values per chunk; a 16-value
// block is a pair of threads), as quantize_dequantize_activation_bf16 computes it.
template <int CHUNKS>
__device__ void quantize_output(const float (&kept)[CHUNKS][8], int hidden, int t, const NormActQuant& q,
                                float* partial) {
  float thread_amax = 0.0f;
  if (q.input_scale == 0.0f)
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c)
      if ((c * THREADS + int(threadIdx.x)) * 8 < hidden)
#pragma unroll
        for (int i = 0; i < 8; ++i) thread_amax = fmaxf(thread_amax, fabsf(kept[c][i]));
  const float global = cta_row_global(q.input_scale, thread_amax, partial, q.row_scales + t);
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    if (c * THREADS * 8 >= hidden) break;  // uniform over the block: the shuffles stay converged
    const int h = (c * THREADS + threadIdx.x) * 8;
    const bool in = h < hidden;
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, in ? fabsf(kept[c][i]) : 0.0f);
    amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 1));
    if (!in) continue;
    const ActBlockScale block(amax, global);
    uint32_t packed[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) packed[i] = block.bf16(kept[c][2 * i]) | block.bf16(kept[c][2 * i + 1]) << 16;
    *reinterpret_cast<uint4*>(q.x_hat + size_t(t) * hidden + h) =
        make_uint4(packed[0], packed[1], packed[2], packed[3]);
  }
}

// Token blockIdx.x's rows and slot scales into shared memory and (NORM) its residual values of this
// thread's chunks into registers, through L2 (ld.cg: never an L1 line an earlier launch left).
template <bool NORM, int CHUNKS>
__device__ __forceinline__ void combine_routing_and_residual(const int32_t* pair_rows, const float* weights,
                                                             const float* row_scales, int top_k, int hidden,
                                                             const ResidualNorm& norm, int* rows, float* scale,
                                                             float (&residual)[NORM ? CHUNKS : 1][8]) {
  const int t = blockIdx.x;
  if (int(threadIdx.x) < top_k) {
    const int pair = t * top_k + threadIdx.x;
    const int row = __ldcg(pair_rows + pair);
    // Another rank's expert (expert parallelism): no row; it adds nothing here.
    rows[threadIdx.x] = row;
    scale[threadIdx.x] = row < 0      ? 0.0f
                         : row_scales ? __ldcg(weights + pair) * __ldcg(row_scales + row)
                                      : __ldcg(weights + pair);
  }
  if constexpr (NORM) {
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      const int h = (c * THREADS + threadIdx.x) * 8;
      if (h >= hidden) break;
      load_run<8, true>(norm.residual + size_t(t) * hidden + h, residual[c]);
    }
  }
}

// out[t, h] = Σ_slot weight[t, slot] · row_scale[r] · y[r, h], r = pair_rows[t·k + slot], summed in slot
// order from 0 as ref::moe does. y is BF16. One CTA per token; the k (row, weight) pairs are read once
// into shared memory, then each thread sums 8 consecutive h with 16-byte loads. With NORM the sum
// is not stored: residual += it, then norm.out = BF16(rmsnorm(residual) · weight) (add_rmsnorm's
// math, fused so the next layer's norm is not a launch of its own); a thread keeps its CHUNKS · 8
// values for that (sized to the row: registers for unused chunks would cost CTAs an SM). Every row a
// thread reads (y, residual, pending, add) is 16-byte aligned (the host checks), and all of a chunk's
// loads are issued before its first store: value by value, each store to the residual ordered the next
// value's loads behind it (the pointers may alias), a memory latency per value.
template <bool NORM, int CHUNKS = 1>
__global__ void combine_kernel(const uint16_t* __restrict__ y, const int32_t* __restrict__ pair_rows,
                               const float* __restrict__ weights, const float* __restrict__ row_scales, int top_k,
                               int hidden, const float* __restrict__ add, float* __restrict__ out, ResidualNorm norm) {
  __shared__ int rows[MAX_TOP_K];
  __shared__ float scale[MAX_TOP_K];
  __shared__ float partial[THREADS / 32];
  // The norm's weights are constants: read before the PDL wait.
  uint4 weight_bits[NORM ? CHUNKS : 1];
  if constexpr (NORM)
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      const int h = (c * THREADS + threadIdx.x) * 8;
      if (h < hidden) weight_bits[c] = *reinterpret_cast<const uint4*>(norm.weight + h);
    }
  // Also before the wait, through L2 (ld.cg: never an L1 line an earlier launch left): the routing (pair
  // rows and weights, the router's), the W4A4 row scales (the SwiGLU quantize's, which the down waited
  // for) and the residual (the post-attention norm's; with the router's norm, the last layer's combine's
  // or the embedding's) are complete once this grid runs — kernels at least two launches back; only y is
  // the down's.
  const int t = blockIdx.x;
  float residual[NORM ? CHUNKS : 1][8] = {};
  combine_routing_and_residual<NORM, CHUNKS>(pair_rows, weights, row_scales, top_k, hidden, norm, rows, scale,
                                             residual);
  pdl_wait();
  pdl_launch_dependents();
  __syncthreads();
  float kept[NORM ? CHUNKS : 1][8];
  float sum_sq = 0.0f;
#pragma unroll
  for (int c = 0; c < (NORM ? CHUNKS : 1 << 20); ++c) {
    const int h = (c * THREADS + threadIdx.x) * 8;
    if (h >= hidden) break;
    const size_t at = size_t(t) * hidden + h;
    // (The residual is in registers already; pending and add, rarer, are read after the sums.)
    float acc[8] = {};
    for (int s0 = 0; s0 < top_k; s0 += COMBINE_SLOTS_IN_FLIGHT) {
      // The slots' loads first, then their sums in slot order (one load at a time made the
      // combine latency-bound).
      uint4 v[COMBINE_SLOTS_IN_FLIGHT];
#pragma unroll
      for (int j = 0; j < COMBINE_SLOTS_IN_FLIGHT; ++j)
        if (s0 + j < top_k && rows[s0 + j] >= 0)
          v[j] = *reinterpret_cast<const uint4*>(y + size_t(rows[s0 + j]) * hidden + h);
#pragma unroll
      for (int j = 0; j < COMBINE_SLOTS_IN_FLIGHT; ++j) {
        if (s0 + j >= top_k) break;
        if (rows[s0 + j] < 0) continue;
        const uint32_t words[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          acc[2 * i] += scale[s0 + j] * formats::bf16_decode(uint16_t(words[i] & 0xFFFF));
          acc[2 * i + 1] += scale[s0 + j] * formats::bf16_decode(uint16_t(words[i] >> 16));
        }
      }
    }
    if (add) {  // ERNIE: routed sum + shared experts, in that order as transformers adds them
      float shared[8];
      load_run<8>(add + at, shared);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] += shared[i];
    }
    if constexpr (NORM) {
      if (norm.pending) {
        float pending[8];
        load_run<8>(norm.pending + at, pending);
#pragma unroll
        for (int i = 0; i < 8; ++i) residual[c][i] += pending[i];
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) kept[c][i] = residual[c][i] + acc[i];
      store_run<8>(norm.residual + at, kept[c]);
    } else {
      store_run<8>(out + at, acc);
    }
  }
  if constexpr (NORM) {
    // add_rmsnorm's order: each thread's squares over its values in index order, then warps, then the block.
    // (Its threads own strided single values; here 8 consecutive ones, so the fp32 sum may differ in the
    // last bits from a separate add_rmsnorm — both are sums of the same squares.)
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      if ((c * THREADS + int(threadIdx.x)) * 8 >= hidden) break;
#pragma unroll
      for (int i = 0; i < 8; ++i) sum_sq += kept[c][i] * kept[c][i];
    }
    for (int offset = 16; offset > 0; offset >>= 1) sum_sq += __shfl_xor_sync(0xFFFFFFFFu, sum_sq, offset);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = sum_sq;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < THREADS / 32; ++w) total += partial[w];
    const float inv = 1.0f / sqrtf(total / float(hidden) + norm.eps);
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      const int h = (c * THREADS + threadIdx.x) * 8;
      if (h >= hidden) break;
      uint32_t packed[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t pair = word_of(weight_bits[c], i);
        const float lo = kept[c][2 * i] * inv * formats::bf16_decode(uint16_t(pair & 0xFFFF));
        const float hi = kept[c][2 * i + 1] * inv * formats::bf16_decode(uint16_t(pair >> 16));
        packed[i] = uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
                    uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16;
        kept[c][2 * i] = __uint_as_float(packed[i] << 16),
                    kept[c][2 * i + 1] = __uint_as_float(packed[i] & 0xFFFF0000u);
      }
      *reinterpret_cast<uint4*>(norm.out + size_t(t) * hidden + h) =
          make_uint4(packed[0], packed[1], packed[2], packed[3]);
    }
    if (norm.quant.x_hat) quantize_output(kept, hidden, t, norm.quant, partial);
  }
}

bool is_w4a4(formats::ActQuant mode) { return mode != formats::ActQuant::NONE; }

Status check_call(const uint16_t* x, int64_t tokens, const DeviceMoeWeights& w, formats::ActQuant mode,
                  const MoeWorkspace& ws, float* out) {
  if (!x || !out || !(w.router || w.router_f32)) return Status::error("moe_forward: null pointer");
  if (tokens < 0 || tokens > ws.max_tokens)
    return Status::error("moe_forward: " + std::to_string(tokens) + " tokens; the workspace holds " +
                         std::to_string(ws.max_tokens));
  if (w.gate.rows != w.intermediate || w.gate.cols != w.hidden || w.down.rows != w.hidden ||
      w.down.cols != w.intermediate || w.gate.experts != w.down.experts || w.gate.experts != w.up.experts ||
      w.expert_begin < 0 || w.expert_begin + w.gate.experts > w.experts)
    return Status::error("moe_forward: expert weight shapes do not match hidden/intermediate/experts");
  if (w.hidden % 64 != 0 || w.intermediate % 64 != 0 || w.top_k > MAX_TOP_K)
    return Status::error("moe_forward: hidden and intermediate must be multiples of 64 and top_k ≤ 64 (got " +
                         std::to_string(w.hidden) + ", " + std::to_string(w.intermediate) + ", " +
                         std::to_string(w.top_k) + ")");
  if (mode == formats::ActQuant::STATIC && !(w.gate_up_input_scale > 0.0f && w.down_input_scale > 0.0f))
    return Status::error("moe_forward (static): the gate_up and down input scales must be > 0");
  return Status::ok();
}

// The grouped GEMMs (GROUPED_MMA: moe_gemm.cu; SKINNY: skinny_gemm.cu; WGMMA: nvfp4_wgmma.cu) on the
// grouping in ws.groups.
Status run_grouped(const uint16_t* gate_up_in, const float* token_scales, int64_t tokens, int tile_rows,
                   MoeKernel backend, const DeviceMoeWeights& w, formats::ActQuant mode, MoeWorkspace& ws,
                   cudaStream_t stream, bool x_frag_written) {
  const int64_t pairs = tokens * w.top_k;
  // The wgmma kernels take their activations in fragment order (nvfp4_layout.h): x as the block's input
  // norm wrote it (x_frag_written) or by a copy, the SwiGLU output as gate_up writes it (W4A16) or as
  // its re-quantization writes it (W4A4, whose 16-value blocks are the natural ones).
  const bool frag_in = backend == MoeKernel::WGMMA && wgmma_fragment_order(w.hidden);
  const bool frag_mid = backend == MoeKernel::WGMMA && wgmma_fragment_order(w.intermediate);
  if (frag_in) {
    if (!x_frag_written) NIB_RETURN_IF_ERROR(to_fragment_order(gate_up_in, tokens, w.hidden, ws.x_frag, stream));
    gate_up_in = ws.x_frag;
  }
  GroupedGemmArgs gate_up;
  gate_up.act_fragment_order = frag_in, gate_up.out_fragment_order = frag_mid && !is_w4a4(mode);
  gate_up.act = gate_up_in, gate_up.sorted_pairs = ws.groups.sorted_pairs, gate_up.top_k = w.top_k;
  gate_up.row_scales = token_scales, gate_up.expert_offsets = ws.groups.expert_offsets;
  gate_up.tile_offsets = ws.groups.tile_offsets, gate_up.tiles = ws.groups.tiles, gate_up.tile_rows = tile_rows;
  gate_up.pairs = pairs, gate_up.out = ws.act, gate_up.out_fp32 = is_w4a4(mode);
  for (int i = 0; i < op_repeats("gate_up"); ++i)
    NIB_RETURN_IF_ERROR(backend == MoeKernel::SKINNY  ? skinny_moe_gate_up(gate_up, w.gate, w.up, stream)
                        : backend == MoeKernel::WGMMA ? wgmma_moe_gate_up(gate_up, w.gate, w.up, stream)
                                                      : moe_gemm_gate_up(gate_up, w.gate, w.up, stream));
  profile_mark("MoE gate_up");
  GroupedGemmArgs down = gate_up;
  down.act = static_cast<const uint16_t*>(ws.act), down.sorted_pairs = nullptr, down.top_k = 1,
  down.row_scales = nullptr;
  down.out = ws.y, down.out_fp32 = false;
  down.act_fragment_order = frag_mid, down.out_fragment_order = false;
  if (is_w4a4(mode)) {
    for (int i = 0; i < op_repeats("act_quant"); ++i)
      NIB_RETURN_IF_ERROR(quantize_moe_act(w, mode, pairs, ws, stream, frag_mid));
    profile_mark("MoE SwiGLU quantize");
    down.act = ws.act_hat, down.row_scales = ws.act_row_scales;
  }
  for (int i = 0; i < op_repeats("down"); ++i)
    NIB_RETURN_IF_ERROR(backend == MoeKernel::SKINNY  ? skinny_moe_down(down, w.down, stream)
                        : backend == MoeKernel::WGMMA ? wgmma_moe_down(down, w.down, stream)
                                                      : moe_gemm_down(down, w.down, stream));
  profile_mark("MoE down");
  return Status::ok();
}

}  // namespace

MoeKernel resolve_moe_kernel(MoeKernel backend, int64_t tokens, const DeviceMoeWeights& w) {
  const bool skinny_fits = skinny_supported(w.hidden) && skinny_supported(w.intermediate);
  const bool wgmma_fits = wgmma_supported(w.intermediate, w.hidden) && wgmma_supported(w.hidden, w.intermediate);
  if ((backend == MoeKernel::SKINNY && !skinny_fits) || (backend == MoeKernel::WGMMA && !wgmma_fits))
    return MoeKernel::GROUPED_MMA;
  if (backend != MoeKernel::AUTO) return backend;
  if (tokens * w.top_k < AUTO_SKINNY_MOE_MAX_ROWS_PER_EXPERT * w.experts && skinny_fits) return MoeKernel::SKINNY;
  const bool wgmma_rows = tokens * w.top_k >= AUTO_WGMMA_MOE_MIN_ROWS_PER_EXPERT * w.experts;
  return wgmma_fits && wgmma_rows ? MoeKernel::WGMMA : MoeKernel::GROUPED_MMA;
}

int moe_grouping_tile_rows(MoeKernel kernels, int64_t pairs, const DeviceMoeWeights& w) {
  if (kernels == MoeKernel::SKINNY) return skinny_moe_tile_rows(pairs, w.experts);
  if (kernels == MoeKernel::WGMMA) return wgmma_tile_rows(pairs, w.experts);
  return moe_tile_rows(pairs, w.experts, w.hidden, w.intermediate);
}

template <class T>
Status MoeWorkspace::alloc(T*& ptr, size_t count) {
  void* p = nullptr;
  NIB_RETURN_IF_ERROR(cuda_status(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)), "MoeWorkspace allocation"));
  allocations_.push_back(p);
  ptr = static_cast<T*>(p);
  return Status::ok();
}

MoeWorkspace::~MoeWorkspace() {
  for (void* p : allocations_) cudaFree(p);
}

Result<std::unique_ptr<MoeWorkspace>> MoeWorkspace::create(const DeviceMoeWeights& w, int64_t max_tokens,
                                                           bool dequant_cublas) {
  if (max_tokens < 1 || w.experts < 1 || w.top_k < 1 || w.hidden < 1 || w.intermediate < 1)
    return Status::error("MoeWorkspace: max_tokens and the MoE dimensions must be positive");
  auto ws = std::make_unique<MoeWorkspace>();
  const size_t T = size_t(max_tokens), E = size_t(w.experts), H = size_t(w.hidden), I = size_t(w.intermediate);
  const size_t P = T * size_t(w.top_k);
  ws->max_tokens = max_tokens;
  NIB_RETURN_IF_ERROR(ws->alloc(ws->logits, T * E));
  NIB_RETURN_IF_ERROR(ws->alloc(ws->expert_ids, P));
  NIB_RETURN_IF_ERROR(ws->alloc(ws->route_weights, P));
  NIB_RETURN_IF_ERROR(ws->alloc(ws->groups.expert_offsets, E + 1));
  NIB_RETURN_IF_ERROR(ws->alloc(ws->groups.tile_offsets, E + 1));
  NIB_RETURN_IF_ERROR(ws->alloc(ws->groups.sorted_pairs, P));
  NIB_RETURN_IF_ERROR(ws->alloc(ws->groups.pair_rows, P));
  NIB_RETURN_IF_ERROR(
      ws->alloc(ws->groups.tiles, size_t(max_expert_tiles(int64_t(P), w.experts, SKINNY_MIN_TILE_ROWS))));
  if (w.router_f32) NIB_RETURN_IF_ERROR(ws->alloc(ws->x_f32, T * H));
  NIB_RETURN_IF_ERROR(ws->alloc(ws->x_hat, T * H));
  NIB_RETURN_IF_ERROR(ws->alloc(ws->x_row_scales, T));
  float* act = nullptr;
  NIB_RETURN_IF_ERROR(ws->alloc(act, P * I));  // fp32-sized: also holds the BF16 form
  ws->act = act;
  NIB_RETURN_IF_ERROR(ws->alloc(ws->act_hat, P * I));
  NIB_RETURN_IF_ERROR(ws->alloc(ws->x_frag, T * H));
  NIB_RETURN_IF_ERROR(ws->alloc(ws->act_row_scales, P));
  NIB_RETURN_IF_ERROR(ws->alloc(ws->y, P * H));
  NIB_RETURN_IF_ERROR(ws->alloc(ws->block_barrier, 2));
  NIB_RETURN_IF_ERROR(cuda_status(cudaMemset(ws->block_barrier, 0, 2 * sizeof(uint32_t)), "MoeWorkspace barrier"));
  NIB_RETURN_IF_ERROR(ws->alloc(ws->block_logits, E));  // (tag 0: no launch's)
  NIB_RETURN_IF_ERROR(
      cuda_status(cudaMemset(ws->block_logits, 0, E * sizeof(unsigned long long)), "MoeWorkspace logits"));
  NIB_RETURN_IF_ERROR(ws->alloc(ws->block_partials, H / 16 + 1));
  NIB_RETURN_IF_ERROR(ws->alloc(ws->block_slot_amax, 2 * DECODE_BLOCK_MAX_TOP_K));
  NIB_RETURN_IF_ERROR(cuda_status(cudaMemset(ws->block_slot_amax, 0, 2 * DECODE_BLOCK_MAX_TOP_K * sizeof(uint32_t)),
                                  "MoeWorkspace slot amaxes"));
  if (dequant_cublas) {
    NIB_RETURN_IF_ERROR(ws->alloc(ws->gate_bf16, E * I * H));
    NIB_RETURN_IF_ERROR(ws->alloc(ws->up_bf16, E * I * H));
    NIB_RETURN_IF_ERROR(ws->alloc(ws->down_bf16, E * H * I));
    NIB_RETURN_IF_ERROR(ws->alloc(ws->x_sorted, P * H));
    float* gate_up = nullptr;
    NIB_RETURN_IF_ERROR(ws->alloc(gate_up, P * 2 * I));  // fp32-sized: W4A4 keeps fp32
    ws->gate_up = gate_up;
    NIB_RETURN_IF_ERROR(ws->alloc(ws->pointers, 3 * 2 * E));
  }
  return std::move(ws);
}

Status moe_forward(const DeviceMoeWeights& w, MoeWorkspace& ws, const MoeArgs& args) {
  const uint16_t* x = args.x;
  const int64_t tokens = args.tokens;
  const formats::ActQuant mode = args.mode;
  const MoeKernel backend = args.kernel;
  float* out = args.out;
  const cudaStream_t stream = args.stream;
  const cublasHandle_t cublas = args.cublas;
  const ResidualNorm* norm = args.norm;
  const float* add = args.add;
  const bool x_quantized = args.x_quantized;
  const InputNorm* input_norm = args.input_norm;
  NIB_RETURN_IF_ERROR(check_call(x, tokens, w, mode, ws, norm ? norm->residual : out));
  if (input_norm && (input_norm->out != x || !input_norm->residual || !input_norm->delta || !input_norm->weight ||
                     (norm && norm->residual != input_norm->residual)))
    return Status::error(
        "moe_forward: the input norm needs its residual (the combine's), delta and weight, and writes x");
  if (norm && (!norm->weight || !norm->out || w.hidden > THREADS * 8 * COMBINE_MAX_CHUNKS))
    return Status::error("moe_forward: the fused residual norm needs its weight and output, and hidden ≤ " +
                         std::to_string(THREADS * 8 * COMBINE_MAX_CHUNKS));
  if (norm && norm->quant.x_hat && (!norm->quant.row_scales || !(norm->quant.input_scale >= 0.0f)))
    return Status::error("moe_forward: the fused norm's x̂ needs row scales and an input_scale ≥ 0");
  // Fragment order is the block's own choice for its wgmma input (below); the combine's norm and the
  // one-launch block write x̂ in the natural order only.
  if ((norm && norm->quant.fragment_order) || (input_norm && input_norm->quant.fragment_order))
    return Status::error("moe_forward: the norms' x̂ are natural-order inputs (fragment order is chosen inside)");
  if (tokens == 0) return Status::ok();
  // One token (single-stream decode): the whole block in one launch where it fits.
  // (With x_quantized it computes x̂ of x again: the same bits.)
  if (backend == MoeKernel::AUTO && moe_decode_block_supported(tokens, w, mode, norm, add, input_norm)) {
    for (int i = 1; i < op_repeats("moe_block"); ++i)  // (timing only: the residual gets the output twice)
      NIB_RETURN_IF_ERROR(moe_decode_block(x, w, mode, ws, out, norm, input_norm, stream));
    return moe_decode_block(x, w, mode, ws, out, norm, input_norm, stream);
  }
  if (!cublas) return Status::error("moe_forward: the router GEMM needs a cuBLAS handle");
  RouterArgs router;
  router.x = x, router.router = w.router, router.tokens = tokens, router.hidden = w.hidden, router.experts = w.experts;
  router.top_k = w.top_k, router.norm_topk_prob = w.norm_topk_prob, router.logits = ws.logits;
  router.expert_ids = ws.expert_ids, router.weights = ws.route_weights, router.router_f32 = w.router_f32;
  router.x_f32 = ws.x_f32, router.score_bias = w.score_bias, router.norm_min = w.norm_min;
  router.group_first = w.expert_begin, router.group_count = w.gate.experts;
  const MoeKernel kernels = resolve_moe_kernel(backend, tokens, w);
  const int64_t pairs = tokens * w.top_k;
  // The grouping and the GEMMs share the tile height.
  const int tile_rows = moe_grouping_tile_rows(kernels, pairs, w);
  const bool small = route_small_supported(tokens, w.experts, w.hidden, w.top_k) && backend != MoeKernel::CUBLAS;
  // The router computes the input norm where the combine can add the post-attention output after it.
  const InputNorm* router_norm = small && norm && input_norm && !input_norm->delta_row_scales ? input_norm : nullptr;
  // Into the wgmma kernels the norm writes their input in fragment order (nvfp4_layout.h) as well: x
  // (W4A16), or in place of the natural x̂ it would quantize into ws.x_hat (W4A4).
  const bool x_frag = input_norm && !router_norm && kernels == MoeKernel::WGMMA && wgmma_fragment_order(w.hidden) &&
                      (!is_w4a4(mode) || (x_quantized && input_norm->quant.x_hat == ws.x_hat));
  NormActQuant norm_quant = input_norm ? input_norm->quant : NormActQuant{};
  if (x_frag && is_w4a4(mode)) norm_quant.x_hat = ws.x_frag, norm_quant.fragment_order = true;
  if (input_norm && !router_norm)
    for (int i = 0; i < op_repeats("post_norm"); ++i)
      NIB_RETURN_IF_ERROR(add_rmsnorm(input_norm->residual, input_norm->delta, tokens, w.hidden, input_norm->weight,
                                      input_norm->eps, input_norm->out, stream, nullptr, norm_quant,
                                      input_norm->delta_row_scales, x_frag && !is_w4a4(mode) ? ws.x_frag : nullptr));
  profile_mark("norms");
  const bool mid = !small && backend != MoeKernel::CUBLAS &&
                   route_cluster_supported(tokens, w.experts, w.hidden, w.top_k, w.router_f32 != nullptr);
  if (small) {
    for (int i = 0; i < op_repeats("router"); ++i)
      NIB_RETURN_IF_ERROR(route_and_group_small(router, tile_rows, ws.groups, stream, router_norm));
  } else if (mid) {
    for (int i = 0; i < op_repeats("router"); ++i)
      NIB_RETURN_IF_ERROR(route_and_group_cluster(router, tile_rows, ws.groups, stream));
  } else {
    for (int i = 0; i < op_repeats("router"); ++i) {
      NIB_RETURN_IF_ERROR(route(router, cublas, stream));
      NIB_RETURN_IF_ERROR(group_by_expert(ws.expert_ids, tokens, w.top_k, w.gate.experts, tile_rows, ws.groups, stream,
                                          w.expert_begin));
    }
  }
  profile_mark(router_norm ? "MoE router (+ input norm)" : "MoE router");
  const uint16_t* gate_up_in = x;
  const float* token_scales = nullptr;
  if (is_w4a4(mode)) {
    if (!x_quantized)
      NIB_RETURN_IF_ERROR(quantize_dequantize_activation_bf16(
          x, tokens, w.hidden, mode == formats::ActQuant::STATIC ? w.gate_up_input_scale : 0.0f, ws.x_hat,
          ws.x_row_scales, stream));
    gate_up_in = ws.x_hat, token_scales = ws.x_row_scales;
    profile_mark("MoE input quantize");
  }
  const bool cublas_backend = backend == MoeKernel::CUBLAS;
  if (cublas_backend && w.gate.experts != w.experts)
    return Status::error("moe_forward: --moe-backend cublas runs every expert on one GPU (not expert parallelism)");
  if (cublas_backend)
    NIB_RETURN_IF_ERROR(moe_dequant_cublas(gate_up_in, token_scales, tokens, w, mode, ws, stream, cublas));
  else
    NIB_RETURN_IF_ERROR(run_grouped(gate_up_in, token_scales, tokens, tile_rows, kernels, w, mode, ws, stream, x_frag));
  // The fused down GEMM applied the W4A4 row scales; cuBLAS (alpha per expert only) leaves them to the combine.
  const float* down_row_scales = cublas_backend && is_w4a4(mode) ? ws.act_row_scales : nullptr;
  ResidualNorm fused = norm ? *norm : ResidualNorm{};
  if (router_norm) fused.pending = router_norm->delta;
  for (const void* row_base :
       {static_cast<const void*>(fused.residual), static_cast<const void*>(fused.pending),
        static_cast<const void*>(fused.weight), static_cast<const void*>(add), static_cast<const void*>(out)})
    if (reinterpret_cast<uintptr_t>(row_base) % 16 != 0)
      return Status::error(
          "moe_forward: the combine's residual, pending, norm weight, add and out rows must be 16-byte aligned");
  const int64_t chunks = (w.hidden + THREADS * 8 - 1) / (THREADS * 8);
  const auto combine = !norm         ? combine_kernel<false>
                       : chunks == 1 ? combine_kernel<true, 1>
                       : chunks == 2 ? combine_kernel<true, 2>
                                     : combine_kernel<true, COMBINE_MAX_CHUNKS>;
  for (int i = 0; i < op_repeats("combine"); ++i)
    NIB_RETURN_IF_ERROR(
        cuda_status(launch_pdl(combine, unsigned(tokens), THREADS, 0, stream, static_cast<const uint16_t*>(ws.y),
                               ws.groups.pair_rows, ws.route_weights, down_row_scales, int(w.top_k), int(w.hidden), add,
                               out, fused),
                    "moe combine launch"));
  profile_mark(norm ? "MoE combine + next norm" : "MoE combine");
  return Status::ok();
}

}  // namespace nibble::cuda

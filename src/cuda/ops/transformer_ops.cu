// Kernels of transformer_ops.cuh: one block per row for the norms, one warp per (token, head) for
// the fused q/k norm + RoPE + KV store; fp32 math in the order of the ref:: twins.
#include <cuda_bf16.h>

#include <cmath>

#include "cuda/common/check.cuh"
#include "cuda/nvfp4/nvfp4_act_quant.cuh"
#include "cuda/nvfp4/nvfp4_layout.h"
#include "cuda/common/pdl.cuh"
#include "cuda/ops/qk_norm_rope_device.cuh"
#include "cuda/ops/rmsnorm_row.cuh"
#include "cuda/ops/transformer_ops.cuh"

namespace nibble::cuda {
namespace {

__global__ void embedding_kernel(const int32_t* ids, const int32_t* drawn, const uint16_t* table, int64_t hidden,
                                 float* out, int64_t vocab_begin, int64_t vocab_rows) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t t = blockIdx.x;
  const int64_t id = (ids[t] >= 0 ? ids[t] : drawn[-1 - ids[t]]) - vocab_begin;
  if (id < 0 || id >= vocab_rows) {  // another rank's row
    for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) out[t * hidden + i] = 0.0f;
    return;
  }
  const uint16_t* row = table + id * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) out[t * hidden + i] = bf16_to_float(row[i]);
}

constexpr int ROPE_MAX_PAIRS_PER_LANE = 8;  // head_dim ≤ 512
constexpr int NORM_MAX_PER_THREAD = 32;     // width ≤ 8192

// One block per row, one pass (rmsnorm_row.cuh): each thread keeps its (strided) values and weights
// in registers; the weights are read before the PDL wait (they do not depend on earlier kernels). PER
// values a thread (width ≤ NORM_THREADS · PER): sized to the row, so that the registers of unused
// values do not limit the CTAs an SM holds (PER = 32 took 123 registers, 2 CTAs an SM, for 2,048-wide rows).
template <int PER>
__global__ void __launch_bounds__(NORM_THREADS)
    add_rmsnorm_kernel(float* residual, const float* delta, int64_t width, const uint16_t* weight, float eps,
                       uint16_t* out, const int32_t* rows, NormActQuant quant, const float* delta_row_scales,
                       uint16_t* out_frag) {
  float w[PER], v[PER];
  load_norm_weight(weight, width, true, w);
  pdl_wait();
  pdl_launch_dependents();
  const int64_t r = blockIdx.x, src = rows ? rows[r] : r;
  float* x = residual + src * width;
  load_row(x, delta ? delta + src * width : nullptr, width, true, v, delta_row_scales ? delta_row_scales[r] : 1.0f);
  if (delta)
#pragma unroll
    for (int k = 0; k < PER; ++k) {
      const int64_t i = threadIdx.x + int64_t{k} * NORM_THREADS;
      if (i < width) x[i] = v[k];
    }
  __shared__ float partial[NORM_THREADS / 32];
  normalize_row(v, w, width, eps, partial);
#pragma unroll
  for (int k = 0; k < PER; ++k) {
    const int64_t i = threadIdx.x + int64_t{k} * NORM_THREADS;
    if (i < width) out[r * width + i] = float_to_bf16(v[k]);
    // A warp's 32 consecutive values are one 32-column group: its stores stay one 64-byte run.
    if (out_frag && i < width) out_frag[r * width + fragment_order_index(i)] = float_to_bf16(v[k]);
  }
  if (quant.x_hat) quantize_row(v, width, quant, r, partial);
}

// A warp per ITEMS consecutive heads of one kind of one token: heads [0, NH) are q, [NH, NH + NKV) k,
// then the NKV v heads; every item's loads are issued before any item's math, and the token's RoPE
// cos/sin are computed once for the warp's items. A lane holds PAIRS consecutive
// rotation pairs (head_dim ≤ 64 · PAIRS), read and written as runs with vector loads and stores
// (the host checked their alignment). KV: the cache's element, uint16_t (BF16) or uint8_t (FP8 codes).
template <int PAIRS, int ITEMS, typename KV>
__global__ void qk_norm_rope_store_kernel(const QkvInput in, QkvLayout l, const uint16_t* q_norm,
                                          const uint16_t* k_norm, float eps, float* q_out, uint16_t* q_out_bf16,
                                          KV* k_cache, KV* v_cache, float k_scale, float v_scale) {
  // Index math in 32 bits (the host bounds tokens · heads · head_dim and the row strides), widened
  // once per address: in 64 bits it was a third of the kernel's instructions, which bound prefill.
  const int lane = threadIdx.x & 31;
  const int D = int(l.head_dim), half = D / 2, kv_width = int(l.n_kv_heads) * D, i0 = lane * PAIRS;
  const bool active = i0 < half;
  // The norm weights and RoPE frequencies do not depend on earlier kernels: read before the wait.
  float qw_lo[PAIRS] = {}, qw_hi[PAIRS] = {}, kw_lo[PAIRS] = {}, kw_hi[PAIRS] = {}, freq[PAIRS] = {};
  if (active) {
    if (q_norm) load_pairs<PAIRS>(q_norm, i0, half, l.interleaved, qw_lo, qw_hi);
    if (k_norm) load_pairs<PAIRS>(k_norm, i0, half, l.interleaved, kw_lo, kw_hi);
#pragma unroll
    for (int p = 0; p < PAIRS; ++p) freq[p] = l.inv_freq[i0 + p];
  }
  pdl_wait();
  pdl_launch_dependents();
  const int warp = int((blockIdx.x * blockDim.x + threadIdx.x) >> 5);
  const int heads = int(l.n_heads + 2 * l.n_kv_heads), warps_per_token = (heads + ITEMS - 1) / ITEMS;
  const int n_heads = int(l.n_heads), n_kv_heads = int(l.n_kv_heads);
  const int t = warp / warps_per_token;
  if (t >= l.tokens) return;
  // The warp's ITEMS consecutive heads are of one kind, q, k or v (the host gives a warp 4 only where
  // the q and the kv head counts are multiples of 4), so their sources, scale and destination are
  // chosen once: per item they were ~40% of the kernel's instructions, which bound prefill.
  const int h0 = (warp % warps_per_token) * ITEMS;
  const int which = h0 < n_heads ? 0 : h0 < n_heads + n_kv_heads ? 1 : 2;  // q, k, v
  const int head0 = which == 0 ? h0 : which == 1 ? h0 - n_heads : h0 - n_heads - n_kv_heads;
  const float* base = which == 0 ? in.q : which == 1 ? in.k : in.v;
  const int stride = in.row_stride ? int(in.row_stride) : which == 0 ? n_heads * D : kv_width;
  const float* src = base + int64_t(t) * stride + head0 * D;
  // (y · scale) · row_scale, as the GEMM epilogue and the row-scale pass round it; exact when both are 1.
  const float scale = which == 0 ? in.scale[0] : which == 1 ? in.scale[1] : in.scale[2];
  const float row_scale = in.row_scales ? in.row_scales[t] : 1.0f;
  // Every item's loads before any of their math (a lane past the pairs reads the row's first ones,
  // unused).
  float lo[ITEMS][PAIRS], hi[ITEMS][PAIRS];
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) load_pairs<PAIRS>(src + j * D, active ? i0 : 0, half, l.interleaved, lo[j], hi[j]);
#pragma unroll
  for (int j = 0; j < ITEMS; ++j)
#pragma unroll
    for (int p = 0; p < PAIRS; ++p) lo[j][p] = lo[j][p] * scale * row_scale, hi[j][p] = hi[j][p] * scale * row_scale;
  const int64_t slot = l.slots[t];
  if (which == 2) {  // v: stored as it is (an FP8 cache: / v_scale, ref::kv_round)
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      if constexpr (sizeof(KV) == 1)
#pragma unroll
        for (int p = 0; p < PAIRS; ++p) lo[j][p] /= v_scale, hi[j][p] /= v_scale;
      if (active)
        store_pairs<PAIRS>(v_cache + slot * kv_width + (head0 + j) * D, i0, half, l.interleaved, lo[j], hi[j]);
    }
    return;
  }
  // ref::rope_neox / rope_interleaved: fp32 angle, cos and sin.
  float cos_p[PAIRS], sin_p[PAIRS];
  const float position = static_cast<float>(l.positions[t]);
#pragma unroll
  for (int p = 0; p < PAIRS; ++p) {
    sincosf(position * freq[p], &sin_p[p], &cos_p[p]);
    sin_p[p] *= l.rope_scaling, cos_p[p] *= l.rope_scaling;
  }
  const bool is_q = which == 0;
  const bool normed = (is_q ? q_norm : k_norm) != nullptr;  // null: no q/k norm (ERNIE-4.5)
  // The heads' norm weights by value: choosing between the arrays themselves put all four in local
  // memory (an array picked at run time has no registers to live in).
  float w_lo[PAIRS], w_hi[PAIRS];
#pragma unroll
  for (int p = 0; p < PAIRS; ++p) w_lo[p] = is_q ? qw_lo[p] : kw_lo[p], w_hi[p] = is_q ? qw_hi[p] : kw_hi[p];
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) {
    float x0[PAIRS], x1[PAIRS];
    norm_rope_head<PAIRS>(lo[j], hi[j], active, normed, w_lo, w_hi, eps, float(D), cos_p, sin_p, x0, x1);
    if (!active) continue;
    if (is_q) {
      const int64_t at = int64_t(t * n_heads + head0 + j) * D;
      if (q_out_bf16)
        store_pairs<PAIRS>(q_out_bf16 + at, i0, half, l.interleaved, x0, x1);
      else
        store_pairs<PAIRS>(q_out + at, i0, half, l.interleaved, x0, x1);
    } else {
      if constexpr (sizeof(KV) == 1)
#pragma unroll
        for (int p = 0; p < PAIRS; ++p) x0[p] /= k_scale, x1[p] /= k_scale;
      store_pairs<PAIRS>(k_cache + slot * kv_width + (head0 + j) * D, i0, half, l.interleaved, x0, x1);
    }
  }
}

__global__ void silu_mul_kernel(const float* gate, const float* up, int64_t n, uint16_t* out) {
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = gate[i];
    out[i] = float_to_bf16(g / (1.0f + expf(-g)) * up[i]);
  }
}

__global__ void to_bf16_kernel(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = float_to_bf16(x[i]);
}

int grid_for(int64_t n, int threads) { return static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 65536)); }

}  // namespace

Status embedding_gather(const int32_t* ids, int64_t tokens, const uint16_t* table, int64_t hidden, float* out,
                        cudaStream_t stream, const int32_t* drawn, int64_t vocab_begin, int64_t vocab_rows) {
  if (tokens <= 0) return Status::ok();
  return cuda_status(launch_pdl(embedding_kernel, dim3(unsigned(tokens)), dim3(256), 0, stream, ids, drawn, table,
                                hidden, out, vocab_begin, vocab_rows),
                     "embedding_gather");
}

Status add_rmsnorm(float* residual, const float* delta, int64_t n_rows, int64_t width, const uint16_t* weight,
                   float eps, uint16_t* out, cudaStream_t stream, const int32_t* rows, const NormActQuant& quant,
                   const float* delta_row_scales, uint16_t* out_fragment_order) {
  if (n_rows <= 0) return Status::ok();
  if ((out_fragment_order || (quant.x_hat && quant.fragment_order)) && width % 32 != 0)
    return Status::error("add_rmsnorm: fragment order needs width a multiple of 32");
  if (delta_row_scales && !delta) return Status::error("add_rmsnorm: delta row scales without a delta");
  if (quant.x_hat && (width % 16 != 0 || !quant.row_scales || !(quant.input_scale >= 0.0f)))
    return Status::error("add_rmsnorm: x̂ needs width a multiple of 16, row scales and an input_scale ≥ 0");
  if (rows && delta) return Status::error("add_rmsnorm: a row selection reads the residual only (no delta)");
  if (width > NORM_THREADS * NORM_MAX_PER_THREAD)
    return Status::error("add_rmsnorm: width " + std::to_string(width) + " > " +
                         std::to_string(NORM_THREADS * NORM_MAX_PER_THREAD));
  const auto kernel = width <= NORM_THREADS * 8    ? add_rmsnorm_kernel<8>
                      : width <= NORM_THREADS * 16 ? add_rmsnorm_kernel<16>
                                                   : add_rmsnorm_kernel<NORM_MAX_PER_THREAD>;
  return cuda_status(launch_pdl(kernel, dim3(unsigned(n_rows)), dim3(NORM_THREADS), 0, stream, residual, delta, width,
                                weight, eps, out, rows, quant, delta_row_scales, out_fragment_order),
                     "add_rmsnorm");
}

Status qk_norm_rope_store(const QkvInput& in, const QkvLayout& layout, const uint16_t* q_norm, const uint16_t* k_norm,
                          float eps, float* q_out, void* k_cache, void* v_cache, cudaStream_t stream,
                          uint16_t* q_out_bf16, KvFormat kv_format, float k_scale, float v_scale) {
  if (layout.tokens <= 0) return Status::ok();
  const int64_t half = layout.head_dim / 2;
  // A lane's pairs: the fewest that cover half a head with 32 lanes, a whole number of them.
  const int pairs = half <= 32 ? 1 : half <= 64 ? 2 : half <= 128 ? 4 : 8;
  if (layout.head_dim % 2 != 0 || half > 32 * ROPE_MAX_PAIRS_PER_LANE || half % pairs != 0)
    return Status::error("qk_norm_rope_store: head_dim " + std::to_string(layout.head_dim) +
                         " unsupported (even, at most 512, and half of it a multiple of " + std::to_string(pairs) +
                         ")");
  if (!layout.inv_freq) return Status::error("qk_norm_rope_store: no inv_freq table");
  // Runs of 2 · pairs values (interleaved) start at multiples of that many elements of each row.
  const auto aligned = [&](const void* p, size_t element) {
    return reinterpret_cast<uintptr_t>(p) % (2 * size_t(pairs) * element) == 0;
  };
  const size_t kv_element = kv_format == KvFormat::FP8 ? 1 : 2;
  if (!aligned(in.q, 4) || !aligned(in.k, 4) || !aligned(in.v, 4) || !aligned(q_out, 4) || !aligned(q_out_bf16, 2) ||
      !aligned(k_cache, kv_element) || !aligned(v_cache, kv_element) || !aligned(q_norm, 2) || !aligned(k_norm, 2) ||
      in.row_stride % (2 * pairs) != 0)
    return Status::error("qk_norm_rope_store: q/k/v, caches and norm weights must be aligned to " +
                         std::to_string(2 * pairs) + " elements");
  const int64_t heads = layout.n_heads + 2 * layout.n_kv_heads;
  if (layout.tokens * heads > INT32_MAX / 2 || in.row_stride > INT32_MAX || heads * layout.head_dim > INT32_MAX / 2)
    return Status::error("qk_norm_rope_store: tokens · heads must be below 2^30 (and a row below 2^30 values)");
  // Four heads a warp for prefill (fewer waves) where every warp's four are of one kind; one for decode
  // (the shortest chain for a step of few warps: 4 there cost tg128 ~6%).
  const int per_warp = layout.tokens >= 256 && layout.n_heads % 4 == 0 && layout.n_kv_heads % 4 == 0 ? 4 : 1;
  const int64_t warps = layout.tokens * ((heads + per_warp - 1) / per_warp);
  const int threads = 256;
  const int64_t blocks = (warps * 32 + threads - 1) / threads;
  const int index = pairs == 1 ? 0 : pairs == 2 ? 1 : pairs == 4 ? 2 : 3;
  if (kv_format == KvFormat::FP8 && !(k_scale > 0.0f && v_scale > 0.0f))
    return Status::error("qk_norm_rope_store: an FP8 cache's k_scale and v_scale must be > 0");
  auto launch = [&](auto element_tag) -> Status {
    using KV = decltype(element_tag);
    using Kernel = void (*)(QkvInput, QkvLayout, const uint16_t*, const uint16_t*, float, float*, uint16_t*, KV*, KV*,
                            float, float);
    const Kernel kernels[2][4] = {{qk_norm_rope_store_kernel<1, 1, KV>, qk_norm_rope_store_kernel<2, 1, KV>,
                                   qk_norm_rope_store_kernel<4, 1, KV>, qk_norm_rope_store_kernel<8, 1, KV>},
                                  {qk_norm_rope_store_kernel<1, 4, KV>, qk_norm_rope_store_kernel<2, 4, KV>,
                                   qk_norm_rope_store_kernel<4, 4, KV>, qk_norm_rope_store_kernel<8, 4, KV>}};
    return cuda_status(launch_pdl(kernels[per_warp == 4][index], dim3(unsigned(blocks)), dim3(threads), 0, stream, in,
                                  layout, q_norm, k_norm, eps, q_out, q_out_bf16, static_cast<KV*>(k_cache),
                                  static_cast<KV*>(v_cache), k_scale, v_scale),
                       "qk_norm_rope_store");
  };
  return kv_format == KvFormat::FP8 ? launch(uint8_t{}) : launch(uint16_t{});
}

Status silu_mul_bf16(const float* gate, const float* up, int64_t n, uint16_t* out, cudaStream_t stream) {
  if (n <= 0) return Status::ok();
  return cuda_status(
      launch_pdl(silu_mul_kernel, dim3(unsigned(grid_for(n, 256))), dim3(256), 0, stream, gate, up, n, out),
      "silu_mul_bf16");
}

Status to_bf16(const float* x, int64_t n, uint16_t* out, cudaStream_t stream) {
  if (n <= 0) return Status::ok();
  to_bf16_kernel<<<grid_for(n, 256), 256, 0, stream>>>(x, n, out);
  return cuda_status(cudaGetLastError(), "to_bf16");
}

Status linear_bf16(const uint16_t* x, int64_t M, const uint16_t* w, int64_t N, int64_t K, float* y,
                   cublasHandle_t cublas) {
  if (M <= 0) return Status::ok();
  // Row-major y[M,N] = x[M,K]·W[N,K]ᵀ: column-major yᵀ[N,M] = (W as col-major K×N)ᵀ · xᵀ.
  const float one = 1.0f, zero = 0.0f;
  return cublas_status(
      cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K),
                   &one, w, CUDA_R_16BF, static_cast<int>(K), x, CUDA_R_16BF, static_cast<int>(K), &zero, y, CUDA_R_32F,
                   static_cast<int>(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "linear_bf16");
}

}  // namespace nibble::cuda

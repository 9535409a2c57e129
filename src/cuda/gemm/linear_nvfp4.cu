// Dense NVFP4 W4A16 kernels. GEMV: each warp owns two output rows; each lane loads all its
// 16-byte pieces of codes (32 weights, two blocks each) up front, decodes them (nvfp4_layout.h) to
// floats and multiplies with up to 8 rows of x staged in shared memory (fp32 accumulators); a warp
// reduction writes y. CUBLAS: an elementwise dequantize to BF16, then cublasGemmEx with
// alpha = weight_scale_2.
#include "cuda/gemm/linear_nvfp4.cuh"

#include <cuda_bf16.h>

#include <algorithm>

#include "cuda/common/check.cuh"
#include "cuda/nvfp4/nvfp4_fragments.cuh"
#include "cuda/gemm/nvfp4_wgmma.cuh"
#include "cuda/nvfp4/quantize_nvfp4.cuh"
#include "cuda/gemm/skinny_gemm.cuh"
#include "formats/bf16.h"

namespace nibble::cuda {
namespace {

constexpr int WARPS_PER_BLOCK = 4;
constexpr int ROWS_PER_WARP = 2;  // output rows per warp: more weight loads in flight per lane
constexpr int ROWS_PER_BLOCK = WARPS_PER_BLOCK * ROWS_PER_WARP;
constexpr int CODES_PER_LANE = 32;  // one 16-byte load
constexpr int CODES_PER_STEP = 32 * CODES_PER_LANE;
constexpr int M_TILE = 8;  // rows of x per block (grid.y covers the rest)

// STEPS = ceil(K / 1024): every weight load of a lane is issued before any is used, so a warp keeps
// STEPS × ROWS_PER_WARP 16-byte loads per lane in flight (what a memory-bound GEMV needs). x rows
// are staged once per block in shared memory (BF16).
template <int MT, int STEPS>
__global__ void __launch_bounds__(WARPS_PER_BLOCK * 32)
    gemv_nvfp4_kernel(const uint16_t* __restrict__ x, int M, int K, const uint8_t* __restrict__ packed,
                      const uint8_t* __restrict__ scales, int N, float alpha, const float* __restrict__ row_scales,
                      float* __restrict__ y) {
  extern __shared__ __align__(16) uint8_t smem[];
  uint16_t* xs = reinterpret_cast<uint16_t*>(smem);
  const int lane = threadIdx.x & 31;
  const int n0 = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5) * ROWS_PER_WARP;
  // The weight loads go out first, so their latency overlaps the x staging.
  uint4 codes[ROWS_PER_WARP][STEPS];
  uint16_t scale_bits[ROWS_PER_WARP][STEPS];
#pragma unroll
  for (int r = 0; r < ROWS_PER_WARP; ++r)
#pragma unroll
    for (int s = 0; s < STEPS; ++s) {
      const int k0 = s * CODES_PER_STEP + lane * CODES_PER_LANE;
      const int n = n0 + r;
      if (n < N && k0 < K) {
        codes[r][s] = __ldg(reinterpret_cast<const uint4*>(packed + size_t(n) * (K / 2) + k0 / 2));
        scale_bits[r][s] = __ldg(reinterpret_cast<const uint16_t*>(scales + size_t(n) * (K / 16) + k0 / 16));
      }
    }
  const int m0 = blockIdx.y * MT;
  const int rows = min(MT, M - m0);
  const int x_words = rows * K / 8;  // uint4 = 8 BF16
  for (int i = threadIdx.x; i < x_words; i += blockDim.x)
    reinterpret_cast<uint4*>(xs)[i] = __ldg(reinterpret_cast<const uint4*>(x + size_t(m0) * K) + i);
  __syncthreads();
  if (n0 >= N) return;
  float acc[ROWS_PER_WARP][MT];
#pragma unroll
  for (int r = 0; r < ROWS_PER_WARP; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[r][m] = 0.0f;
#pragma unroll
  for (int s = 0; s < STEPS; ++s) {
    const int k0 = s * CODES_PER_STEP + lane * CODES_PER_LANE;
    if (k0 >= K) break;
#pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; ++r) {
      const uint32_t words[4] = {codes[r][s].x, codes[r][s].y, codes[r][s].z, codes[r][s].w};
      float w[CODES_PER_LANE];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t pair[4];  // E2M1 × 2⁻¹²⁶ as BF16 pairs: × 2¹²⁶ in fp32 is the code's value, exactly
        decode_code_word(words[j], pair);
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          w[8 * j + 2 * b] = __uint_as_float(pair[b] << 16) * 0x1p126f;
          w[8 * j + 2 * b + 1] = __uint_as_float(pair[b] & 0xFFFF0000u) * 0x1p126f;
        }
      }
      const float scale0 = block_scale_value(scale_bits[r][s] & 0xFF);
      const float scale1 = block_scale_value(scale_bits[r][s] >> 8);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        if (m >= rows) break;
        const uint4* xr = reinterpret_cast<const uint4*>(xs + m * K + k0);
        float part[2] = {0.0f, 0.0f};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const uint4 xv = xr[q];
          const uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
          for (int t = 0; t < 4; ++t) {
            const int i = 8 * q + 2 * t;
            part[i / 16] += w[i] * formats::bf16_decode(uint16_t(xw[t] & 0xFFFF)) +
                            w[i + 1] * formats::bf16_decode(uint16_t(xw[t] >> 16));
          }
        }
        acc[r][m] += part[0] * scale0 + part[1] * scale1;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < ROWS_PER_WARP; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      float v = acc[r][m];
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
      if (lane == 0 && m < rows && n0 + r < N)
        y[size_t(m0 + m) * N + n0 + r] = v * (row_scales ? alpha * row_scales[m0 + m] : alpha);
    }
}

template <int MT, int STEPS>
Status launch_gemv(const uint16_t* x, int M, int K, const DeviceNvfp4Weight& w, const float* row_scales, float* y,
                   cudaStream_t stream) {
  const size_t smem = size_t(MT) * K * sizeof(uint16_t);
  auto kernel = gemv_nvfp4_kernel<MT, STEPS>;
  if (smem > 48 * 1024)
    NIB_RETURN_IF_ERROR(
        cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
                    "linear_nvfp4 (fused): shared memory"));
  const int N = int(w.rows);
  const dim3 grid(unsigned((N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK), unsigned((M + MT - 1) / MT));
  kernel<<<grid, WARPS_PER_BLOCK * 32, smem, stream>>>(x, M, K, w.packed, w.block_scales, N, w.weight_scale_2,
                                                       row_scales, y);
  return cuda_status(cudaGetLastError(), "linear_nvfp4 (fused) launch");
}

template <int MT>
Status launch_gemv_for_k(const uint16_t* x, int M, int K, const DeviceNvfp4Weight& w, const float* row_scales, float* y,
                         cudaStream_t stream) {
  const int steps = (K + CODES_PER_STEP - 1) / CODES_PER_STEP;
  if (steps <= 1) return launch_gemv<MT, 1>(x, M, K, w, row_scales, y, stream);
  if (steps <= 2) return launch_gemv<MT, 2>(x, M, K, w, row_scales, y, stream);
  if (steps <= 4) return launch_gemv<MT, 4>(x, M, K, w, row_scales, y, stream);
  if (steps <= 8) return launch_gemv<MT, 8>(x, M, K, w, row_scales, y, stream);
  return Status::error("linear_nvfp4 (gemv): in_features " + std::to_string(K) + " > 8192; use cublas");
}

// Each thread: one repacked word of codes (8 weights of one block half) → 8 BF16 values, exact
// (e2m1 · e4m3 has at most 6 significant bits): the GEMMs' decode, then × 2⁸ to undo its 2⁻⁸.
__global__ void dequantize_kernel(const uint8_t* __restrict__ packed, const uint8_t* __restrict__ scales,
                                  int64_t n_words, bool line_order, uint16_t* __restrict__ out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_words) return;
  const uint32_t word = __ldg(reinterpret_cast<const uint32_t*>(packed) + i);
  // Stored word i holds weights 8i … 8i + 7, or in line order those of chunk line_order_chunk of its
  // 128-block (nvfp4_layout.h), and the scale code of that chunk's k16 block.
  const int64_t line = i / 16;
  const int s = int(i % 16);
  const int64_t at = line_order ? 16 * line + line_order_chunk(s) : i;
  const uint32_t scale = block_scale_bf16x2(scales[line_order ? (at / 2) : i / 2], 0);
  constexpr uint32_t EPILOGUE = 0x43804380u;  // BF16 pair of 256 = WEIGHT_DECODE_EPILOGUE
  static_assert(WEIGHT_DECODE_EPILOGUE == 256.0f);
  uint32_t result[4];
  decode_code_word(word, result);
#pragma unroll
  for (int b = 0; b < 4; ++b) result[b] = bf16x2_mul(bf16x2_mul(result[b], scale), EPILOGUE);
  reinterpret_cast<uint4*>(out)[at] = make_uint4(result[0], result[1], result[2], result[3]);
}

// y[m, :] *= row_scales[m] (the W4A4 epilogue after cuBLAS).
__global__ void scale_rows_kernel(float* __restrict__ y, int64_t N, int64_t total,
                                  const float* __restrict__ row_scales) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < total) y[i] *= row_scales[i / N];
}

Status check_weight(const DeviceNvfp4Weight& w) {
  if (!w.packed || !w.block_scales) return Status::error("linear_nvfp4: null weight pointers");
  if (w.rows <= 0 || w.cols <= 0 || w.cols % 32 != 0)
    return Status::error("linear_nvfp4: weight [" + std::to_string(w.rows) + ", " + std::to_string(w.cols) +
                         "] needs in_features a positive multiple of 32");
  if (w.rows > INT32_MAX || w.cols > INT32_MAX) return Status::error("linear_nvfp4: weight too large");
  return Status::ok();
}

}  // namespace

// The fused GEMV unrolls at most 8 steps of CODES_PER_STEP codes over k (launch_gemv_for_k).
bool gemv_supported(int64_t in_features) { return in_features <= 8 * CODES_PER_STEP; }

DenseKernel resolve_dense_kernel(DenseKernel backend, int64_t M, int64_t K) {
  // A kernel that cannot take this K falls back to AUTO's choice (e.g. the fused GEMV on ERNIE-4.5's
  // dense down_proj, K = 12,288: skinny).
  if ((backend == DenseKernel::SKINNY && !skinny_linear_supported(K)) ||
      (backend == DenseKernel::GEMV && !gemv_supported(K)) ||
      (backend == DenseKernel::WGMMA && !wgmma_supported(1, K)) ||
      (backend == DenseKernel::SKINNY_SPLIT && (!skinny_linear_supported(K) || M > SKINNY_SPLIT_MAX_M)))
    backend = DenseKernel::AUTO;
  if (backend != DenseKernel::AUTO) return backend;
  if (M >= AUTO_SKINNY_SPLIT_MIN_M && M <= AUTO_SKINNY_SPLIT_MAX_M && skinny_linear_supported(K))
    return DenseKernel::SKINNY_SPLIT;
  if (M <= AUTO_SKINNY_MAX_M && skinny_linear_supported(K)) return DenseKernel::SKINNY;
  return M <= AUTO_GEMV_MAX_M && gemv_supported(K) ? DenseKernel::GEMV : DenseKernel::CUBLAS;
}

Status dequantize_nvfp4_bf16(const DeviceNvfp4Weight& w, uint16_t* out, cudaStream_t stream, bool line_order) {
  NIB_RETURN_IF_ERROR(check_weight(w));
  const int64_t n_words = w.rows * w.cols / 8;
  const int threads = 256;
  dequantize_kernel<<<unsigned((n_words + threads - 1) / threads), threads, 0, stream>>>(w.packed, w.block_scales,
                                                                                         n_words, line_order, out);
  return cuda_status(cudaGetLastError(), "dequantize_nvfp4_bf16 launch");
}

Status linear_nvfp4_w4a16(const uint16_t* x, int64_t M, const DeviceNvfp4Weight& w, float* y, DenseKernel backend,
                          const GemmContext& ctx, const float* row_scales) {
  NIB_RETURN_IF_ERROR(check_weight(w));
  if (M <= 0 || M > INT32_MAX) return Status::error("linear_nvfp4: M must be in [1, 2^31)");
  if (!x || !y) return Status::error("linear_nvfp4: null activation or output");
  const DeviceNvfp4Weight* weights[1] = {&w};
  float* outputs[1] = {y};
  backend = resolve_dense_kernel(backend, M, w.cols);
  if (backend == DenseKernel::SKINNY) return skinny_linear(x, M, weights, outputs, 1, row_scales, ctx.stream);
  if (backend == DenseKernel::SKINNY_SPLIT)
    return skinny_linear_split(x, M, weights, outputs, 1, row_scales, ctx.stream);
  if (backend == DenseKernel::WGMMA) return wgmma_linear(x, M, w, y, row_scales, ctx.stream);
  const int K = int(w.cols), N = int(w.rows);
  if (backend == DenseKernel::GEMV) {
    if (reinterpret_cast<uintptr_t>(x) % 16 || reinterpret_cast<uintptr_t>(w.packed) % 16)
      return Status::error("linear_nvfp4 (fused): x and the packed weight must be 16-byte aligned");
    if (M == 1) return launch_gemv_for_k<1>(x, int(M), K, w, row_scales, y, ctx.stream);
    if (M <= 4) return launch_gemv_for_k<4>(x, int(M), K, w, row_scales, y, ctx.stream);
    return launch_gemv_for_k<M_TILE>(x, int(M), K, w, row_scales, y, ctx.stream);
  }
  if (!ctx.cublas) return Status::error("linear_nvfp4 (cublas): no cuBLAS handle");
  const uint16_t* dequantized = w.bf16;
  if (!dequantized) {
    if (ctx.workspace_elements < size_t(w.rows * w.cols))
      return Status::error("linear_nvfp4 (cublas): workspace holds " + std::to_string(ctx.workspace_elements) +
                           " BF16 values, the weight needs " + std::to_string(w.rows * w.cols));
    NIB_RETURN_IF_ERROR(dequantize_nvfp4_bf16(w, ctx.workspace, ctx.stream));
    dequantized = ctx.workspace;
  }
  cublasStatus_t s = cublasSetStream(ctx.cublas, ctx.stream);
  // Row-major y[M,N] = x[M,K]·Wᵀ is column-major yᵀ[N,M] = W(col-major K×N)ᵀ · xᵀ(col-major K×M).
  const float alpha = w.weight_scale_2, beta = 0.0f;
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasGemmEx(ctx.cublas, CUBLAS_OP_T, CUBLAS_OP_N, N, int(M), K, &alpha, dequantized, CUDA_R_16BF, K, x,
                     CUDA_R_16BF, K, &beta, y, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  NIB_RETURN_IF_ERROR(cublas_status(s, "linear_nvfp4 (cublas)"));
  if (!row_scales) return Status::ok();
  const int64_t total = M * w.rows;
  scale_rows_kernel<<<unsigned((total + 255) / 256), 256, 0, ctx.stream>>>(y, w.rows, total, row_scales);
  return cuda_status(cudaGetLastError(), "linear_nvfp4 row scales launch");
}

// W4A4 of one token on the skinny kernel: x's quantize inside the GEMM (skinny_linear_quantizing), so
// a decode step's o projection is one launch, not a quantize launch then the GEMM (tg128 +2.2% static,
// +2.6% per-token on the H200; docs/lab/perf-notebook.md).
static bool fused_quantize(int64_t M, int64_t K, DenseKernel backend) {
  return M == 1 && skinny_supported(K) && resolve_dense_kernel(backend, M, K) == DenseKernel::SKINNY;
}

Status linear_nvfp4(const uint16_t* x, int64_t M, const DeviceNvfp4Weight& w, formats::ActQuant mode, float input_scale,
                    float* y, DenseKernel backend, const GemmContext& ctx, bool x_quantized,
                    const float** deferred_row_scales) {
  if (deferred_row_scales) *deferred_row_scales = nullptr;
  if (mode == formats::ActQuant::NONE) return linear_nvfp4_w4a16(x, M, w, y, backend, ctx);
  if (mode == formats::ActQuant::STATIC && !(input_scale > 0.0f))
    return Status::error("linear_nvfp4 (static): input_scale must be > 0");
  if (!ctx.act_workspace || !ctx.row_scales || ctx.act_workspace_elements < size_t(M * w.cols))
    return Status::error("linear_nvfp4 (W4A4): needs an activation workspace of " + std::to_string(M * w.cols) +
                         " BF16 values and " + std::to_string(M) + " row scales");
  if (!x_quantized && fused_quantize(M, w.cols, backend)) {
    const DeviceNvfp4Weight* weights[1] = {&w};
    return skinny_linear_quantizing(x, weights, &y, 1, mode == formats::ActQuant::STATIC ? input_scale : 0.0f,
                                    ctx.act_workspace, ctx.row_scales, ctx.stream);
  }
  if (!x_quantized)
    NIB_RETURN_IF_ERROR(quantize_dequantize_activation_bf16(x, M, w.cols,
                                                            mode == formats::ActQuant::STATIC ? input_scale : 0.0f,
                                                            ctx.act_workspace, ctx.row_scales, ctx.stream));
  if (mode == formats::ActQuant::PER_TOKEN) {
    // cuBLAS cannot scale rows in its epilogue: hand the scales to the consumer instead of a pass over y
    // (a prefill's o projection: 14.5 µs a layer at 2,048 tokens on the H200).
    const bool defer = deferred_row_scales && resolve_dense_kernel(backend, M, w.cols) == DenseKernel::CUBLAS;
    if (defer) *deferred_row_scales = ctx.row_scales;
    return linear_nvfp4_w4a16(ctx.act_workspace, M, w, y, backend, ctx, defer ? nullptr : ctx.row_scales);
  }
  // Static: one scale for every row, folded into the GEMM's alpha (no pass over y).
  DeviceNvfp4Weight scaled = w;
  scaled.weight_scale_2 = w.weight_scale_2 * input_scale;
  return linear_nvfp4_w4a16(ctx.act_workspace, M, scaled, y, backend, ctx, nullptr);
}

Status linear_nvfp4_shared_input(const uint16_t* x, int64_t M, const DeviceNvfp4Weight* const* weights,
                                 float* const* outputs, int count, formats::ActQuant mode, float input_scale,
                                 DenseKernel backend, const GemmContext& ctx, bool x_quantized) {
  const bool same_k = count > 1 && count <= 3 && std::all_of(weights, weights + count, [&](const DeviceNvfp4Weight* w) {
                        return w->cols == weights[0]->cols;
                      });
  const DenseKernel chosen = same_k ? resolve_dense_kernel(backend, M, weights[0]->cols) : backend;
  const bool one_launch = same_k && (chosen == DenseKernel::SKINNY || chosen == DenseKernel::SKINNY_SPLIT);
  // One launch for all: the split kernel or the per-tile one.
  auto skinny = [&](const uint16_t* in, const float* row_scales) {
    return chosen == DenseKernel::SKINNY_SPLIT
               ? skinny_linear_split(in, M, weights, outputs, count, row_scales, ctx.stream)
               : skinny_linear(in, M, weights, outputs, count, row_scales, ctx.stream);
  };
  if (!one_launch) {
    for (int i = 0; i < count; ++i)
      NIB_RETURN_IF_ERROR(linear_nvfp4(x, M, *weights[i], mode, input_scale, outputs[i], backend, ctx, x_quantized));
    return Status::ok();
  }
  for (int i = 0; i < count; ++i) NIB_RETURN_IF_ERROR(check_weight(*weights[i]));
  if (mode == formats::ActQuant::NONE) return skinny(x, nullptr);
  if (mode == formats::ActQuant::STATIC && !(input_scale > 0.0f))
    return Status::error("linear_nvfp4 (static): input_scale must be > 0");
  if (!ctx.act_workspace || !ctx.row_scales || ctx.act_workspace_elements < size_t(M * weights[0]->cols))
    return Status::error("linear_nvfp4 (W4A4): needs an activation workspace of " +
                         std::to_string(M * weights[0]->cols) + " BF16 values and " + std::to_string(M) +
                         " row scales");
  if (!x_quantized && fused_quantize(M, weights[0]->cols, backend))
    return skinny_linear_quantizing(x, weights, outputs, count, mode == formats::ActQuant::STATIC ? input_scale : 0.0f,
                                    ctx.act_workspace, ctx.row_scales, ctx.stream);
  // x̂ once for all; row_scales holds the token scale (per-token) or input_scale (static) of each row.
  if (!x_quantized)
    NIB_RETURN_IF_ERROR(quantize_dequantize_activation_bf16(x, M, weights[0]->cols,
                                                            mode == formats::ActQuant::STATIC ? input_scale : 0.0f,
                                                            ctx.act_workspace, ctx.row_scales, ctx.stream));
  return skinny(ctx.act_workspace, ctx.row_scales);
}

}  // namespace nibble::cuda

// NVFP4 activation quantization kernel: one CTA per row; per-token mode first reduces the row amax.
// The block math is formats/nvfp4_block.h with rcp.approx.ftz, as TensorRT-LLM's
// cvt_warp_fp16_to_fp4 computes it on Blackwell.
#include "cuda/common/check.cuh"
#include "cuda/nvfp4/nvfp4_act_quant.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/nvfp4/quantize_nvfp4.cuh"
#include "formats/bf16.h"
#include "formats/nvfp4_block.h"

namespace nibble::cuda {
namespace {

constexpr int THREADS = 128;

__global__ void quantize_activation_nvfp4_kernel(const float* __restrict__ x, int64_t cols, float static_global,
                                                 uint8_t* __restrict__ packed, uint8_t* __restrict__ block_scales,
                                                 float* __restrict__ row_scales) {
  const int64_t row = blockIdx.x;
  const float* x_row = x + row * cols;
  float global = static_global;
  if (static_global == 0.0f) {  // per-token: G = 1/(amax(row)/2688), exact division as on the CPU
    float amax = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += THREADS) amax = fmaxf(amax, fabsf(x_row[c]));
    __shared__ float partial[THREADS / 32];
    amax = cta_max(amax, partial);
    const float token_scale = formats::per_token_scale(amax);
    global = formats::per_token_global(token_scale);
    if (threadIdx.x == 0) row_scales[row] = token_scale;
  }
  const int64_t n_blocks = cols / formats::NVFP4_BLOCK;
  for (int64_t b = threadIdx.x; b < n_blocks; b += THREADS) {
    float values[formats::NVFP4_BLOCK];
    for (int i = 0; i < formats::NVFP4_BLOCK; ++i) values[i] = x_row[b * formats::NVFP4_BLOCK + i];
    uint8_t codes[formats::NVFP4_BLOCK];
    block_scales[row * n_blocks + b] = formats::quantize_activation_block(values, global, codes, ApproxReciprocal());
    uint8_t* out = packed + row * (cols / 2) + b * (formats::NVFP4_BLOCK / 2);
    for (int j = 0; j < formats::NVFP4_BLOCK / 2; ++j) out[j] = formats::e2m1_pack(codes[2 * j], codes[2 * j + 1]);
  }
}

// Sixteen input values of one block, widened to fp32 (BF16 bits or fp32).
__device__ void load_block(const uint16_t* src, float* values) {
  const uint4* in = reinterpret_cast<const uint4*>(src);
  const uint4 halves[2] = {__ldg(in), __ldg(in + 1)};
  const uint32_t* words = reinterpret_cast<const uint32_t*>(halves);
  for (int i = 0; i < formats::NVFP4_BLOCK / 2; ++i) {
    values[2 * i] = formats::bf16_decode(uint16_t(words[i] & 0xFFFF));
    values[2 * i + 1] = formats::bf16_decode(uint16_t(words[i] >> 16));
  }
}
__device__ void load_block(const float* src, float* values) {
  const float4* in = reinterpret_cast<const float4*>(src);
  for (int i = 0; i < formats::NVFP4_BLOCK / 4; ++i) {
    const float4 v = __ldg(in + i);
    values[4 * i] = v.x, values[4 * i + 1] = v.y, values[4 * i + 2] = v.z, values[4 * i + 3] = v.w;
  }
}

// The W4A4 modes on Hopper: the same quantization, then x̂ = e2m1 · e4m3 (unscaled by G; exact in
// BF16) written as BF16 for the BF16 tensor cores, and the row's scale (token scale, or input_scale).
// A group of `group` threads (16 to THREADS, a power of two) per row, a block of 16 per thread
// where the row has no more blocks than that (prefill-sized inputs: up to MAX_HELD_BLOCKS), and
// every thread issues all its loads before it reduces anything: a decode step's few rows cost one
// round of loads. (A warp per row took one round a block: 8 dependent rounds for a 4,096-wide row,
// 16 per-token; in the CUDA graph of single-stream W4A4 decode that quantize cost ~10 us a layer,
// H200, docs/lab/perf-notebook.md.)
constexpr int MAX_HELD_BLOCKS = 4;           // blocks a thread keeps in registers; further ones are read again
constexpr int64_t GPU_THREADS = 132 * 2048;  // the threads an H100 / H200 holds at once (132 SMs of 2,048)

template <class In>
__global__ void __launch_bounds__(THREADS)
    quantize_dequantize_kernel(const In* __restrict__ x, int64_t rows, int64_t cols, float input_scale,
                               uint16_t* __restrict__ x_hat, float* __restrict__ row_scales, int group,
                               bool fragment_order, const float* __restrict__ given_amax) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ float warp_amax[THREADS / 32];
  const int t = threadIdx.x & (group - 1);
  const int64_t row = int64_t(blockIdx.x) * (THREADS / group) + threadIdx.x / group;
  const bool live = row < rows;  // every thread stays for the barrier below
  const int n_blocks = int(cols / formats::NVFP4_BLOCK);
  const In* x_row = x + (live ? row : 0) * cols;
  float held[MAX_HELD_BLOCKS][formats::NVFP4_BLOCK];
#pragma unroll
  for (int i = 0; i < MAX_HELD_BLOCKS; ++i) {
    const int b = t + i * group;
    if (live && b < n_blocks) load_block(x_row + b * formats::NVFP4_BLOCK, held[i]);
  }
  float row_amax = 0.0f;
  if (given_amax) {
    if (live) row_amax = given_amax[row];
  } else if (input_scale == 0.0f) {  // uniform over the CTA
#pragma unroll
    for (int i = 0; i < MAX_HELD_BLOCKS; ++i)
      if (live && t + i * group < n_blocks)
        for (float v : held[i]) row_amax = fmaxf(row_amax, fabsf(v));
    for (int b = t + MAX_HELD_BLOCKS * group; live && b < n_blocks; b += group) {
      float values[formats::NVFP4_BLOCK];
      load_block(x_row + b * formats::NVFP4_BLOCK, values);
      for (float v : values) row_amax = fmaxf(row_amax, fabsf(v));
    }
    // Within the group (a group of 16: two rows a warp, each half its own).
    for (int offset = min(group, 32) / 2; offset > 0; offset /= 2)
      row_amax = fmaxf(row_amax, __shfl_xor_sync(0xffffffffu, row_amax, offset));
    if (group > 32) {  // the group's warps meet in shared memory
      if ((threadIdx.x & 31) == 0) warp_amax[threadIdx.x >> 5] = row_amax;
      __syncthreads();
      const int first = (threadIdx.x & ~(group - 1)) >> 5;
      for (int w = 0; w < group / 32; ++w) row_amax = fmaxf(row_amax, warp_amax[first + w]);
    }
  }
  if (!live) return;
  float global, scale;
  act_row_scales(input_scale, row_amax, global, scale);
  if (t == 0) row_scales[row] = scale;
  auto store = [&](int b, const float(&values)[formats::NVFP4_BLOCK]) {
    float amax = 0.0f;
    for (float v : values) amax = fmaxf(amax, fabsf(v));
    const ActBlockScale block(amax, global);
    uint32_t out[formats::NVFP4_BLOCK / 2];
    for (int i = 0; i < formats::NVFP4_BLOCK / 2; ++i)
      out[i] = block.bf16(values[2 * i]) | block.bf16(values[2 * i + 1]) << 16;
    if (fragment_order) {  // pairs i, i + 4 of block b (chunks 2(b % 2), + 1) sit side by side in its 32-group
      uint2* dst = reinterpret_cast<uint2*>(x_hat + row * cols + b / 2 * 32 + 4 * (b % 2));
      for (int i = 0; i < 4; ++i) dst[2 * i] = make_uint2(out[i], out[i + 4]);
    } else {
      uint4* dst = reinterpret_cast<uint4*>(x_hat + row * cols + b * formats::NVFP4_BLOCK);
      dst[0] = make_uint4(out[0], out[1], out[2], out[3]);
      dst[1] = make_uint4(out[4], out[5], out[6], out[7]);
    }
  };
#pragma unroll
  for (int i = 0; i < MAX_HELD_BLOCKS; ++i)
    if (t + i * group < n_blocks) store(t + i * group, held[i]);
  for (int b = t + MAX_HELD_BLOCKS * group; b < n_blocks; b += group) {
    float values[formats::NVFP4_BLOCK];
    load_block(x_row + b * formats::NVFP4_BLOCK, values);
    store(b, values);
  }
}

// A warp a row: the largest |x| of each row.
__global__ void row_amax_kernel(const uint16_t* __restrict__ x, int64_t rows, int64_t cols, float* __restrict__ amax) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t row = int64_t(blockIdx.x) * (THREADS / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const uint16_t* r = x + row * cols;
  float m = 0.0f;
  for (int64_t c = (threadIdx.x & 31) * 8; c < cols; c += 32 * 8) {  // 16-byte loads (cols % 16 == 0)
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(r + c));
    for (uint32_t w : {v.x, v.y, v.z, v.w})
      m = fmaxf(
          m, fmaxf(fabsf(formats::bf16_decode(uint16_t(w & 0xFFFF))), fabsf(formats::bf16_decode(uint16_t(w >> 16)))));
  }
  for (int offset = 16; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
  if ((threadIdx.x & 31) == 0) amax[row] = m;
}

template <class In>
Status quantize_dequantize(const In* x, int64_t rows, int64_t cols, float input_scale, uint16_t* x_hat,
                           float* row_scales, cudaStream_t stream, bool fragment_order = false,
                           const float* given_amax = nullptr) {
  if (cols <= 0 || cols % formats::NVFP4_BLOCK != 0)
    return Status::error("quantize_dequantize_activation: cols = " + std::to_string(cols) +
                         " is not a positive multiple of 16");
  if (input_scale < 0.0f || !(input_scale == input_scale))
    return Status::error("quantize_dequantize_activation: input_scale must be > 0 (static) or 0 (per-token)");
  if (fragment_order && cols % 32 != 0)
    return Status::error("quantize_dequantize_activation: fragment order needs cols a multiple of 32");
  if (rows == 0) return Status::ok();
  const int64_t n_blocks = cols / formats::NVFP4_BLOCK;
  int group = 32;  // a block a thread where the row allows
  while (group < THREADS && group < n_blocks) group *= 2;
  // Where the blocks outnumber the threads the GPU holds (a prefill's rows): the fewest threads a row
  // that hold it in registers (16 to THREADS, up to MAX_HELD_BLOCKS blocks each) — no idle lanes on
  // 48-block rows, no barrier where a warp holds the row (pp2048's MoE down input 20.5 µs a layer
  // static, 20.4 per-token, against 26.0 / 33.3 a block a thread; H200, docs/lab/perf-notebook.md).
  if (rows * n_blocks >= GPU_THREADS) {
    group = 16;
    while (group < THREADS && group * MAX_HELD_BLOCKS < n_blocks) group *= 2;
  }
  const int64_t rows_per_cta = THREADS / group;
  return cuda_status(launch_pdl(quantize_dequantize_kernel<In>,
                                dim3(unsigned((rows + rows_per_cta - 1) / rows_per_cta)), dim3(THREADS), 0, stream, x,
                                rows, cols, input_scale, x_hat, row_scales, group, fragment_order, given_amax),
                     "quantize_dequantize_activation launch");
}

}  // namespace

Status quantize_dequantize_activation_bf16(const uint16_t* x, int64_t rows, int64_t cols, float input_scale,
                                           uint16_t* x_hat, float* row_scales, cudaStream_t stream) {
  return quantize_dequantize(x, rows, cols, input_scale, x_hat, row_scales, stream);
}

Status quantize_dequantize_activation_bf16_of_amax(const uint16_t* x, int64_t rows, int64_t cols, const float* row_amax,
                                                   uint16_t* x_hat, float* row_scales, cudaStream_t stream) {
  if (!row_amax) return Status::error("quantize_dequantize_activation_bf16_of_amax: no row amax");
  return quantize_dequantize(x, rows, cols, 0.0f, x_hat, row_scales, stream, false, row_amax);
}

Status row_amax_bf16(const uint16_t* x, int64_t rows, int64_t cols, float* amax, cudaStream_t stream) {
  if (cols <= 0 || cols % formats::NVFP4_BLOCK != 0)
    return Status::error("row_amax_bf16: cols = " + std::to_string(cols) + " is not a positive multiple of 16");
  if (rows == 0) return Status::ok();
  const int64_t rows_per_cta = THREADS / 32;
  return cuda_status(launch_pdl(row_amax_kernel, dim3(unsigned((rows + rows_per_cta - 1) / rows_per_cta)),
                                dim3(THREADS), 0, stream, x, rows, cols, amax),
                     "row_amax_bf16 launch");
}

Status quantize_dequantize_activation_f32(const float* x, int64_t rows, int64_t cols, float input_scale,
                                          uint16_t* x_hat, float* row_scales, cudaStream_t stream,
                                          bool fragment_order) {
  return quantize_dequantize(x, rows, cols, input_scale, x_hat, row_scales, stream, fragment_order);
}

Status quantize_activation_nvfp4(const float* x, int64_t rows, int64_t cols, float input_scale, uint8_t* packed,
                                 uint8_t* block_scales, float* row_scales, cudaStream_t stream) {
  if (cols <= 0 || cols % formats::NVFP4_BLOCK != 0) {
    return Status::error("quantize_activation_nvfp4: cols = " + std::to_string(cols) +
                         " is not a positive multiple of 16");
  }
  if (input_scale < 0.0f || !(input_scale == input_scale)) {
    return Status::error("quantize_activation_nvfp4: input_scale must be > 0 (static) or 0 (per-token)");
  }
  if (input_scale == 0.0f && row_scales == nullptr) {
    return Status::error("quantize_activation_nvfp4: per-token mode needs row_scales");
  }
  if (rows == 0) return Status::ok();
  const float static_global = input_scale > 0.0f ? 1.0f / input_scale : 0.0f;
  quantize_activation_nvfp4_kernel<<<static_cast<unsigned>(rows), THREADS, 0, stream>>>(x, cols, static_global, packed,
                                                                                        block_scales, row_scales);
  return cuda_status(cudaGetLastError(), "quantize_activation_nvfp4_kernel launch");
}

}  // namespace nibble::cuda

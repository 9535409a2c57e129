// repack_nvfp4: the checkpoint's NVFP4 code bytes and E4M3 block scales → the GPU layout of
// nvfp4_layout.h, in place (a load-time pass; the file on disk is untouched), in line order for expert
// weights; to_fragment_order: BF16 activation rows → the wgmma MoE's fragment order.
#include "cuda/common/check.cuh"
#include "cuda/gemm/linear_nvfp4.cuh"
#include "cuda/nvfp4/nvfp4_layout.h"
#include "cuda/gemm/nvfp4_wgmma.cuh"
#include "cuda/common/pdl.cuh"

namespace nibble::cuda {
namespace {

__global__ void repack_kernel(uint2* __restrict__ codes, uint8_t* __restrict__ scales, size_t blocks) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < blocks; i += size_t(gridDim.x) * blockDim.x) {
    uint2 words = codes[i];
    uint8_t scale = scales[i];
    repack_block(words.x, words.y, scale);
    codes[i] = words;
    scales[i] = scale;
  }
}

// The same in line order (nvfp4_layout.h): a 128-wide k-block (16 words, 8 scale codes) per thread.
__global__ void repack_line_order_kernel(uint4* __restrict__ codes, uint8_t* __restrict__ scales, size_t blocks) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < blocks; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t in[16], out[16];
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const uint4 w = codes[4 * i + v];
      in[4 * v] = w.x, in[4 * v + 1] = w.y, in[4 * v + 2] = w.z, in[4 * v + 3] = w.w;
    }
#pragma unroll
    for (int b = 0; b < 8; ++b) repack_block(in[2 * b], in[2 * b + 1], scales[8 * i + b]);
#pragma unroll
    for (int w = 0; w < 16; ++w) out[w] = in[line_order_chunk(w)];
#pragma unroll
    for (int v = 0; v < 4; ++v)
      codes[4 * i + v] = make_uint4(out[4 * v], out[4 * v + 1], out[4 * v + 2], out[4 * v + 3]);
  }
}

}  // namespace

Status repack_nvfp4(uint8_t* packed, uint8_t* block_scales, size_t blocks, cudaStream_t stream, bool line_order) {
  if (blocks == 0) return Status::ok();
  if (!packed || !block_scales || reinterpret_cast<uintptr_t>(packed) % (line_order ? 16 : 8) ||
      (line_order && blocks % 8))
    return Status::error(
        "repack_nvfp4: needs " + std::string(line_order ? "16" : "8") + "-byte aligned codes and their scales" +
        (line_order ? " in whole 128-wide blocks for line order" : "") + " (" + std::to_string(blocks) + " blocks)");
  if (line_order) {
    const size_t lines = blocks / 8;
    const unsigned grid = unsigned(std::min<size_t>((lines + 255) / 256, 132 * 16));
    repack_line_order_kernel<<<grid, 256, 0, stream>>>(reinterpret_cast<uint4*>(packed), block_scales, lines);
    return cuda_status(cudaGetLastError(), "repack_nvfp4 launch");
  }
  const unsigned grid = unsigned(std::min<size_t>((blocks + 255) / 256, 132 * 16));
  repack_kernel<<<grid, 256, 0, stream>>>(reinterpret_cast<uint2*>(packed), block_scales, blocks);
  return cuda_status(cudaGetLastError(), "repack_nvfp4 launch");
}

namespace {
// A thread a 16-byte chunk of the output: chunk c of a 32-element group takes pair c of the group's
// four input chunks (four 4-byte loads, whole 64-byte groups across a quad of lanes).
__global__ void __launch_bounds__(256)
    fragment_order_kernel(const uint32_t* __restrict__ in, int64_t chunks, uint4* __restrict__ out) {
  pdl_wait();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= chunks) return;
  const uint32_t* group = in + (i / 4) * 16 + i % 4;
  out[i] = make_uint4(group[0], group[4], group[8], group[12]);
}
}  // namespace

Status to_fragment_order(const uint16_t* in, int64_t rows, int64_t cols, uint16_t* out, cudaStream_t stream) {
  if (!in || !out || rows < 0 || cols % 32 != 0)
    return Status::error("to_fragment_order: null rows or cols not a multiple of 32");
  if (reinterpret_cast<uintptr_t>(in) % 16 || reinterpret_cast<uintptr_t>(out) % 16)
    return Status::error("to_fragment_order: rows not 16-byte aligned");
  const int64_t chunks = rows * cols / 8;
  if (chunks == 0) return Status::ok();
  return cuda_status(launch_pdl(fragment_order_kernel, dim3(unsigned((chunks + 255) / 256)), dim3(256), 0, stream,
                                reinterpret_cast<const uint32_t*>(in), chunks, reinterpret_cast<uint4*>(out)),
                     "to_fragment_order launch");
}

}  // namespace nibble::cuda

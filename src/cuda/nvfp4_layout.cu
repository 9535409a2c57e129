// repack_nvfp4: the checkpoint's NVFP4 code bytes and E4M3 block scales → the GPU layout of
// nvfp4_layout.h, in place, one 16-code block per thread (a load-time pass; the file on disk is untouched).
#include "cuda/check.cuh"
#include "cuda/linear_nvfp4.cuh"
#include "cuda/nvfp4_layout.h"

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

}  // namespace

Status repack_nvfp4(uint8_t* packed, uint8_t* block_scales, size_t blocks, cudaStream_t stream) {
  if (blocks == 0) return Status::ok();
  if (!packed || !block_scales || reinterpret_cast<uintptr_t>(packed) % 8)
    return Status::error("repack_nvfp4: needs 8-byte aligned codes and their scales (" + std::to_string(blocks) +
                         " blocks)");
  const unsigned grid = unsigned(std::min<size_t>((blocks + 255) / 256, 132 * 16));
  repack_kernel<<<grid, 256, 0, stream>>>(reinterpret_cast<uint2*>(packed), block_scales, blocks);
  return cuda_status(cudaGetLastError(), "repack_nvfp4 launch");
}

}  // namespace nibble::cuda

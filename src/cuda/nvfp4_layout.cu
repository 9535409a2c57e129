// repack_nvfp4_codes: the checkpoint's NVFP4 code bytes → the GPU layout of nvfp4_layout.h, in place,
// one 32-bit word per thread (a load-time pass; the file on disk is untouched).
#include "cuda/check.cuh"
#include "cuda/linear_nvfp4.cuh"
#include "cuda/nvfp4_layout.h"

namespace nibble::cuda {
namespace {

__global__ void repack_kernel(uint32_t* __restrict__ words, size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    words[i] = repack_code_word(words[i]);
}

}  // namespace

Status repack_nvfp4_codes(uint8_t* packed, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return Status::ok();
  if (!packed || bytes % 4 || reinterpret_cast<uintptr_t>(packed) % 4)
    return Status::error("repack_nvfp4_codes: needs 4-byte aligned codes, a multiple of 4 bytes (" +
                         std::to_string(bytes) + ")");
  const size_t words = bytes / 4;
  const unsigned blocks = unsigned(std::min<size_t>((words + 255) / 256, 132 * 16));
  repack_kernel<<<blocks, 256, 0, stream>>>(reinterpret_cast<uint32_t*>(packed), words);
  return cuda_status(cudaGetLastError(), "repack_nvfp4_codes launch");
}

}  // namespace nibble::cuda

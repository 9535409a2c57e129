// Tensor-map encoding for the copy engine (tensor_map.cuh), through cudaGetDriverEntryPointByVersion.
#include "cuda/tensor_map.cuh"

#include <cudaTypedefs.h>

#include <string>

namespace nibble::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
    return err == cudaSuccess && found == cudaDriverEntryPointSuccess
               ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn)
               : nullptr;
  }();
  return encode;
}

}  // namespace

Status encode_bf16_tile_map(CUtensorMap* map, const void* data, int64_t rows, int64_t cols, int box_cols,
                            int box_rows) {
  if (!map || !data || rows < 1 || cols < 1 || reinterpret_cast<uintptr_t>(data) % 16 || (cols * 2) % 16 ||
      box_cols * 2 > 128 || box_cols < 1 || box_rows < 1 || box_rows > 256)
    return Status::error("tensor map: BF16 [" + std::to_string(rows) + ", " + std::to_string(cols) + "] in boxes of " +
                         std::to_string(box_rows) + " × " + std::to_string(box_cols) + " is not a TMA tile layout");
  const PFN_cuTensorMapEncodeTiled_v12000 encode = encoder();
  if (!encode) return Status::error("tensor map: the driver has no cuTensorMapEncodeTiled");
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(cols) * 2};  // bytes between rows
  const cuuint32_t box[2] = {cuuint32_t(box_cols), cuuint32_t(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(data), dims, strides, box,
                            element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return Status::error("tensor map: cuTensorMapEncodeTiled failed (CUresult " + std::to_string(int(r)) + ")");
  return Status::ok();
}

}  // namespace nibble::cuda

// Tensor maps for the copy engine: cuTensorMapEncodeTiled through cudaGetDriverEntryPointByVersion,
// and a cache of the maps of long-lived tensors (weights).
#include "cuda/common/tensor_maps.cuh"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <map>
#include <mutex>
#include <string>
#include <tuple>

namespace nibble::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t e =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
    return e == cudaSuccess && found == cudaDriverEntryPointSuccess
               ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn)
               : nullptr;
  }();
  return encode;
}

}  // namespace

Status encode_tensor_map(const TensorMap2d& m, CUtensorMap* out) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = encoder();
  if (!encode) return Status::error("tensor map: the CUDA driver has no cuTensorMapEncodeTiled");
  const cuuint64_t dims[2] = {m.inner, m.rows};
  const cuuint64_t strides[1] = {m.row_bytes};
  const cuuint32_t box[2] = {m.box_inner, m.box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode(out, m.type, 2, const_cast<void*>(m.base), dims, strides, box, element_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, m.swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return Status::error("tensor map: cuTensorMapEncodeTiled failed (CUresult " + std::to_string(int(r)) + ") for " +
                         std::to_string(m.rows) + " rows of " + std::to_string(m.inner) + ", box " +
                         std::to_string(m.box_rows) + " × " + std::to_string(m.box_inner));
  return Status::ok();
}

Status cached_tensor_map(const TensorMap2d& m, CUtensorMap* out) {
  using Key = std::tuple<int, const void*, uint64_t, uint64_t, uint64_t, uint32_t, uint32_t, int>;
  static std::mutex mutex;
  static std::map<Key, CUtensorMap> maps;
  const Key key{int(m.type), m.base, m.inner, m.rows, m.row_bytes, m.box_inner, m.box_rows, int(m.swizzle)};
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = maps.find(key); it != maps.end()) return *out = it->second, Status::ok();
  CUtensorMap map{};
  if (Status s = encode_tensor_map(m, &map); !s) return s;
  maps.emplace(key, map);
  *out = map;
  return Status::ok();
}

}  // namespace nibble::cuda

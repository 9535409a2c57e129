// A model split over tensor-parallel ranks on GPUs: a CudaDecoder a rank, each on its device with a
// thread and a DeviceContext of its own, each loading only its slices of the checkpoint. Ranks on
// distinct GPUs meet through NCCL (inside the decode graphs); ranks sharing a GPU (NCCL refuses them)
// through host memory, eagerly. To the runner it is one CudaModel on rank 0's context.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "io/binding.h"
#include "models/cuda_model.h"

namespace nibble::models {

// devices[r]: rank r's GPU (CUDA_VISIBLE_DEVICES order); rank 0's context is the caller's `ctx` (on
// devices[0]). Errors: a dimension that does not split, ranks whose checkpoints differ, NCCL missing.
Result<std::unique_ptr<CudaModel>> create_parallel_cuda_model(const std::string& path,
                                                              const io::ConfigOverrides& overrides,
                                                              const io::ParallelConfig& group,
                                                              const std::vector<int>& devices,
                                                              const CudaModelOptions& options,
                                                              cuda::DeviceContext& ctx);

}  // namespace nibble::models

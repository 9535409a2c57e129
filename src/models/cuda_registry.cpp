// The GPU model registry: Hugging Face architecture name → the GPU model that runs it (the CPU one:
// registry.cpp). A new family adds its row here (docs/add-a-model.md).
#include <map>

#include "models/cuda_model.h"
#include "models/decoder_cuda.h"

namespace nibble::models {
namespace {

struct GpuFamily {
  Status (*supports)(const io::BoundCheckpoint&);
  Result<std::unique_ptr<CudaModel>> (*create)(std::shared_ptr<const io::LoadedCheckpoint>, const CudaModelOptions&,
                                               cuda::DeviceContext&);
};

const GpuFamily* family_of(const std::string& architecture) {
  static const std::map<std::string, GpuFamily> families = {
      {"Qwen3MoeForCausalLM", {&CudaDecoder::supports, &CudaDecoder::create}},
      {"Qwen3ForCausalLM", {&CudaDecoder::supports, &CudaDecoder::create}},
      {"Ernie4_5_MoeForCausalLM", {&CudaDecoder::supports, &CudaDecoder::create}},
  };
  auto it = families.find(architecture);
  return it == families.end() ? nullptr : &it->second;
}

}  // namespace

Status cuda_model_supports(const io::BoundCheckpoint& checkpoint) {
  const GpuFamily* family = family_of(checkpoint.config.architecture);
  if (!family)
    return Status::error("the CUDA runner does not run architecture '" + checkpoint.config.architecture + "'");
  return family->supports(checkpoint);
}

Result<std::unique_ptr<CudaModel>> create_cuda_model(std::shared_ptr<const io::LoadedCheckpoint> checkpoint,
                                                     const CudaModelOptions& options, cuda::DeviceContext& ctx) {
  const GpuFamily* family = family_of(checkpoint->bound.config.architecture);
  if (!family)
    return Status::error("the CUDA runner does not run architecture '" + checkpoint->bound.config.architecture + "'");
  return family->create(std::move(checkpoint), options, ctx);
}

}  // namespace nibble::models

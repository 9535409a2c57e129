// DeviceContext and DeviceArena, and the PDL switch (pdl.cuh).
#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/env.h"

#include "cuda/common/check.cuh"
#include "cuda/common/device_context.cuh"
#include "cuda/common/pdl.cuh"

namespace nibble::cuda {

DeviceArena::~DeviceArena() {
  for (void* p : blocks_) cudaFree(p);
}

Result<void*> DeviceArena::alloc(size_t bytes, const std::string& what) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, std::max<size_t>(bytes, 1));
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state of a failed allocation
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    return Status::error("out of GPU memory allocating " + what + " (" + std::to_string(bytes >> 20) + " MiB; " +
                         std::to_string(free >> 20) + " MiB free of " + std::to_string(total >> 20) + " MiB)");
  }
  blocks_.push_back(p);
  bytes_ += bytes;
  return p;
}

Result<std::unique_ptr<DeviceContext>> DeviceContext::create(int device) {
  if (device_count() <= device) return Status::error("no CUDA device " + std::to_string(device) + " is visible");
  auto ctx = std::make_unique<DeviceContext>();
  ctx->device = device;
  NIB_RETURN_IF_ERROR(cuda_status(cudaSetDevice(device), "cudaSetDevice"));
  cudaDeviceProp prop{};
  NIB_RETURN_IF_ERROR(cuda_status(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties"));
  ctx->name = prop.name;
  ctx->total_memory = prop.totalGlobalMem;
  ctx->sms = prop.multiProcessorCount;
  if (prop.major < 9)
    return Status::error(std::string("GPU ") + prop.name + " is sm_" + std::to_string(prop.major) +
                         std::to_string(prop.minor) + "; this build's kernels are for Hopper (sm_90a)");
  NIB_RETURN_IF_ERROR(cuda_status(cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking), "cudaStreamCreate"));
  NIB_RETURN_IF_ERROR(cublas_status(cublasCreate(&ctx->cublas), "cublasCreate"));
  NIB_RETURN_IF_ERROR(cublas_status(cublasSetStream(ctx->cublas, ctx->stream), "cublasSetStream"));
  // A fixed cuBLAS workspace: no allocation inside a captured graph (cuBLAS docs, "CUDA graphs").
  constexpr size_t CUBLAS_WORKSPACE = 32u << 20;
  void* workspace = nullptr;
  {
    auto w = ctx->arena.alloc(CUBLAS_WORKSPACE, "the cuBLAS workspace");
    if (!w) return w.status();
    workspace = *w;
  }
  NIB_RETURN_IF_ERROR(
      cublas_status(cublasSetWorkspace(ctx->cublas, workspace, CUBLAS_WORKSPACE), "cublasSetWorkspace"));
  return Result<std::unique_ptr<DeviceContext>>(std::move(ctx));
}

DeviceContext::~DeviceContext() {
  if (stream) cudaStreamSynchronize(stream);
  if (cublas) cublasDestroy(cublas);
  if (stream) cudaStreamDestroy(stream);
}

Status DeviceContext::synchronize() const { return cuda_status(cudaStreamSynchronize(stream), "the GPU step"); }

size_t DeviceContext::free_memory() const {
  size_t free = 0, total = 0;
  cudaMemGetInfo(&free, &total);
  return free;
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace nibble::cuda

namespace nibble::cuda {

bool pdl_enabled() {
  static const bool enabled = !env_flag("NIBBLE_DIAG_NO_PDL");
  return enabled;
}

}  // namespace nibble::cuda

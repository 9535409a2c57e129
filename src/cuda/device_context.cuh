// One device context for all CUDA ops of a runner: the stream, the cuBLAS handle bound to it (with
// its workspace, so cuBLAS never allocates during graph capture), and a memory arena that owns every
// device allocation (weights, KV cache, workspaces) and counts their bytes.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace nibble::cuda {

class DeviceArena {
 public:
  DeviceArena() = default;
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  // `what` names the buffer in the out-of-memory error.
  Result<void*> alloc(size_t bytes, const std::string& what);
  template <class T>
  Status alloc(T*& ptr, size_t count, const std::string& what) {
    auto p = alloc(count * sizeof(T), what);
    if (!p) return p.status();
    ptr = static_cast<T*>(*p);
    return Status::ok();
  }
  size_t bytes() const { return bytes_; }

 private:
  std::vector<void*> blocks_;
  size_t bytes_ = 0;
};

struct DeviceContext {
  static Result<std::unique_ptr<DeviceContext>> create(int device = 0);
  ~DeviceContext();
  DeviceContext() = default;
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  int device = 0;
  std::string name;           // e.g. "NVIDIA H200"
  size_t total_memory = 0;    // bytes
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  DeviceArena arena;

  Status synchronize() const;
  size_t free_memory() const;  // cudaMemGetInfo's free bytes now
};

// Number of visible CUDA devices (0 when none or no driver).
int device_count();

}  // namespace nibble::cuda

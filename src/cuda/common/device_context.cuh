// One device context for all CUDA ops of a runner: the stream, the cuBLAS handle bound to it (with
// its workspace, so cuBLAS never allocates during graph capture), and a memory arena that owns every
// device allocation (weights, KV cache, workspaces) and counts their bytes.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace nibble::cuda {

// This GPU's SMs and the shared memory a CTA may opt into (zeros when no device answers).
struct DeviceLimits {
  int sms = 0, smem_optin = 0, smem_per_sm = 0;  // smem_*: bytes (a CTA's opt-in maximum; an SM's)
};
inline const DeviceLimits& device_limits() {
  static const DeviceLimits limits = [] {
    DeviceLimits l;
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&l.sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&l.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&l.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) != cudaSuccess)
      l = DeviceLimits{};
    return l;
  }();
  return limits;
}

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

// Page-locked host memory (cudaHostAlloc) that async copies read from or write into; freed with its
// owner. resize() drops the contents.
template <class T>
class PinnedArray {
 public:
  PinnedArray() = default;
  ~PinnedArray() { release(); }
  PinnedArray(const PinnedArray&) = delete;
  PinnedArray& operator=(const PinnedArray&) = delete;
  PinnedArray(PinnedArray&& other) noexcept { swap(other); }
  PinnedArray& operator=(PinnedArray&& other) noexcept {
    swap(other);
    return *this;
  }
  Status resize(size_t count, const std::string& what) {
    release();
    void* p = nullptr;
    if (count && cudaHostAlloc(&p, count * sizeof(T), cudaHostAllocDefault) != cudaSuccess)
      return Status::error("pinned host memory for " + what + ": " + std::to_string(count * sizeof(T)) + " bytes");
    data_ = static_cast<T*>(p), size_ = count;
    return Status::ok();
  }
  T* data() const { return data_; }
  size_t size() const { return size_; }
  T& operator[](size_t i) const { return data_[i]; }

 private:
  void release() {
    if (data_) cudaFreeHost(data_);
    data_ = nullptr, size_ = 0;
  }
  void swap(PinnedArray& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
  }
  T* data_ = nullptr;
  size_t size_ = 0;
};

struct DeviceContext {
  static Result<std::unique_ptr<DeviceContext>> create(int device = 0);
  ~DeviceContext();
  DeviceContext() = default;
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  int device = 0;
  std::string name;         // e.g. "NVIDIA H200"
  size_t total_memory = 0;  // bytes
  int sms = 0;              // streaming multiprocessors
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  DeviceArena arena;

  Status synchronize() const;
  size_t free_memory() const;  // cudaMemGetInfo's free bytes now
};

// Number of visible CUDA devices (0 when none or no driver).
int device_count();

}  // namespace nibble::cuda

// The stream's wait for a host-written word (host_wait.cuh): a spin with a sleep, at system scope.
#include "cuda/common/check.cuh"
#include "cuda/sampling/host_wait.cuh"

namespace nibble::cuda {
namespace {

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void wait_for_host_kernel(const uint32_t* flag, uint32_t value, uint32_t* timed_out, uint64_t timeout_ns) {
  const uint64_t start = global_ns();
  for (;;) {
    uint32_t seen;
    asm volatile("ld.acquire.sys.u32 %0, [%1];" : "=r"(seen) : "l"(flag) : "memory");
    if (seen == value) return;
    if (global_ns() - start > timeout_ns) {
      *timed_out = value;
      __threadfence_system();
      return;
    }
    __nanosleep(1000);
  }
}

}  // namespace

Status prepare_wait_for_host() {
  cudaFuncAttributes attributes{};
  return cuda_status(cudaFuncGetAttributes(&attributes, wait_for_host_kernel), "host wait: loading the kernel");
}

Status wait_for_host(const uint32_t* flag, uint32_t value, uint32_t* timed_out, double timeout_seconds,
                     cudaStream_t stream) {
  const uint32_t* device_flag = nullptr;
  uint32_t* device_timed_out = nullptr;
  NIB_RETURN_IF_ERROR(
      cuda_status(cudaHostGetDevicePointer(reinterpret_cast<void**>(const_cast<uint32_t**>(&device_flag)),
                                           const_cast<uint32_t*>(flag), 0),
                  "host wait: the flag's device address"));
  NIB_RETURN_IF_ERROR(cuda_status(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_timed_out), timed_out, 0),
                                  "host wait: the timeout word's device address"));
  wait_for_host_kernel<<<1, 1, 0, stream>>>(device_flag, value, device_timed_out, uint64_t(timeout_seconds * 1e9));
  return cuda_status(cudaGetLastError(), "host wait");
}

}  // namespace nibble::cuda

// Programmatic dependent launch (Hopper): a kernel launched with launch_pdl may start while the
// kernel before it on the stream is still running, so its prologue (weight loads, index math) and
// its launch latency overlap that kernel's tail. Such a kernel must call pdl_wait() before it reads
// anything the earlier kernels write, and before it writes anything they read. Kept in CUDA graphs.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace nibble::cuda {

// Waits until the kernels this one depends on have finished and their writes are visible (PTX
// griddepcontrol.wait; returns at once in a kernel launched without the PDL attribute).
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

// Lets the next kernel on the stream be scheduled now (its CTAs then wait in pdl_wait()).
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// Whether launch_pdl sets the attribute: on unless NIBBLE_DIAG_NO_PDL=1 (to measure or rule it out).
bool pdl_enabled();

// kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization allowed, as a
// grid of thread-block clusters of `cluster_x` CTAs along x (gridDim.x a multiple of it; 0: no clusters).
template <class... Params, class... Args>
cudaError_t launch_pdl_cluster(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, unsigned cluster_x,
                               cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attributes[2] = {};
  attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[0].val.programmaticStreamSerializationAllowed = pdl_enabled() ? 1 : 0;
  attributes[1].id = cudaLaunchAttributeClusterDimension;
  attributes[1].val.clusterDim.x = cluster_x, attributes[1].val.clusterDim.y = 1, attributes[1].val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid, config.blockDim = block, config.dynamicSmemBytes = smem, config.stream = stream;
  config.attrs = attributes, config.numAttrs = cluster_x > 0 ? 2 : 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// The same without clusters.
template <class... Params, class... Args>
cudaError_t launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       Args&&... args) {
  return launch_pdl_cluster(kernel, grid, block, smem, 0, stream, std::forward<Args>(args)...);
}

}  // namespace nibble::cuda

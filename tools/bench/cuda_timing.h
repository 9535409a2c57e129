// CUDA timing for the kernel benchmarks: median seconds per launch over batches timed with CUDA
// events, after a warm-up over every input copy. Only built with the CUDA backend.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "cuda/gemm/linear_nvfp4.cuh"
#include "formats/nvfp4.h"

#define BENCH_CUDA(call)                                                                     \
  do {                                                                                       \
    cudaError_t e_ = (call);                                                                 \
    if (e_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "nibble bench kernels: %s: %s\n", #call, cudaGetErrorString(e_)); \
      return 1;                                                                              \
    }                                                                                        \
  } while (0)

namespace nibble::tools {

// A row's mode label: w4a16, w4a4-static, w4a4-per-token.
inline std::string bench_mode_label(formats::ActQuant mode) {
  return mode == formats::ActQuant::NONE ? "w4a16" : std::string("w4a4-") + formats::act_quant_name(mode);
}

// The kernels a --gemm-backend / --moe-backend value names ("all": every one but auto).
inline std::vector<DenseKernel> dense_kernels_to_time(const std::string& name) {
  if (name == "all")
    return {DenseKernel::GEMV, DenseKernel::CUBLAS, DenseKernel::SKINNY, DenseKernel::SKINNY_SPLIT, DenseKernel::WGMMA};
  return {parse_dense_kernel(name).value_or(DenseKernel::AUTO)};
}
inline std::vector<MoeKernel> moe_kernels_to_time(const std::string& name) {
  if (name == "all") return {MoeKernel::GROUPED_MMA, MoeKernel::CUBLAS, MoeKernel::SKINNY, MoeKernel::WGMMA};
  return {parse_moe_kernel(name).value_or(MoeKernel::AUTO)};
}

// `values` random NVFP4 weights into device buffers the caller allocated (values / 2 code bytes,
// values / 16 scale codes): any code bits, E4M3 scales 0.5 … 2, repacked into the GPU layout as the
// model loads them (line_order: an expert weight's). 0 on success.
inline int upload_random_nvfp4(size_t values, std::mt19937_64& rng, uint8_t* d_packed, uint8_t* d_scales,
                               bool line_order = false) {
  std::vector<uint8_t> packed(values / 2), scales(values / 16);
  for (size_t i = 0; i < packed.size(); i += 8) {
    const uint64_t bits = rng();
    for (size_t b = 0; b < 8 && i + b < packed.size(); ++b) packed[i + b] = uint8_t(bits >> (8 * b));
  }
  for (uint8_t& s : scales) s = uint8_t(0x30 + rng() % 17);
  BENCH_CUDA(cudaMemcpy(d_packed, packed.data(), packed.size(), cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemcpy(d_scales, scales.data(), scales.size(), cudaMemcpyHostToDevice));
  if (!cuda::repack_nvfp4(d_packed, d_scales, scales.size(), nullptr, line_order)) return 1;
  BENCH_CUDA(cudaStreamSynchronize(nullptr));
  return 0;
}

// Median seconds per launch of `launch(copy)`. With `graph`, the launches of a batch are captured once
// into a CUDA graph (as the engine runs them), so the time is the GPU's, not the CPU's launch rate;
// without it (ops that synchronize with the host) each batch is issued directly.
template <class F>
double time_launches(F&& launch, int copies, int iterations, int batches, cudaStream_t stream, bool graph = true) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int i = 0; i < copies; ++i) launch(i);  // warm-up: every copy once (and lazy module loading)
  cudaStreamSynchronize(stream);
  cudaGraph_t captured = nullptr;
  cudaGraphExec_t exec = nullptr;
  if (graph) {
    cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    for (int i = 0; i < iterations; ++i) launch(i % copies);
    cudaStreamEndCapture(stream, &captured);
    cudaGraphInstantiate(&exec, captured, 0);
    cudaGraphLaunch(exec, stream);  // warm-up of the graph
  }
  std::vector<double> per_launch;
  for (int b = 0; b < batches; ++b) {
    cudaEventRecord(start, stream);
    if (graph)
      cudaGraphLaunch(exec, stream);
    else
      for (int i = 0; i < iterations; ++i) launch(i % copies);
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    per_launch.push_back(ms * 1e-3 / iterations);
  }
  if (graph) cudaGraphExecDestroy(exec), cudaGraphDestroy(captured);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(per_launch.begin(), per_launch.end());
  return per_launch[per_launch.size() / 2];
}

}  // namespace nibble::tools

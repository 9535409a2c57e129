// Kernel benchmark: for each shape and M, the median over batches of a CUDA graph of back-to-back
// launches timed with CUDA events, after a warm-up, with weights rotated over copies that together
// exceed twice the 60 MB L2 (so every launch reads HBM, as in a model).
#include "tools/bench/bench_kernels.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <vector>

#if NIBBLE_BENCH_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "cuda/gemm/linear_nvfp4.cuh"
#include "formats/nvfp4.h"
#include "tools/bench/bench_attention.h"
#include "tools/bench/bench_moe.h"
#include "tools/bench/cuda_timing.h"
#endif

namespace nibble::tools {

#if NIBBLE_BENCH_CUDA
namespace {

struct Shape {
  const char* name;
  int64_t n, k;
};
// Qwen3-30B-A3B: attention projections and one expert's matrices (docs/perf.md "Floors").
const std::vector<Shape> QWEN3_SHAPES = {{"q_proj", 4096, 2048},
                                         {"k_proj", 512, 2048},
                                         {"o_proj", 2048, 4096},
                                         {"expert.gate", 768, 2048},
                                         {"expert.down", 2048, 768}};
// ERNIE-4.5-21B-A3B (config.json: hidden 2560, 20/4 heads of 128, experts 1536 wide, 2 shared experts,
// a dense first layer 12288 wide): its attention, the shared experts as one dense MLP, the dense down.
const std::vector<Shape> ERNIE_SHAPES = {{"q_proj", 2560, 2560},      {"k_proj", 512, 2560},
                                         {"o_proj", 2560, 2560},      {"shared.gate", 3072, 2560},
                                         {"shared.down", 2560, 3072}, {"dense.down", 2560, 12288}};

}  // namespace

int run_bench_kernels(const BenchKernelsOptions& o) {
  std::vector<int64_t> ms;
  std::stringstream list(o.m_values);
  for (std::string item; std::getline(list, item, ',');) ms.push_back(std::stoll(item));
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "nibble bench kernels: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreate(&stream));
  cublasHandle_t cublas;
  if (cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS) return 1;
  cublasSetStream(cublas, stream);
  std::printf("device: %s, floor = max(bytes / %.1f TB/s, FLOPs / %.0f TFLOP/s)\n", prop.name, o.hbm_tb_s,
              o.bf16_tflops);
  std::printf("%-12s %6s %-30s %10s %9s %9s %8s %12s %8s\n", "op", "M", "backend/mode", "time(us)", "GB/s", "TFLOP/s",
              "%floor", "cuBLAS(us)", "vs cuBLAS");
  nlohmann::json rows = nlohmann::json::array();
  std::mt19937_64 rng(0);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const int64_t max_m = *std::max_element(ms.begin(), ms.end());
  const bool dense = o.ops.find("dense") != std::string::npos;
  const bool ernie = o.shapes == "ernie-4.5-21b-a3b";
  for (const Shape& s : ernie ? ERNIE_SHAPES : QWEN3_SHAPES) {
    if (!dense) break;
    // Weights: one random NVFP4 matrix, copied until the copies exceed 2 × L2.
    std::vector<float> w(static_cast<size_t>(s.n * s.k));
    for (float& v : w) v = normal(rng);
    auto q = formats::quantize_weight(w, s.n, s.k, s.name);
    if (!q) return 1;
    const size_t nvfp4_bytes = q->packed.size() + q->block_scales.size();
    const size_t bf16_bytes = static_cast<size_t>(s.n * s.k * 2);
    const int copies = static_cast<int>(std::max<size_t>(2, (120u << 20) / bf16_bytes + 1));
    std::vector<uint8_t*> packed(copies), scales(copies);
    std::vector<uint16_t*> bf16(copies);
    for (int c = 0; c < copies; ++c) {
      BENCH_CUDA(cudaMalloc(&packed[c], q->packed.size()));
      BENCH_CUDA(cudaMalloc(&scales[c], q->block_scales.size()));
      BENCH_CUDA(cudaMalloc(&bf16[c], bf16_bytes));
      BENCH_CUDA(cudaMemcpy(packed[c], q->packed.data(), q->packed.size(), cudaMemcpyHostToDevice));
      BENCH_CUDA(cudaMemcpy(scales[c], q->block_scales.data(), q->block_scales.size(), cudaMemcpyHostToDevice));
      // The GPU layout, as the model loads it.
      if (!cuda::repack_nvfp4(packed[c], scales[c], q->block_scales.size(), nullptr)) return 1;
      BENCH_CUDA(cudaStreamSynchronize(nullptr));
      const cuda::DeviceNvfp4Weight dw{packed[c], scales[c], s.n, s.k, q->scale};
      if (!cuda::dequantize_nvfp4_bf16(dw, bf16[c], stream)) return 1;
    }
    uint16_t *x = nullptr, *workspace = nullptr, *x_hat = nullptr;
    float *y = nullptr, *row_scales = nullptr;
    BENCH_CUDA(cudaMalloc(&x_hat, static_cast<size_t>(max_m * s.k * 2)));
    BENCH_CUDA(cudaMalloc(&row_scales, static_cast<size_t>(max_m * 4)));
    BENCH_CUDA(cudaMalloc(&x, static_cast<size_t>(max_m * s.k * 2)));
    BENCH_CUDA(cudaMemset(x, 0x3c, static_cast<size_t>(max_m * s.k * 2)));  // BF16 ≈ 0.0117, never zero
    BENCH_CUDA(cudaMalloc(&y, static_cast<size_t>(max_m * s.n * 4)));
    BENCH_CUDA(cudaMalloc(&workspace, bf16_bytes));
    const cuda::GemmContext ctx{
        stream, cublas, workspace, static_cast<size_t>(s.n * s.k), x_hat, row_scales, static_cast<size_t>(max_m * s.k)};
    for (int64_t m : ms) {
      const double flops = 2.0 * m * s.n * s.k;
      const double io_bytes = m * s.k * 2.0 + m * s.n * 4.0;
      auto floor_of = [&](double weight_bytes) {
        return std::max((weight_bytes + io_bytes) / (o.hbm_tb_s * 1e12), flops / (o.bf16_tflops * 1e12));
      };
      // cuBLAS BF16 on the same shape (BF16 weights): the baseline.
      const float one = 1.0f, zero = 0.0f;
      const double t_cublas = time_launches(
          [&](int c) {
            cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, int(s.n), int(m), int(s.k), &one, bf16[c], CUDA_R_16BF,
                         int(s.k), x, CUDA_R_16BF, int(s.k), &zero, y, CUDA_R_32F, int(s.n), CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT);
          },
          copies, o.iterations, o.batches, stream);
      for (formats::ActQuant mode : {formats::ActQuant::NONE, formats::ActQuant::STATIC, formats::ActQuant::PER_TOKEN})
        for (DenseKernel backend : dense_kernels_to_time(o.gemm_backend)) {
          if (backend == DenseKernel::GEMV && m > cuda::GEMV_MAX_M) continue;
          bool ok = true;
          const double t = time_launches(
              [&](int c) {
                const cuda::DeviceNvfp4Weight dw{packed[c], scales[c], s.n, s.k, q->scale};
                ok &= cuda::linear_nvfp4(x, m, dw, mode, 0.01f, y, backend, ctx).is_ok();
              },
              copies, o.iterations, o.batches, stream);
          BENCH_CUDA(cudaStreamSynchronize(stream));
          if (!ok) {
            std::fprintf(stderr, "nibble bench kernels: %s M=%lld failed\n", s.name, static_cast<long long>(m));
            return 1;
          }
          const double bytes = nvfp4_bytes + io_bytes;
          const double pct = 100.0 * floor_of(double(nvfp4_bytes)) / t;
          const std::string label = std::string(kernel_name(backend)) + "/" + bench_mode_label(mode);
          std::printf("%-12s %6lld %-30s %10.2f %9.0f %9.1f %7.0f%% %12.2f %8.2fx\n", s.name, static_cast<long long>(m),
                      label.c_str(), t * 1e6, bytes / t / 1e9, flops / t / 1e12, pct, t_cublas * 1e6, t_cublas / t);
          rows.push_back({{"op", std::string("linear_nvfp4_w4a16.") + s.name},
                          {"m", m},
                          {"n", s.n},
                          {"k", s.k},
                          {"backend", kernel_name(backend)},
                          {"mode", bench_mode_label(mode)},
                          {"time_us", t * 1e6},
                          {"gb_s", bytes / t / 1e9},
                          {"tflops", flops / t / 1e12},
                          {"pct_floor", pct},
                          {"cublas_bf16_us", t_cublas * 1e6}});
        }
    }
    for (int c = 0; c < copies; ++c) cudaFree(packed[c]), cudaFree(scales[c]), cudaFree(bf16[c]);
    cudaFree(x), cudaFree(y), cudaFree(workspace), cudaFree(x_hat), cudaFree(row_scales);
  }
  // ERNIE's MoE also with its 2 shared experts (2 × 1536 wide) as 2 more experts every token routes to:
  // what one expert group for both would cost, against the dense shared.* rows plus the routed block.
  const std::vector<MoeShape> moe_shapes = ernie ? std::vector<MoeShape>{{"ernie-4.5-21b-a3b", 64, 6, 2560, 1536},
                                                                         {"ernie+shared-as-experts", 66, 8, 2560, 1536}}
                                                 : std::vector<MoeShape>{{"qwen3-30b-a3b", 128, 8, 2048, 768}};
  if (o.ops.find("moe") != std::string::npos)
    for (const MoeShape& shape : moe_shapes)
      if (run_bench_moe(o, shape, stream, cublas, rows) != 0) return 1;
  if (o.ops.find("attention") != std::string::npos && !ernie && run_bench_attention(o, stream, rows) != 0) return 1;
  cublasDestroy(cublas);
  if (!o.json_out.empty()) std::ofstream(o.json_out) << rows.dump(1) << "\n";
  return 0;
}

#else

int run_bench_kernels(const BenchKernelsOptions&) {
  std::fprintf(stderr, "nibble bench kernels: this nibble was built without CUDA\n");
  return 1;
}

#endif

}  // namespace nibble::tools

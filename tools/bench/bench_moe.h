// `nibble bench kernels`, MoE part: the whole MoE block of one shape on the GPU per token count,
// activation mode and backend. Only built with the CUDA backend.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <nlohmann/json.hpp>

#include "tools/bench/bench_kernels.h"

namespace nibble::tools {

// Prints a table and appends one JSON row per measurement; 0 on success.
int run_bench_moe(const BenchKernelsOptions& o, const MoeShape& shape, cudaStream_t stream, cublasHandle_t cublas,
                  nlohmann::json& rows);

}  // namespace nibble::tools

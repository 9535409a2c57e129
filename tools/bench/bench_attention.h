// `nibble bench kernels --ops attention`: the attention half of a decode layer for one token, the
// kernel chain against the one-launch block (bench_attention.cpp). Only built with the CUDA backend.
#pragma once

#include <cuda_runtime.h>

#include <nlohmann/json.hpp>

#include "tools/bench/bench_kernels.h"

namespace nibble::tools {

int run_bench_attention(const BenchKernelsOptions& options, cudaStream_t stream, nlohmann::json& rows);

}  // namespace nibble::tools

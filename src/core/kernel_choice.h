// The GPU kernels a dense NVFP4 linear and the MoE block can run, named by role. `auto` is the
// measured choice by shape (docs/perf.md "Which kernel runs where"); the others force one kernel.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nibble {

// Dense linears: a GEMV (a warp per two output rows, up to 16 rows), the skinny tensor-core kernels
// (weights straight to registers; SKINNY_SPLIT splits k over a cluster), the wgmma GEMM for prefill
// batches, or the weight dequantized to BF16 and cuBLAS.
enum class DenseKernel { AUTO, GEMV, SKINNY, SKINNY_SPLIT, WGMMA, CUBLAS };
// The MoE's expert GEMMs: the grouped mma.sync GEMM, the skinny kernels, the grouped wgmma GEMM, or
// the experts dequantized to BF16 and cuBLAS's grouped GEMM. AUTO also takes the one-launch block
// for single-token steps.
enum class MoeKernel { AUTO, GROUPED_MMA, SKINNY, WGMMA, CUBLAS };

const char* kernel_name(DenseKernel kernel);
const char* kernel_name(MoeKernel kernel);
// From the names kernel_name gives; nullopt for anything else.
std::optional<DenseKernel> parse_dense_kernel(std::string_view name);
std::optional<MoeKernel> parse_moe_kernel(std::string_view name);
// Every choice by name, auto first (what --gemm-backend / --moe-backend accept).
const std::vector<std::string>& dense_kernel_names();
const std::vector<std::string>& moe_kernel_names();
// "auto | gemv | …" for a flag's help.
std::string choices_help(const std::vector<std::string>& names);

}  // namespace nibble

// Seed settings → nibble's. FastDeploy: FD_NVFP4_GEMM_BACKEND picks its dense NVFP4 GEMM
// (flashinfer-cutlass | flashinfer-trtllm | flashinfer-cudnn, fastdeploy/envs.py) and
// FD_FLASHINFER_MOE_BACKEND its FlashInfer MoE kernels; SGLang: SGLANG_FLASHINFER_PER_TOKEN_NVFP4_MOE
// true ignores the checkpoint's MoE input_scale for online per-token activation scales (SGLang PR
// 25383), --moe-runner-backend picks its MoE kernels (auto, triton, flashinfer_trtllm, …). Kernel
// choices of FlashInfer/TensorRT-LLM builds (Blackwell FP4 tensor cores) have no Hopper equivalent:
// they become AUTO, nibble's measured choice; the per-token switch is a numerics choice nibble has.
#include "tools/seed_flags.h"

#include <algorithm>
#include <cctype>

namespace nibble::tools {
namespace {

bool truthy(std::string v) {
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  return v == "1" || v == "true" || v == "yes" || v == "on";
}

}  // namespace

std::vector<std::string> apply_seed_flags(server::ServerOptions& o, const ExplicitServeFlags& explicit_flags,
                                          const std::string& moe_runner_backend,
                                          const std::function<const char*(const char*)>& getenv) {
  std::vector<std::string> lines;
  auto kernel_choice = [&](const std::string& source, const std::string& value, std::string& target, bool set,
                           const char* flag) {
    if (set) {
      lines.push_back(source + "=" + value + ": ignored, " + flag + " " + target + " was given");
      return;
    }
    target = "auto";
    lines.push_back(source + "=" + value + " → " + flag +
                    " auto (FlashInfer's FP4 kernels need Blackwell; nibble's "
                    "Hopper kernels are chosen by measured shape)");
  };
  if (const char* v = getenv("FD_NVFP4_GEMM_BACKEND"))
    kernel_choice("FD_NVFP4_GEMM_BACKEND", v, o.gemm_backend, explicit_flags.gemm_backend, "--gemm-backend");
  if (const char* v = getenv("FD_FLASHINFER_MOE_BACKEND"))
    kernel_choice("FD_FLASHINFER_MOE_BACKEND", v, o.moe_backend, explicit_flags.moe_backend, "--moe-backend");
  if (!moe_runner_backend.empty())
    kernel_choice("--moe-runner-backend", moe_runner_backend, o.moe_backend, explicit_flags.moe_backend,
                  "--moe-backend");
  if (const char* v = getenv("SGLANG_FLASHINFER_PER_TOKEN_NVFP4_MOE")) {
    if (explicit_flags.act_quant_moe) {
      lines.push_back(std::string("SGLANG_FLASHINFER_PER_TOKEN_NVFP4_MOE=") + v + ": ignored, --act-quant-moe " +
                      o.act_quant_moe + " was given");
    } else if (truthy(v)) {
      o.act_quant_moe = "per-token";
      lines.push_back(std::string("SGLANG_FLASHINFER_PER_TOKEN_NVFP4_MOE=") + v +
                      " → --act-quant-moe per-token (the MoE's activations get per-token scales online; the "
                      "checkpoint's input_scale is not used)");
    } else {
      lines.push_back(std::string("SGLANG_FLASHINFER_PER_TOKEN_NVFP4_MOE=") + v + " → --act-quant-moe " +
                      o.act_quant_moe + " (unchanged)");
    }
  }
  return lines;
}

}  // namespace nibble::tools

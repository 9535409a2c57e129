// The MoE block's CUBLAS backend: the active experts dequantized to BF16 and cuBLAS's grouped GEMM
// (a fallback and the in-house baseline); and the SwiGLU rows' W4A4 quantize every backend shares.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"
#include "cuda/moe/moe.cuh"
#include "cuda/nvfp4/quantize_nvfp4.cuh"

namespace nibble::cuda {

// Quantizes rows of the SwiGLU output (fp32) for the W4A4 down projection (x̂ in fragment order for
// the wgmma kernels).
inline Status quantize_moe_act(const DeviceMoeWeights& w, formats::ActQuant mode, int64_t pairs, MoeWorkspace& ws,
                               cudaStream_t stream, bool fragment_order) {
  return quantize_dequantize_activation_f32(static_cast<const float*>(ws.act), pairs, w.intermediate,
                                            mode == formats::ActQuant::STATIC ? w.down_input_scale : 0.0f, ws.act_hat,
                                            ws.act_row_scales, stream, fragment_order);
}

// gate_up (+SwiGLU) and down of the grouping in ws.groups on cuBLAS (a host round trip reads the
// expert counts): y rows of each sorted pair in BF16, as the other backends leave them.
Status moe_dequant_cublas(const uint16_t* gate_up_in, const float* token_scales, int64_t tokens,
                          const DeviceMoeWeights& w, formats::ActQuant mode, MoeWorkspace& ws, cudaStream_t stream,
                          cublasHandle_t cublas);

}  // namespace nibble::cuda

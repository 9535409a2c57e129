// The MoE block of one token in one launch (single-stream decode): input norm → router → top-k →
// gate_up + SwiGLU → down → combine (+ residual and the next norm), CTAs meeting on tagged words and a grid barrier
// where the kernel chain of moe_forward ended a launch. All three activation modes, a BF16 router;
// moe_forward takes it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/status.h"
#include "cuda/moe/moe.cuh"
#include "cuda/moe/moe_router.cuh"

namespace nibble::cuda {

// Whether moe_decode_block runs this call: one token, a BF16 router, no shared-expert sum, static
// W4A4 only with both input scales, an input norm's x̂ only in W4A4 with the gate_up input's scale,
// shapes whose CTAs (hidden / 16 of them, one an SM) and shared memory fit this GPU.
bool moe_decode_block_supported(int64_t tokens, const DeviceMoeWeights& w, formats::ActQuant mode,
                                const ResidualNorm* norm, const float* add, const InputNorm* input_norm);

// The block as moe_forward computes it (same arguments; supported() must hold): routing into
// ws.expert_ids / ws.route_weights (ws.groups is not written), the output into `out` or, with
// `norm`, residual and norm->out.
Status moe_decode_block(const uint16_t* x, const DeviceMoeWeights& w, formats::ActQuant mode, MoeWorkspace& ws,
                        float* out, const ResidualNorm* norm, const InputNorm* input_norm, cudaStream_t stream);

// With NIBBLE_DIAG_PHASE_TIMING=1, the last launch's time in each phase (SM clock stamps of every CTA:
// median and max), synchronizing the device; "" otherwise. For `nibble bench kernels`.
std::string moe_decode_block_timing(int64_t hidden);

}  // namespace nibble::cuda

// Phase timing of the one-launch decode block (moe_decode.cu): with
// NIBBLE_DIAG_PHASE_TIMING=1 every CTA's thread 0 stamps the SM clock at each phase's end into a
// device buffer, and phase_report turns the last launch's stamps into per-phase times.
#pragma once

#include <cstdint>
#include <string>

namespace nibble::cuda {

inline constexpr int PHASE_STAMP_MAX_CTAS = 256;

__device__ __forceinline__ void phase_stamp(long long* stamps, int per_cta, int phase) {
  if (stamps && threadIdx.x == 0) stamps[blockIdx.x * per_cta + phase] = clock64();
}

// The device address of a kernel's stamp array (a zero-initialized `__device__ long long
// [PHASE_STAMP_MAX_CTAS · per_cta]` of its file: no allocation, so it may be asked for while a CUDA
// graph is being captured) when NIBBLE_DIAG_PHASE_TIMING=1, else null.
long long* phase_stamp_buffer(const void* symbol);

// "title (us; median / max over N CTAs, at F MHz): name t/t; ..." for phases 1 … per_cta − 1 (the
// time from the stamp before), synchronizing the device, and clears them; "" when `stamps` is null or
// the kernel has not run since the last report.
std::string phase_report(const char* title, long long* stamps, int ctas, int per_cta, const char* const* names);

}  // namespace nibble::cuda

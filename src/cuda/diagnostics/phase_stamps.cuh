// Phase timing of the one-launch kernels (the MoE block, the sampler): with
// NIBBLE_DIAG_PHASE_TIMING=1 every CTA's thread 0 stamps the SM clock at each phase's end into a
// device buffer, and phase_report turns the last launch's stamps into per-phase times.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace nibble::cuda {

inline constexpr int PHASE_STAMP_MAX_CTAS = 256;

// Phase 0 (the kernel's start) first clears the CTA's later stamps, so a phase this launch skips
// (a greedy sampler's top-k, say) reads 0 in the report, not an earlier launch's clock.
__device__ __forceinline__ void phase_stamp(long long* stamps, int per_cta, int phase) {
  if (!stamps || threadIdx.x != 0) return;
  long long* row = stamps + blockIdx.x * per_cta;
  if (phase == 0)
    for (int i = 1; i < per_cta; ++i) row[i] = 0;
  row[phase] = clock64();
}

// The device address of a kernel's stamp array (a zero-initialized `__device__ long long
// [PHASE_STAMP_MAX_CTAS · per_cta]` of its file: no allocation, so it may be asked for while a CUDA
// graph is being captured) when NIBBLE_DIAG_PHASE_TIMING=1, else null.
long long* phase_stamp_buffer(const void* symbol);

// "title (us; median / max over N CTAs, at F MHz): name t/t; ..." for phases 1 … per_cta − 1 (the
// time from the stamp before), synchronizing the device, and clears them; "" when `stamps` is null or
// the kernel has not run since the last report.
std::string phase_report(const char* title, long long* stamps, int ctas, int per_cta, const char* const* names);

// The report from stamps read back ([ctas, per_cta] SM clocks, 0 where a CTA skipped the phase) at
// `khz`: a phase's time in a CTA runs from the CTA's latest earlier stamp; a phase no CTA stamped is
// left out, and one only some stamped says over how many. Host code (tested without a GPU).
std::string format_phase_report(const char* title, const std::vector<long long>& stamps, int ctas, int per_cta,
                                int khz, const char* const* names);

}  // namespace nibble::cuda

// Phase timing of the one-launch decode blocks (phase_stamps.cuh): the buffer and the report.
#include "cuda/diagnostics/phase_stamps.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/env.h"

namespace nibble::cuda {

long long* phase_stamp_buffer(const void* symbol) {
  void* d = nullptr;
  if (!env_flag("NIBBLE_DIAG_PHASE_TIMING") || cudaGetSymbolAddress(&d, symbol) != cudaSuccess) return nullptr;
  return static_cast<long long*>(d);
}

std::string phase_report(const char* title, long long* d, int ctas, int per_cta, const char* const* names) {
  if (!d || ctas < 1 || ctas > PHASE_STAMP_MAX_CTAS) return "";
  std::vector<long long> stamps(size_t(ctas) * per_cta);
  int khz = 0, device = 0;
  if (cudaDeviceSynchronize() != cudaSuccess || cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device) != cudaSuccess ||
      cudaMemcpy(stamps.data(), d, stamps.size() * sizeof(long long), cudaMemcpyDeviceToHost) != cudaSuccess)
    return std::string(title) + " timing: could not read the stamps";
  if (stamps[0] == 0) return "";  // the kernel has not run since the buffer was made or last read
  cudaMemset(d, 0, stamps.size() * sizeof(long long));
  return format_phase_report(title, stamps, ctas, per_cta, khz, names);
}

std::string format_phase_report(const char* title, const std::vector<long long>& stamps, int ctas, int per_cta,
                                int khz, const char* const* names) {
  std::string report = std::string(title) + " phases (us; median / max over " + std::to_string(ctas) + " CTAs, at " +
                       std::to_string(khz / 1000) + " MHz):";
  for (int phase = 1; phase < per_cta; ++phase) {
    std::vector<double> us;
    for (int c = 0; c < ctas; ++c) {
      const long long* row = stamps.data() + size_t(c) * per_cta;
      if (row[phase] == 0) continue;  // skipped in this CTA
      int before = phase - 1;
      while (before > 0 && row[before] == 0) --before;
      us.push_back(double(row[phase] - row[before]) / khz * 1e3);
    }
    if (us.empty()) continue;
    std::sort(us.begin(), us.end());
    char line[160];
    if (int(us.size()) == ctas)
      std::snprintf(line, sizeof line, " %s %.2f/%.2f;", names[phase], us[us.size() / 2], us.back());
    else
      std::snprintf(line, sizeof line, " %s %.2f/%.2f (%zu CTAs);", names[phase], us[us.size() / 2], us.back(),
                    us.size());
    report += line;
  }
  return report;
}

}  // namespace nibble::cuda

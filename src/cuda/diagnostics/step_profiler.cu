// StepProfiler: a pool of events reused step after step.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cuda/common/check.cuh"
#include "core/env.h"
#include "cuda/diagnostics/step_profiler.cuh"

namespace nibble::cuda {

int op_repeats(const char* op) {
  static const char* repeated = env_value("NIBBLE_DIAG_REPEAT_OP");
  return repeated && std::strcmp(repeated, op) == 0 ? 2 : 1;
}

namespace {
StepProfiler* active = nullptr;  // the profiler between its begin and finish (one model steps at a time)
}  // namespace

void profile_mark(const char* op) {
  if (active) active->mark(op);
}

StepProfiler::~StepProfiler() {
  if (active == this) active = nullptr;
  for (cudaEvent_t e : pool_) cudaEventDestroy(e);
}

cudaEvent_t StepProfiler::event() {
  if (used_ == pool_.size()) {
    cudaEvent_t e = nullptr;
    cudaEventCreate(&e);
    pool_.push_back(e);
  }
  return pool_[used_++];
}

void StepProfiler::begin(cudaStream_t stream, const std::string& kind) {
  if (!enabled_) return;
  stream_ = stream;
  kind_ = kind;
  active = this;
  marks_.clear();
  used_ = 0;
  cudaEvent_t start = event();
  cudaEventRecord(start, stream_);
  marks_.emplace_back(nullptr, start);
}

void StepProfiler::mark(const char* op) {
  if (!enabled_ || marks_.empty()) return;
  cudaEvent_t e = event();
  cudaEventRecord(e, stream_);
  marks_.emplace_back(op, e);
}

Status StepProfiler::finish() {
  if (active == this) active = nullptr;
  if (!enabled_ || marks_.empty()) return Status::ok();
  NIB_RETURN_IF_ERROR(cuda_status(cudaEventSynchronize(marks_.back().second), "step profiler"));
  for (size_t i = 1; i < marks_.size(); ++i) {
    float ms = 0.0f;
    NIB_RETURN_IF_ERROR(
        cuda_status(cudaEventElapsedTime(&ms, marks_[i - 1].second, marks_[i].second), "step profiler"));
    ms_[kind_][marks_[i].first] += ms;
  }
  ++steps_[kind_];
  marks_.clear();
  return Status::ok();
}

std::string StepProfiler::report() const {
  std::string out;
  for (const auto& [kind, ops] : ms_) {
    const int64_t n = steps_.at(kind);
    double total = 0;
    for (const auto& [op, ms] : ops) total += ms;
    std::vector<std::pair<double, std::string>> sorted;
    for (const auto& [op, ms] : ops) sorted.emplace_back(ms, op);
    std::sort(sorted.rbegin(), sorted.rend());
    char line[160];
    std::snprintf(line, sizeof line, "%s steps: %lld, %.3f ms per step on the GPU;", kind.c_str(),
                  static_cast<long long>(n), total / static_cast<double>(n));
    out += (out.empty() ? "" : "\n") + std::string(line);
    for (const auto& [ms, op] : sorted) {
      std::snprintf(line, sizeof line, " %s %.3f ms (%.0f%%);", op.c_str(), ms / static_cast<double>(n),
                    100.0 * ms / total);
      out += line;
    }
  }
  return out;
}

}  // namespace nibble::cuda

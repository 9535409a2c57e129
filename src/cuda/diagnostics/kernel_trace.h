// A timeline of every kernel and copy the GPU runs, CUDA graphs' nodes included (NIBBLE_DIAG_KERNEL_TRACE=FILE):
// CUPTI's activity API, loaded with dlopen only when asked for, records each kernel's start and end on
// the device; FILE gets one CSV row each, plus the steps' labels in order (scripts/kernel_timeline.py).
#pragma once

#include <string>

#include "core/status.h"

namespace nibble::cuda {

// Starts tracing when NIBBLE_DIAG_KERNEL_TRACE names a file and it has not started yet (call it before
// CUDA graphs are captured, so their nodes are traced too). An error says why CUPTI could not start;
// nothing is traced then. NIBBLE_DIAG_CUPTI_LIBRARY overrides the library's name ("libcupti.so.13").
Status kernel_trace_start_from_env();

// Whether tracing is running.
bool kernel_trace_active();

// Names the next step (the next embedding kernel onward), e.g. "decode graph of 64": labels are matched
// to steps in launch order.
void kernel_trace_label(const std::string& label);

// Flushes CUPTI's buffers, stops tracing and writes the file (kernels and copies by start time, times in
// ns from the first record). Does nothing when tracing is not running.
Status kernel_trace_finish();

}  // namespace nibble::cuda

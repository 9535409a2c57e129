// A stream's wait for the host: the work queued after it starts once the host has written `value`
// into a word of pinned memory. Structured output queues a step's sampler before the CPU knows its
// masks (they depend on the step before, still running); the sampler's mask copy waits here.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace nibble::cuda {

// Queues a one-thread kernel that polls `*flag` (pinned host memory, read at system scope) until it
// equals `value`, or `timeout_seconds` pass: then it writes `value` into `*timed_out` (pinned too) and
// returns, so a host that never answers cannot hang the device; the caller checks *timed_out.
Status wait_for_host(const uint32_t* flag, uint32_t value, uint32_t* timed_out, double timeout_seconds,
                     cudaStream_t stream);

// Loads the wait's kernel now: every kernel queued behind a wait must be loaded before it (see
// prepare_sampler in sampler.cuh), and the wait's own first load would drain the device.
Status prepare_wait_for_host();

}  // namespace nibble::cuda

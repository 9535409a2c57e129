// The CUDA runner's entry points for the runner factory; cuda_runner.cpp in builds with CUDA,
// cuda_runner_none.cpp (a clear error) in CPU-only builds.
#pragma once

#include <memory>

#include "core/status.h"
#include "engine/model_runner.h"
#include "io/binding.h"

namespace nibble::engine {

// This build has the CUDA runner and a CUDA device is visible.
bool cuda_runner_available();
// Visible CUDA devices (0 without the CUDA runner).
int cuda_device_count();
// Whether the CUDA runner runs this checkpoint; the error names what does not fit.
Status cuda_runner_supports(const io::BoundCheckpoint& checkpoint);
Result<std::unique_ptr<ModelRunner>> create_cuda_runner(std::shared_ptr<const io::LoadedCheckpoint> checkpoint,
                                                        const RunnerOptions& options);
// engine::follow_node on the GPU.
Status follow_cuda_node(std::shared_ptr<const io::LoadedCheckpoint> checkpoint, const RunnerOptions& options);

}  // namespace nibble::engine

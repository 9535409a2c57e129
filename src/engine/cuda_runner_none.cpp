// CPU-only builds (-DNIBBLE_CUDA=off or no nvcc): there is no CUDA runner to create.
#include "engine/cuda_runner.h"

namespace nibble::engine {

bool cuda_runner_available() { return false; }

int cuda_device_count() { return 0; }

Status cuda_runner_supports(const io::BoundCheckpoint&) { return Status::error("this build has no CUDA runner"); }

Result<std::unique_ptr<ModelRunner>> create_cuda_runner(std::shared_ptr<const io::LoadedCheckpoint>,
                                                        const RunnerOptions&) {
  return Status::error(
      "--backend cuda: this nibble was built without CUDA (no nvcc at configure time, or "
      "-DNIBBLE_CUDA=off); rebuild with the CUDA toolkit or use --backend cpu");
}

Status follow_cuda_node(std::shared_ptr<const io::LoadedCheckpoint>, const RunnerOptions&) {
  return Status::error("--node-rank: this nibble was built without CUDA");
}

}  // namespace nibble::engine

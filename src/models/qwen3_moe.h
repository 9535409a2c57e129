// Qwen3-MoE (and Qwen3 dense, the same code without experts) on the CPU reference backend.
#pragma once

#include <memory>

#include "models/model.h"

namespace nibble::models {

Result<std::unique_ptr<Model>> create_qwen3_cpu(std::shared_ptr<const io::LoadedCheckpoint> checkpoint,
                                                const ModelOptions& options);

}  // namespace nibble::models

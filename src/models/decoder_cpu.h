// The decoder-only transformer of the supported families (Qwen3-MoE, Qwen3 dense: the same code
// without experts; ERNIE-4.5-MoE: its config features) on the CPU reference backend.
#pragma once

#include <memory>

#include "models/model.h"

namespace nibble::models {

Result<std::unique_ptr<Model>> create_decoder_cpu(std::shared_ptr<const io::LoadedCheckpoint> checkpoint,
                                                  const ModelOptions& options);

}  // namespace nibble::models

// A model split over the ranks of a tensor- or expert-parallel group on the CPU reference: one rank
// model a thread, each loading only its slices of the checkpoint, their partial results meeting
// through a HostGroup. To its caller it is one Model.
#pragma once

#include <memory>
#include <string>

#include "io/binding.h"
#include "models/model.h"

namespace nibble::models {

// What every rank of a group must agree on: the config and each module's name, shape and format.
std::string rank_layout_key(const io::LoadedCheckpoint& checkpoint);

// `size` ranks of the checkpoint at `path` (tensor parallelism; with expert_parallel the experts are
// dealt out whole). Errors: a dimension that does not split (io::partition's), ranks whose checkpoints
// differ. The KvCache a forward is given sets only the block count, size and dtype: each rank keeps
// its heads' cache of that shape (the one given is never written, so its pages are never committed).
Result<std::unique_ptr<Model>> create_parallel_model(const std::string& path, const io::ConfigOverrides& overrides,
                                                     const io::ParallelConfig& group, const ModelOptions& options);

}  // namespace nibble::models

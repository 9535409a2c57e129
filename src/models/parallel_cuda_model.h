// A model split over tensor-parallel ranks on GPUs: a CudaDecoder a rank, each on its device with a
// thread and a DeviceContext of its own, each loading only its slices of the checkpoint. Ranks on
// distinct GPUs meet through NCCL (inside the decode graphs); ranks sharing a GPU (NCCL refuses them)
// through host memory, eagerly; nodes of a group over hosts follow node 0 (node_link.h). To the runner
// it is one CudaModel on rank 0's context.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "io/binding.h"
#include "models/cuda_model.h"

namespace nibble::models {

// A group over several hosts (--nnodes, --node-rank, --dist-init-addr as SGLang spells them): each
// node runs group.size / nodes ranks, node n ranks n · that on; node 0 serves and drives the others
// (node_link.h). `key` is what every node must agree on: the checkpoint's layout and the flags.
struct NodeGroup {
  int nodes = 1, node_rank = 0;
  std::string address;  // host:port of node 0
  std::string key;
};

// devices[r]: this node's rank r's GPU (CUDA_VISIBLE_DEVICES order); rank 0's context is the caller's
// `ctx` (on devices[0]). Errors: a dimension that does not split, ranks whose checkpoints differ, NCCL
// missing, nodes that do not join or disagree.
Result<std::unique_ptr<CudaModel>> create_parallel_cuda_model(const std::string& path,
                                                              const io::ConfigOverrides& overrides,
                                                              const io::ParallelConfig& group,
                                                              const std::vector<int>& devices,
                                                              const CudaModelOptions& options, cuda::DeviceContext& ctx,
                                                              const NodeGroup& nodes = {});

// Node nodes.node_rank > 0: its ranks load, join node 0's group and run node 0's operations until it
// quits (ok) or one fails (its error).
Status follow_node(const std::string& path, const io::ConfigOverrides& overrides, const io::ParallelConfig& group,
                   const std::vector<int>& devices, const CudaModelOptions& options, cuda::DeviceContext& ctx,
                   const NodeGroup& nodes);

}  // namespace nibble::models

// DecodeGraphs (cuda_graphs.h): capture, choice of size, replay.
#include "models/cuda_graphs.h"

#include <string>

#include "core/log.h"
#include "cuda/common/check.cuh"

namespace nibble::models {

DecodeGraphs::~DecodeGraphs() {
  for (auto& [key, graph] : graphs_) cudaGraphExecDestroy(graph);
}

Status DecodeGraphs::capture(int64_t max_batch, int64_t long_max_batch, cudaStream_t stream,
                             const std::function<Status(int64_t, bool)>& prepare,
                             const std::function<std::vector<int64_t>()>& plan,
                             const std::function<Status(int64_t)>& run) {
  std::vector<std::pair<int64_t, bool>> shapes = {{1, false}, {2, false}, {4, false}};
  for (int64_t b = 8; b <= max_batch; b += 8) shapes.push_back({b, false});
  for (int64_t b : {1, 2, 4})
    if (b <= long_max_batch) shapes.push_back({b, true});
  std::string captured;
  for (const auto& [B, long_context] : shapes) {
    if (B > max_batch) continue;
    NIB_RETURN_IF_ERROR(prepare(B, long_context));
    NIB_RETURN_IF_ERROR(cuda::cuda_status(cudaStreamSynchronize(stream), "graph capture"));
    std::vector<int64_t> key_plan = plan();
    if (graphs_.count({B, key_plan})) continue;  // (the long-context plan is the usual one at this size)
    cudaGraph_t graph = nullptr;
    NIB_RETURN_IF_ERROR(
        cuda::cuda_status(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "graph capture"));
    const Status ran = run(B);
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    if (!ran || ended != cudaSuccess) {
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();
      log_warn("decode graphs stop at batch " + std::to_string(B) + ": " +
               (!ran ? ran.message() : std::string(cudaGetErrorString(ended))) + " (larger batches run eagerly)");
      if (long_context) continue;
      break;
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    NIB_RETURN_IF_ERROR(cuda::cuda_status(made, "instantiating a decode graph"));
    graphs_[{B, std::move(key_plan)}] = exec;
    captured += (captured.empty() ? "" : ",") + std::to_string(B) + (long_context ? " (long contexts)" : "");
  }
  log_info("CUDA graphs captured for decode batch sizes " + (captured.empty() ? std::string("(none)") : captured));
  return cuda::cuda_status(cudaStreamSynchronize(stream), "graph capture");
}

int64_t DecodeGraphs::size_for(const Batch& batch) const {
  const int64_t B = static_cast<int64_t>(batch.sequences.size());
  if (graphs_.empty() || static_cast<int64_t>(batch.token_ids.size()) != B ||
      static_cast<int64_t>(batch.logits_rows.size()) != B)
    return 0;
  for (int64_t r = 0; r < B; ++r)
    if (batch.logits_rows[static_cast<size_t>(r)] != r) return 0;
  auto it = graphs_.lower_bound({B, std::vector<int64_t>()});
  return it == graphs_.end() ? 0 : it->first.first;
}

bool DecodeGraphs::has(int64_t size, const std::vector<int64_t>& plan) const {
  return graphs_.count({size, plan}) > 0;
}

Status DecodeGraphs::replay(int64_t size, const std::vector<int64_t>& plan, cudaStream_t stream) const {
  return cuda::cuda_status(cudaGraphLaunch(graphs_.at({size, plan}), stream), "replaying the decode graph");
}

}  // namespace nibble::models

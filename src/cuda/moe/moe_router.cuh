// The MoE router on the GPU: logits = x · Wᵣᵀ (BF16 inputs, fp32 cuBLAS GEMM), then per token an
// fp32 softmax, top-k (descending, lower expert first on ties, as torch.topk) and, with
// norm_topk_prob, renormalization over the k chosen. Twin of ref::route.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"
#include "cuda/moe/moe_grouping.cuh"
#include "cuda/ops/transformer_ops.cuh"

namespace nibble::cuda {

struct RouterArgs {
  const uint16_t* x = nullptr;       // [tokens, hidden] BF16
  const uint16_t* router = nullptr;  // [experts, hidden] BF16
  int64_t tokens = 0, hidden = 0, experts = 0, top_k = 0;
  bool norm_topk_prob = true;
  float* logits = nullptr;        // route()'s workspace [tokens, experts] fp32
  int32_t* expert_ids = nullptr;  // [tokens, top_k]
  float* weights = nullptr;       // [tokens, top_k]
  // ERNIE-4.5: the router in fp32 instead (route() needs x_f32, a [tokens, hidden] workspace for x
  // in fp32, for its cuBLAS GEMM; route_and_group_small does not), a per-expert bias added to the probabilities for the
  // choice only, and the renormalization dividing by max(Σ top-k, norm_min).
  const float* router_f32 = nullptr;
  float* x_f32 = nullptr;
  const float* score_bias = nullptr;
  float norm_min = 0.0f;
  // The experts the grouping keeps (expert parallelism: the rank's [group_first, group_first +
  // group_count); group_count 0: all), as group_by_expert's `first` and `experts`.
  int64_t group_first = 0, group_count = 0;
};

// Softmax + top-k + renormalize over logits already computed (one warp per token; experts ≤ 256,
// top_k ≤ 32).
Status route_topk(const float* logits, int64_t tokens, int64_t experts, int64_t top_k, bool norm_topk_prob,
                  int32_t* expert_ids, float* weights, cudaStream_t stream, const float* bias = nullptr,
                  float norm_min = 0.0f);

// The whole router: the logits GEMM on `cublas`, then route_topk.
Status route(const RouterArgs& args, cublasHandle_t cublas, cudaStream_t stream);

// Small batches: the router and group_by_expert in one launch — one thread-block cluster, a warp
// per expert computing the logits (fp32 dot products of the BF16 or fp32 rows) into the first CTA,
// which then runs the top-k of every token and the grouping with tile_rows. Experts ≤ 128.
// The one-launch router wins up to 4 tokens (H200, whole skinny MoE block: 26.1 against 28.6 µs at
// T = 1, 53.0/53.5 at 4, 82.9/81.4 at 8, 141/130 at 16, 262/193 at 64: its top-k and grouping run
// in one CTA), the cuBLAS GEMM + top-k + grouping kernels above that.
inline constexpr int64_t ROUTER_SMALL_MAX_TOKENS = 4;
inline constexpr int64_t ROUTER_SMALL_MAX_HIDDEN = 4096;
bool route_small_supported(int64_t tokens, int64_t experts, int64_t hidden, int64_t top_k);

// Mid-size batches: the router and group_by_expert in one launch for a BF16 router — one cluster
// splitting hidden, the logits on tensor cores (mma.sync, fp32 sums), a warp per token's top-k and the
// first CTA's grouping. Up to 64 tokens, experts ≤ 128, hidden a multiple of 128 up to 2,048 (against
// three launches, S_TG b8 +4.6%, H200).
inline constexpr int64_t ROUTER_CLUSTER_MAX_TOKENS = 64;
bool route_cluster_supported(int64_t tokens, int64_t experts, int64_t hidden, int64_t top_k, bool f32_router);
Status route_and_group_cluster(const RouterArgs& args, int tile_rows, const ExpertGroups& groups, cudaStream_t stream);

// The MoE block's input norm (the post-attention add + RMSNorm): out = BF16(rmsnorm(residual + delta) ·
// weight), with its x̂ when quant asks — add_rmsnorm's bits — while residual is left as it was for
// the combine to add delta (ResidualNorm::pending).
struct InputNorm {
  float* residual = nullptr;         // fp32 [tokens, hidden]: the router leaves it, add_rmsnorm adds delta
  const float* delta = nullptr;      // fp32 [tokens, hidden]
  const uint16_t* weight = nullptr;  // BF16 [hidden]
  float eps = 0.0f;
  uint16_t* out = nullptr;  // BF16 [tokens, hidden]: the router's input args.x
  NormActQuant quant;
  // [tokens]: delta's rows still to be multiplied by these (add_rmsnorm's delta_row_scales); only
  // add_rmsnorm applies them, so the router and the one-launch block leave such a norm to it.
  const float* delta_row_scales = nullptr;
};

// norm: the router's input computed in its own launch (each CTA normalizes the rows it reads; the
// ranks past the first write them and their x̂), which saves a decode step the norm's launch.
Status route_and_group_small(const RouterArgs& args, int tile_rows, const ExpertGroups& groups, cudaStream_t stream,
                             const InputNorm* norm = nullptr);

}  // namespace nibble::cuda

// Router kernel: one warp per token, experts spread over the lanes (8 per lane for 256). Top-k by
// k rounds of a warp arg-max on (probability, -expert) pairs, so ties pick the lower expert.
#include "cuda/moe_router.cuh"

#include <cfloat>

#include "cuda/check.cuh"

namespace nibble::cuda {
namespace {

constexpr int MAX_PER_LANE = 8;  // experts ≤ 256
constexpr int WARPS = 4;

__global__ void __launch_bounds__(WARPS * 32)
    route_topk_kernel(const float* __restrict__ logits, int tokens, int experts, int top_k, bool renormalize,
                      int32_t* __restrict__ expert_ids, float* __restrict__ weights) {
  const int lane = threadIdx.x & 31;
  const int token = blockIdx.x * WARPS + (threadIdx.x >> 5);
  if (token >= tokens) return;
  const float* row = logits + size_t(token) * experts;
  float p[MAX_PER_LANE];
  float m = -FLT_MAX;
#pragma unroll
  for (int i = 0; i < MAX_PER_LANE; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < experts ? row[e] : -FLT_MAX;
    m = fmaxf(m, p[i]);
  }
  for (int offset = 16; offset > 0; offset >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, offset));
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < MAX_PER_LANE; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < experts ? expf(p[i] - m) : 0.0f;
    sum += p[i];
  }
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, offset);
#pragma unroll
  for (int i = 0; i < MAX_PER_LANE; ++i) p[i] = lane + 32 * i < experts ? p[i] / sum : -1.0f;

  float chosen_sum = 0.0f, chosen_p = 0.0f;
  int chosen_e = 0;
  for (int k = 0; k < top_k; ++k) {
    float best = -1.0f;
    int best_e = INT32_MAX;
#pragma unroll
    for (int i = 0; i < MAX_PER_LANE; ++i) {
      const int e = lane + 32 * i;
      if (p[i] > best || (p[i] == best && e < best_e)) best = p[i], best_e = e;
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float other = __shfl_xor_sync(0xFFFFFFFFu, best, offset);
      const int other_e = __shfl_xor_sync(0xFFFFFFFFu, best_e, offset);
      if (other > best || (other == best && other_e < best_e)) best = other, best_e = other_e;
    }
#pragma unroll
    for (int i = 0; i < MAX_PER_LANE; ++i)
      if (lane + 32 * i == best_e) p[i] = -1.0f;  // taken
    chosen_sum += best;
    if (lane == k) chosen_p = best, chosen_e = best_e;
  }
  if (lane < top_k) {
    expert_ids[size_t(token) * top_k + lane] = chosen_e;
    weights[size_t(token) * top_k + lane] = renormalize ? chosen_p / chosen_sum : chosen_p;
  }
}

}  // namespace

Status route_topk(const float* logits, int64_t tokens, int64_t experts, int64_t top_k, bool norm_topk_prob,
                  int32_t* expert_ids, float* weights, cudaStream_t stream) {
  if (experts < 1 || experts > 32 * MAX_PER_LANE) return Status::error("route_topk: experts must be in [1, 256]");
  if (top_k < 1 || top_k > 32 || top_k > experts) return Status::error("route_topk: top_k must be in [1, min(32, experts)]");
  if (tokens <= 0) return Status::ok();
  route_topk_kernel<<<unsigned((tokens + WARPS - 1) / WARPS), WARPS * 32, 0, stream>>>(
      logits, int(tokens), int(experts), int(top_k), norm_topk_prob, expert_ids, weights);
  return cuda_status(cudaGetLastError(), "route_topk launch");
}

Status route(const RouterArgs& a, cublasHandle_t cublas, cudaStream_t stream) {
  if (!a.x || !a.router || !a.logits || !a.expert_ids || !a.weights) return Status::error("route: null pointer");
  if (a.tokens <= 0) return Status::ok();
  cublasStatus_t s = cublasSetStream(cublas, stream);
  // Row-major logits[T,E] = x[T,H]·Wᵣ[E,H]ᵀ: column-major logitsᵀ[E,T] = Wᵣ(col-major H×E)ᵀ · xᵀ.
  const float one = 1.0f, zero = 0.0f;
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, int(a.experts), int(a.tokens), int(a.hidden), &one, a.router,
                     CUDA_R_16BF, int(a.hidden), a.x, CUDA_R_16BF, int(a.hidden), &zero, a.logits, CUDA_R_32F,
                     int(a.experts), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  NIB_RETURN_IF_ERROR(cublas_status(s, "route: the router GEMM"));
  return route_topk(a.logits, a.tokens, a.experts, a.top_k, a.norm_topk_prob, a.expert_ids, a.weights, stream);
}

}  // namespace nibble::cuda

// Router kernels: top-k with one warp per token (warp_softmax_topk), after cuBLAS's logits or in one
// launch with the logits and the grouping — a GEMV for up to 4 tokens (route_and_group_small), mma.sync
// over a cluster splitting hidden for up to 64 (route_and_group_cluster).
#include "cuda/moe/moe_router.cuh"

#include <cooperative_groups.h>

#include <cfloat>

#include "cuda/common/async_copy.cuh"
#include "cuda/common/check.cuh"
#include "cuda/moe/moe_routing_device.cuh"
#include "cuda/nvfp4/nvfp4_fragments.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/ops/rmsnorm_row.cuh"

namespace nibble::cuda {
namespace {

constexpr int WARPS = 4;

__global__ void __launch_bounds__(WARPS * 32)
    route_topk_kernel(const float* __restrict__ logits, int tokens, int experts, int top_k, bool renormalize,
                      const float* __restrict__ bias, float norm_min, int32_t* __restrict__ expert_ids,
                      float* __restrict__ weights) {
  pdl_wait();
  pdl_launch_dependents();
  const int token = blockIdx.x * WARPS + (threadIdx.x >> 5);
  if (token >= tokens) return;
  warp_softmax_topk(logits + size_t(token) * experts, experts, top_k, renormalize, bias, norm_min,
                    expert_ids + size_t(token) * top_k, weights + size_t(token) * top_k);
}

__global__ void bf16_to_f32_kernel(const uint16_t* __restrict__ x, int64_t n, float* __restrict__ out) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __uint_as_float(uint32_t(x[i]) << 16);
}

constexpr int SMALL_THREADS = 512;  // 16 warps, an expert each
constexpr int SMALL_WARPS = SMALL_THREADS / 32;
constexpr int SMALL_MAX_CTAS = 8;  // one thread-block cluster of the portable size
constexpr int SMALL_MAX_EXPERTS = SMALL_WARPS * SMALL_MAX_CTAS;
constexpr int SMALL_MAX_CHUNKS = ROUTER_SMALL_MAX_HIDDEN / 256;

struct SmallRouterShared {
  float logits[ROUTER_SMALL_MAX_TOKENS * SMALL_MAX_EXPERTS];  // the whole cluster's, in its first CTA
  GroupingSmem<SMALL_THREADS> grouping;
  float partial[SMALL_THREADS / 32];  // the input norm's reductions
};

// NORM: x = the input norm of norm.residual + norm.delta, row by row, into x_stage (as BF16; every
// CTA). The first NORM_THREADS threads hold a row as add_rmsnorm's threads do (rmsnorm_row.cuh), so
// the bits are add_rmsnorm's. (All rows' loads at once with one barrier for their sums lost 4–7% at
// 2–4 sequences, H100, at 107 registers as at 128: docs/lab/2026-12-07-router-norm.md.)
template <int CHUNKS>
__device__ __forceinline__ void norm_rows_to_stage(const InputNorm& norm, int T, int H, const float (&weight)[CHUNKS],
                                                   uint16_t* x_stage, float* partial) {
  const bool active = threadIdx.x < NORM_THREADS;
  for (int j = 0; j < T; ++j) {
    float v[CHUNKS];
    load_row(norm.residual + size_t(j) * H, norm.delta + size_t(j) * H, H, active, v);
    if (j > 0) __syncthreads();  // the last row's readers of partial[] are done
    normalize_row(v, weight, H, norm.eps, partial);
#pragma unroll
    for (int k = 0; k < CHUNKS; ++k) {
      const int i = int(threadIdx.x) + k * NORM_THREADS;
      if (active && i < H) x_stage[j * H + i] = uint16_t(__float_as_uint(v[k]) >> 16);  // v holds exact BF16 values
    }
  }
}

// NORM: row j of the staged x into norm.out, with its x̂ — the next launch's inputs, which the rows'
// owners (ranks 1, 2, … of the cluster; rank 0 where it is alone) write after the cluster barrier,
// beside rank 0's top-k. Rank 0 writing them before its logits cost W4A4 2–7% at 2–4 sequences.
template <int CHUNKS>
__device__ __forceinline__ void write_norm_row(const InputNorm& norm, int j, int H, const uint16_t* x_stage,
                                               float* partial) {
  const bool active = threadIdx.x < NORM_THREADS;
  float v[CHUNKS];
#pragma unroll
  for (int k = 0; k < CHUNKS; ++k) {
    const int i = int(threadIdx.x) + k * NORM_THREADS;
    const uint16_t bits = active && i < H ? x_stage[j * H + i] : 0;
    v[k] = __uint_as_float(uint32_t(bits) << 16);
    if (active && i < H) norm.out[size_t(j) * H + i] = bits;
  }
  if (norm.quant.x_hat) quantize_row(v, H, norm.quant, j, partial);
}

// One thread-block cluster: a warp per expert computes the logits (its row in registers, loaded
// before the PDL wait; the x rows staged in shared memory) and writes them into the first CTA's
// shared memory; after the cluster barrier that CTA runs the top-k of every token and the grouping.
// (It was 16 CTAs meeting through global memory — a fence, an atomic counter and the last CTA's
// reads through L2, each a round trip on the critical path of a decode step.) An fp32 router (F32)
// is read from global memory in the dot loop instead: its rows would need twice the registers.
// CHUNKS: 256-wide chunks of a row a lane may hold (hidden ≤ 256 · CHUNKS), sized to the row:
// 8 for hidden ≤ 2,048 (Qwen3-30B-A3B: 85 registers); 16 meets the 128 registers 512 threads allow
// and spills ~90 bytes. NORM: the block's input norm computed here first (norm_rows_to_stage), its
// BF16 rows and x̂ written by the other ranks while rank 0 runs the top-k (write_norm_row).
template <bool F32, int CHUNKS, bool NORM>
__global__ void __launch_bounds__(SMALL_THREADS)
    route_group_small_kernel(const RouterArgs a, int tile_rows, ExpertGroups groups, InputNorm norm) {
  extern __shared__ uint4 x_stage[];  // [tokens, hidden / 8]
  __shared__ SmallRouterShared sm;
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int expert = blockIdx.x * SMALL_WARPS + warp;
  const int H = int(a.hidden), E = int(a.experts), T = int(a.tokens), chunks = H / 256, row_words = H / 8;
  uint4 w[CHUNKS];
#pragma unroll
  for (int i = 0; i < CHUNKS; ++i)
    w[i] = !F32 && expert < E && i < chunks
               ? __ldg(reinterpret_cast<const uint4*>(a.router + size_t(expert) * H + i * 256) + lane)
               : make_uint4(0, 0, 0, 0);
  const float4* w_f32 = F32 ? reinterpret_cast<const float4*>(a.router_f32 + size_t(expert) * H) : nullptr;
  float norm_weight[NORM ? CHUNKS : 1];
  if constexpr (NORM) load_norm_weight(norm.weight, H, threadIdx.x < NORM_THREADS, norm_weight);
  pdl_wait();
  pdl_launch_dependents();
  if constexpr (NORM) {
    norm_rows_to_stage(norm, T, H, norm_weight, reinterpret_cast<uint16_t*>(x_stage), sm.partial);
  } else {
    // The x rows → shared memory with cp.async: every copy in flight at once, none through registers
    // (register staging took two round trips at 3–4 tokens: ptxas put the second load after the first store).
    constexpr int WORDS_PER_THREAD = ROUTER_SMALL_MAX_TOKENS * CHUNKS * 32 / SMALL_THREADS;
#pragma unroll
    for (int i = 0; i < WORDS_PER_THREAD; ++i) {
      const int word = threadIdx.x + i * SMALL_THREADS;
      if (word < T * row_words) cp_async<16>(x_stage + word, reinterpret_cast<const uint4*>(a.x) + word, 16);
    }
    cp_async_commit();
    cp_async_wait<0>();
  }
  __syncthreads();
  float* first_logits = cluster.map_shared_rank(sm.logits, 0);
  if (expert < E)
    for (int j = 0; j < T; ++j) {
      float acc = 0.0f;
#pragma unroll
      for (int i = 0; i < CHUNKS; ++i) {
        if (i >= chunks) continue;
        const uint4 xv = x_stage[j * row_words + i * 32 + lane];
        acc = F32 ? dot8(__ldg(w_f32 + (i * 256 + lane * 8) / 4), __ldg(w_f32 + (i * 256 + lane * 8) / 4 + 1), xv, acc)
                  : dot8(w[i], xv, acc);
      }
      for (int offset = 16; offset > 0; offset >>= 1) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, offset);
      if (lane == 0) first_logits[j * E + expert] = acc;
    }
  cluster.sync();  // release / acquire: every CTA's logits are in the first CTA's shared memory
  const int rank = int(cluster.block_rank()), ctas = int(cluster.num_blocks());
  if (rank != 0) {
    if constexpr (NORM)
      for (int j = rank - 1; j < T; j += ctas - 1)
        write_norm_row<CHUNKS>(norm, j, H, reinterpret_cast<const uint16_t*>(x_stage), sm.partial);
    return;
  }
  for (int t = warp; t < T; t += SMALL_WARPS)
    warp_softmax_topk<true>(sm.logits + t * E, E, int(a.top_k), a.norm_topk_prob, a.score_bias, a.norm_min,
                            a.expert_ids + size_t(t) * a.top_k, a.weights + size_t(t) * a.top_k);
  __syncthreads();
  // At most 4 tokens · 32 = 128 pairs: one a thread.
  group_rows<SMALL_THREADS, 1>(a.expert_ids, T * int(a.top_k), int(a.group_first),
                               a.group_count ? int(a.group_count) : E, tile_rows, groups, sm.grouping);
  if constexpr (NORM)
    if (ctas == 1)
      for (int j = 0; j < T; ++j)
        write_norm_row<CHUNKS>(norm, j, H, reinterpret_cast<const uint16_t*>(x_stage), sm.partial);
}

// Mid-size batches: one cluster splits hidden into 128-wide k-blocks, KBS a CTA. A warp's m16 tile is
// 16 experts, its BF16 router rows loaded straight into mma fragments before the PDL wait (the skinny
// GEMMs' k permutation: lane c takes physical k 32c … + 31 of each block, so A and B agree); the
// tokens' x of the CTA's blocks staged in shared memory (the 16-byte chunks swizzled by bit 3, so a
// quarter-warp's loads of rows g, g + 1 fall in distinct bank groups). The partial logits meet over
// distributed shared memory: warp w of rank r sums token 8r + w's over the ranks in rank order, runs
// its softmax + top-k and puts the ids in the first CTA, which groups them after a second barrier.
constexpr int CLUSTER_THREADS = 256;
constexpr int CLUSTER_WARPS = CLUSTER_THREADS / 32;
constexpr int CLUSTER_MAX_EXPERTS = 16 * CLUSTER_WARPS;
constexpr int CLUSTER_MAX_RANKS = 8;
constexpr int CLUSTER_LOGIT_PITCH = CLUSTER_MAX_EXPERTS + 4;  // floats: the partial stores avoid bank conflicts

__host__ __device__ constexpr int cluster_x_pitch(int kbs) { return kbs * 256 + 32; }
// A 16-byte chunk's place in its staged k-block: bit 3 of the chunk flips bit 0.
__device__ __forceinline__ int swizzled_chunk(int chunk) { return chunk ^ ((chunk >> 3) & 1); }

// Dynamic shared memory of route_group_cluster_kernel<KBS, NT>, in this order.
struct ClusterRouterLayout {
  size_t x, logits, rows, ids, grouping, bytes;
  __host__ __device__ constexpr ClusterRouterLayout(int kbs, int nt, int max_pairs)
      : x(0),
        logits(size_t(8 * nt) * cluster_x_pitch(kbs)),
        rows(logits + size_t(8 * nt) * CLUSTER_LOGIT_PITCH * sizeof(float)),
        ids(rows + size_t(CLUSTER_WARPS) * CLUSTER_MAX_EXPERTS * sizeof(float)),
        grouping(ids + (size_t(max_pairs) * sizeof(int32_t) + 15) / 16 * 16),
        bytes(grouping + sizeof(GroupingSmem<CLUSTER_THREADS>)) {}
};

template <int KBS, int NT>
__global__ void __launch_bounds__(CLUSTER_THREADS)
    route_group_cluster_kernel(const RouterArgs a, int tile_rows, ExpertGroups groups) {
  extern __shared__ __align__(16) uint8_t smem[];
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  const int ranks = int(cluster.num_blocks()), rank = int(cluster.block_rank());
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int H = int(a.hidden), E = int(a.experts), T = int(a.tokens), K = int(a.top_k);
  const ClusterRouterLayout layout(KBS, NT, T * K);
  const int kb0 = rank * KBS, blocks = max(0, min(KBS, H / 128 - kb0));
  uint4 w[KBS][2][4];  // [block][row g, g + 8][16-byte piece j: physical k 32c + 8j … + 7]
#pragma unroll
  for (int b = 0; b < KBS; ++b)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int e = 16 * warp + g + 8 * h;
      const uint4* row =
          reinterpret_cast<const uint4*>(a.router + size_t(min(e, E - 1)) * H + (kb0 + b) * 128 + 32 * c);
#pragma unroll
      for (int j = 0; j < 4; ++j) w[b][h][j] = e < E && b < blocks ? __ldg(row + j) : make_uint4(0, 0, 0, 0);
    }
  pdl_wait();
  pdl_launch_dependents();
  const int pitch = cluster_x_pitch(KBS);
  const uint32_t x_smem = smem_address(smem + layout.x);
  for (int i = threadIdx.x; i < T * 16 * blocks; i += CLUSTER_THREADS) {
    const int t = i / (16 * blocks), b = (i / 16) % blocks, chunk = i & 15;
    cp_async_shared<16>(x_smem + t * pitch + b * 256 + 16 * swizzled_chunk(chunk),
                        a.x + size_t(t) * H + (kb0 + b) * 128 + chunk * 8);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  // Token rows past the batch hold stale values: an mma column depends on its own token alone.
  float acc[NT][4] = {};
#pragma unroll
  for (int b = 0; b < KBS; ++b) {
    if (b >= blocks) break;
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // piece j: mma steps 2j (words x, y) and 2j + 1 (z, w)
      const uint32_t a0[4] = {w[b][0][j].x, w[b][1][j].x, w[b][0][j].y, w[b][1][j].y};
      const uint32_t a1[4] = {w[b][0][j].z, w[b][1][j].z, w[b][0][j].w, w[b][1][j].w};
      // Every n-tile's x piece first, then each step's MMAs over the n-tiles: no mma waits on its load
      // or on the mma just before it.
      const uint8_t* chunk = smem + layout.x + g * pitch + b * 256 + 16 * swizzled_chunk(4 * c + j);
      uint4 v[NT];
#pragma unroll
      for (int n = 0; n < NT; ++n) v[n] = *reinterpret_cast<const uint4*>(chunk + 8 * n * pitch);
#pragma unroll
      for (int n = 0; n < NT; ++n) mma_bf16(acc[n], a0, v[n].x, v[n].y);
#pragma unroll
      for (int n = 0; n < NT; ++n) mma_bf16(acc[n], a1, v[n].z, v[n].w);
    }
  }
  float* logits = reinterpret_cast<float*>(smem + layout.logits);
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i)  // acc i: expert g + 8·(i / 2) of the warp's tile, token 2c + i % 2
      logits[(8 * n + 2 * c + (i & 1)) * CLUSTER_LOGIT_PITCH + 16 * warp + g + 8 * (i >> 1)] = acc[n][i];
  cluster.sync();  // release / acquire: every rank's partial logits are visible to the cluster
  float* row = reinterpret_cast<float*>(smem + layout.rows) + warp * CLUSTER_MAX_EXPERTS;
  int32_t* first_ids = cluster.map_shared_rank(reinterpret_cast<int32_t*>(smem + layout.ids), 0);
  const float* rank_logits[CLUSTER_MAX_RANKS];
#pragma unroll
  for (int r = 0; r < CLUSTER_MAX_RANKS; ++r) rank_logits[r] = cluster.map_shared_rank(logits, min(r, ranks - 1));
  for (int t = rank * CLUSTER_WARPS + warp; t < T; t += ranks * CLUSTER_WARPS) {
    // Every rank's part of the lane's experts loaded before the first add (a remote load and an add in
    // turn waited out the distributed shared memory's latency once per rank and expert), then summed
    // in rank order.
    constexpr int PER_LANE = CLUSTER_MAX_EXPERTS / 32;
    float part[PER_LANE][CLUSTER_MAX_RANKS];
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i)
#pragma unroll
      for (int r = 0; r < CLUSTER_MAX_RANKS; ++r)
        part[i][r] = r < ranks && lane + 32 * i < E ? rank_logits[r][t * CLUSTER_LOGIT_PITCH + lane + 32 * i] : 0.0f;
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
      float sum = part[i][0];
#pragma unroll
      for (int r = 1; r < CLUSTER_MAX_RANKS; ++r)
        if (r < ranks) sum += part[i][r];
      if (lane + 32 * i < E) row[lane + 32 * i] = sum;
    }
    __syncwarp();
    warp_softmax_topk<true>(row, E, K, a.norm_topk_prob, a.score_bias, a.norm_min, first_ids + t * K,
                            a.weights + size_t(t) * K);
    __syncwarp();  // the row is read before the warp's next token rewrites it
  }
  cluster.sync();  // every token's ids are in the first CTA; no rank reads another's memory after this
  if (rank != 0) return;
  const int32_t* ids = reinterpret_cast<const int32_t*>(smem + layout.ids);
  for (int i = threadIdx.x; i < T * K; i += CLUSTER_THREADS) a.expert_ids[i] = ids[i];
  group_rows<CLUSTER_THREADS, 2>(ids, T * K, int(a.group_first), a.group_count ? int(a.group_count) : E, tile_rows,
                                 groups, *reinterpret_cast<GroupingSmem<CLUSTER_THREADS>*>(smem + layout.grouping));
}

// k-blocks a CTA: one, or two where hidden has more than 8 (the cluster's portable size).
int cluster_router_kbs(int64_t hidden) { return hidden / 128 > CLUSTER_MAX_RANKS ? 2 : 1; }

template <int KBS, int NT>
Status launch_cluster_router(const RouterArgs& a, int tile_rows, const ExpertGroups& groups, cudaStream_t stream) {
  const auto kernel = route_group_cluster_kernel<KBS, NT>;
  const size_t bytes = ClusterRouterLayout(KBS, NT, int(a.tokens * a.top_k)).bytes;
  // Set once per instantiation and process, at the largest size a launch asks for.
  static const cudaError_t limit = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                        int(ClusterRouterLayout(KBS, NT, 8 * NT * 32).bytes));
  NIB_RETURN_IF_ERROR(cuda_status(limit, "route_and_group_cluster: shared memory"));
  const unsigned ranks = unsigned((a.hidden / 128 + KBS - 1) / KBS);
  return cuda_status(
      launch_pdl_cluster(kernel, dim3(ranks), dim3(CLUSTER_THREADS), bytes, ranks, stream, a, tile_rows, groups),
      "route_and_group_cluster launch");
}

template <int KBS>
Status launch_cluster_router(const RouterArgs& a, int tile_rows, const ExpertGroups& groups, cudaStream_t stream) {
  if (a.tokens <= 8) return launch_cluster_router<KBS, 1>(a, tile_rows, groups, stream);
  if (a.tokens <= 16) return launch_cluster_router<KBS, 2>(a, tile_rows, groups, stream);
  if (a.tokens <= 32) return launch_cluster_router<KBS, 4>(a, tile_rows, groups, stream);
  return launch_cluster_router<KBS, 8>(a, tile_rows, groups, stream);
}

}  // namespace

Status route_topk(const float* logits, int64_t tokens, int64_t experts, int64_t top_k, bool norm_topk_prob,
                  int32_t* expert_ids, float* weights, cudaStream_t stream, const float* bias, float norm_min) {
  if (experts < 1 || experts > 32 * ROUTER_MAX_PER_LANE)
    return Status::error("route_topk: experts must be in [1, 256]");
  if (top_k < 1 || top_k > 32 || top_k > experts)
    return Status::error("route_topk: top_k must be in [1, min(32, experts)]");
  if (tokens <= 0) return Status::ok();
  return cuda_status(
      launch_pdl(route_topk_kernel, unsigned((tokens + WARPS - 1) / WARPS), WARPS * 32, 0, stream, logits, int(tokens),
                 int(experts), int(top_k), norm_topk_prob, bias, norm_min, expert_ids, weights),
      "route_topk launch");
}

Status route(const RouterArgs& a, cublasHandle_t cublas, cudaStream_t stream) {
  if (!a.x || !(a.router || a.router_f32) || !a.logits || !a.expert_ids || !a.weights)
    return Status::error("route: null pointer");
  if (a.router_f32 && !a.x_f32) return Status::error("route: an fp32 router needs the fp32 input workspace");
  if (a.tokens <= 0) return Status::ok();
  const int64_t n = a.tokens * a.hidden;
  if (a.router_f32) {  // fp32 logits of the BF16 input, as transformers' F.linear(h.float(), W.float())
    NIB_RETURN_IF_ERROR(cuda_status(
        launch_pdl(bf16_to_f32_kernel, dim3(unsigned((n + 255) / 256)), dim3(256), 0, stream, a.x, n, a.x_f32),
        "route: fp32 input"));
  }
  cublasStatus_t s = cublasSetStream(cublas, stream);
  // Row-major logits[T,E] = x[T,H]·Wᵣ[E,H]ᵀ: column-major logitsᵀ[E,T] = Wᵣ(col-major H×E)ᵀ · xᵀ.
  const float one = 1.0f, zero = 0.0f;
  const cudaDataType type = a.router_f32 ? CUDA_R_32F : CUDA_R_16BF;
  const void* w = a.router_f32 ? static_cast<const void*>(a.router_f32) : static_cast<const void*>(a.router);
  const void* x = a.router_f32 ? static_cast<const void*>(a.x_f32) : static_cast<const void*>(a.x);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, int(a.experts), int(a.tokens), int(a.hidden), &one, w, type,
                     int(a.hidden), x, type, int(a.hidden), &zero, a.logits, CUDA_R_32F, int(a.experts),
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  NIB_RETURN_IF_ERROR(cublas_status(s, "route: the router GEMM"));
  return route_topk(a.logits, a.tokens, a.experts, a.top_k, a.norm_topk_prob, a.expert_ids, a.weights, stream,
                    a.score_bias, a.norm_min);
}

}  // namespace nibble::cuda

namespace nibble::cuda {

bool route_small_supported(int64_t tokens, int64_t experts, int64_t hidden, int64_t top_k) {
  return tokens >= 1 && tokens <= ROUTER_SMALL_MAX_TOKENS && experts >= 1 && experts <= SMALL_MAX_EXPERTS &&
         top_k >= 1 && top_k <= 32 && top_k <= experts && hidden % 256 == 0 && hidden <= ROUTER_SMALL_MAX_HIDDEN;
}

Status route_and_group_small(const RouterArgs& a, int tile_rows, const ExpertGroups& groups, cudaStream_t stream,
                             const InputNorm* norm) {
  if (!route_small_supported(a.tokens, a.experts, a.hidden, a.top_k))
    return Status::error("route_and_group_small: needs 1 to " + std::to_string(ROUTER_SMALL_MAX_TOKENS) +
                         " tokens, experts ≤ " + std::to_string(SMALL_MAX_EXPERTS) +
                         ", top_k ≤ 32 and hidden a multiple of 256 up to " + std::to_string(ROUTER_SMALL_MAX_HIDDEN));
  if (!a.x || !(a.router || a.router_f32) || !a.expert_ids || !a.weights || !groups.tiles)
    return Status::error("route_and_group_small: null pointer");
  if (tile_rows < 1) return Status::error("route_and_group_small: tile_rows must be positive");
  if (norm && (!norm->residual || !norm->delta || !norm->weight || norm->out != a.x))
    return Status::error(
        "route_and_group_small: the input norm needs its residual, delta and weight, and writes args.x");
  if (norm && norm->quant.x_hat &&
      (!norm->quant.row_scales || !(norm->quant.input_scale >= 0.0f) || a.hidden % 16 != 0))
    return Status::error("route_and_group_small: the input norm's x̂ needs row scales and an input_scale ≥ 0");
  // One cluster of the CTAs the experts need; x staged in ≤ 32 KB of shared memory (no opt-in needed).
  const unsigned ctas = unsigned((a.experts + SMALL_WARPS - 1) / SMALL_WARPS);
  using Kernel = void (*)(RouterArgs, int, ExpertGroups, InputNorm);
  constexpr int C = SMALL_MAX_CHUNKS;
  const Kernel kernels[2][2][2] = {
      // [fp32 router][hidden > 2,048][input norm]
      {{route_group_small_kernel<false, C / 2, false>, route_group_small_kernel<false, C / 2, true>},
       {route_group_small_kernel<false, C, false>, route_group_small_kernel<false, C, true>}},
      {{route_group_small_kernel<true, C / 2, false>, route_group_small_kernel<true, C / 2, true>},
       {route_group_small_kernel<true, C, false>, route_group_small_kernel<true, C, true>}}};
  const Kernel kernel = kernels[a.router_f32 != nullptr][a.hidden > 256 * C / 2][norm != nullptr];
  return cuda_status(
      launch_pdl_cluster(kernel, dim3(ctas), dim3(SMALL_THREADS), size_t(a.tokens) * a.hidden * sizeof(uint16_t), ctas,
                         stream, a, tile_rows, groups, norm ? *norm : InputNorm{}),
      "route_and_group_small launch");
}

bool route_cluster_supported(int64_t tokens, int64_t experts, int64_t hidden, int64_t top_k, bool f32_router) {
  return !f32_router && tokens >= 1 && tokens <= ROUTER_CLUSTER_MAX_TOKENS && experts >= 1 &&
         experts <= CLUSTER_MAX_EXPERTS && top_k >= 1 && top_k <= 32 && top_k <= experts && hidden % 128 == 0 &&
         hidden / 128 <= 2 * CLUSTER_MAX_RANKS;
}

Status route_and_group_cluster(const RouterArgs& a, int tile_rows, const ExpertGroups& groups, cudaStream_t stream) {
  if (!route_cluster_supported(a.tokens, a.experts, a.hidden, a.top_k, a.router_f32 != nullptr))
    return Status::error("route_and_group_cluster: needs a BF16 router, 1 to " +
                         std::to_string(ROUTER_CLUSTER_MAX_TOKENS) + " tokens, experts ≤ " +
                         std::to_string(CLUSTER_MAX_EXPERTS) + ", top_k ≤ 32 and hidden a multiple of 128 up to " +
                         std::to_string(2 * CLUSTER_MAX_RANKS * 128));
  if (!a.x || !a.router || !a.expert_ids || !a.weights || !groups.tiles)
    return Status::error("route_and_group_cluster: null pointer");
  if (tile_rows < 1) return Status::error("route_and_group_cluster: tile_rows must be positive");
  if (reinterpret_cast<uintptr_t>(a.x) % 16 || reinterpret_cast<uintptr_t>(a.router) % 16)
    return Status::error("route_and_group_cluster: x and the router must be 16-byte aligned");
  return cluster_router_kbs(a.hidden) == 2 ? launch_cluster_router<2>(a, tile_rows, groups, stream)
                                           : launch_cluster_router<1>(a, tile_rows, groups, stream);
}

}  // namespace nibble::cuda

// The skinny dense NVFP4 GEMM for batches of up to 64 token rows a CTA: a CTA takes 128 weight rows
// (one m16 tile a warp) over a range of k, with its tokens' x of that range staged once in shared
// memory for all eight warps; a thread-block cluster along k splits K, and its CTAs sum their partial
// outputs through distributed shared memory in rank order (deterministic, one launch). The per-m-tile
// kernel (skinny_gemm.cu) has each CTA's 16 weight rows read all of x, which at 64 rows is q_proj's
// 4.7 MB of weights against 67 MB of x from L2. Fragments, k permutation and scales: skinny_gemm.cu's.
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdlib>

#include "cuda/async_copy.cuh"
#include "cuda/skinny_dense_cluster.cuh"
#include "cuda/skinny_fragments.cuh"

namespace nibble::cuda {
namespace {

using namespace skinny;
namespace cg = cooperative_groups;

constexpr int WARPS = 8;
constexpr int CTA_ROWS = 16 * WARPS;     // weight rows a CTA: a warp's m16 tile each
constexpr int PASS_BLOCKS = 4;           // k-blocks of weight fragments a warp holds at once (64 registers)
constexpr int MAX_CLUSTER = 8;           // the portable cluster size
constexpr int MAX_CTA_BLOCKS = 8;        // a CTA's k range: 64 rows × 8 k-blocks of x in 130 KB
constexpr int PARTIAL_PITCH = CTA_ROWS + 4;  // floats a token row of partial sums (+4: no bank conflicts)
constexpr int MAX_SEGMENTS = 3;

struct Segment {
  const uint8_t* codes;
  const uint8_t* scales;
  float alpha;  // weight_scale_2 × WEIGHT_DECODE_EPILOGUE
  float* y;
  int rows;
  int cta_begin;  // the first of this weight's 128-row CTA tiles
};

struct Params {
  Segment seg[MAX_SEGMENTS];
  int count;
  const uint16_t* x;
  int m, k;
  int cta_blocks;  // k-blocks a cluster rank takes: rank r has [r · cta_blocks, (r + 1) · cta_blocks)
  const float* row_scales;
};

// x rows in shared memory: a row's k-blocks of 256 bytes back to back, + 32 bytes a row, and the
// 16-byte chunks of each block swizzled (chunk ^ bit 3 of chunk): a quarter-warp's loads of chunk
// 4c + q of rows g, g + 1 then fall in eight distinct bank groups.
__host__ __device__ constexpr int x_pitch(int cta_blocks) { return cta_blocks * 256 + 32; }
__device__ __forceinline__ int swizzled_chunk(int chunk) { return chunk ^ ((chunk >> 3) & 1); }

__host__ __device__ constexpr size_t smem_bytes(int nt, int cta_blocks) {
  return size_t(8 * nt) * x_pitch(cta_blocks) + size_t(8 * nt) * PARTIAL_PITCH * sizeof(float);
}

// Waits until at most `pending` of this thread's cp.async groups are in flight (an immediate in PTX).
__device__ __forceinline__ void cp_async_wait_at_most(int pending) {
  switch (pending) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    case 5: cp_async_wait<5>(); break;
    case 6: cp_async_wait<6>(); break;
    default: cp_async_wait<7>(); break;
  }
}

// One k-block: acc[n] += Ŵ(rows g, g + 8) · x(token column g of n-tile n), x from the staged block at
// `x_block` (this lane's token row g of n-tile 0). A word at a time, so only its two A fragments live;
// its x pieces for four n-tiles are loaded before their first mma and each step's MMAs run over the
// four, so no mma waits on a load or on the mma just before it (load → mma → mma per n-tile kept
// one warp's chain serial: q_proj M = 64 took 14.8 µs, H200).
template <int NT>
__device__ __forceinline__ void mma_staged_block(const uint4 (&codes)[2], const uint32_t (&scales)[2], const uint8_t* x_block,
                                                 int pitch, int c, float (&acc)[NT][4]) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {  // code word q: k 32c + 8q … + 7, mma steps 2q and 2q + 1
    uint32_t lo[4], hi[4];
    decode_code_word(word_of(codes[0], q), lo);
    decode_code_word(word_of(codes[1], q), hi);
    const uint32_t s0 = block_scale_bf16x2(scales[0], q >> 1), s1 = block_scale_bf16x2(scales[1], q >> 1);
    const uint32_t a0[4] = {bf16x2_mul(lo[0], s0), bf16x2_mul(hi[0], s1), bf16x2_mul(lo[1], s0), bf16x2_mul(hi[1], s1)};
    const uint32_t a1[4] = {bf16x2_mul(lo[2], s0), bf16x2_mul(hi[2], s1), bf16x2_mul(lo[3], s0), bf16x2_mul(hi[3], s1)};
    const uint8_t* chunk = x_block + 16 * swizzled_chunk(4 * c + q);
    constexpr int GROUP = NT < 4 ? NT : 4;  // n-tiles a round: 8 would take 16 more registers and spill
#pragma unroll
    for (int n0 = 0; n0 < NT; n0 += GROUP) {
      uint4 v[GROUP];
#pragma unroll
      for (int n = 0; n < GROUP; ++n) v[n] = *reinterpret_cast<const uint4*>(chunk + 8 * (n0 + n) * pitch);
#pragma unroll
      for (int n = 0; n < GROUP; ++n) mma_bf16(acc[n0 + n], a0, v[n].x, v[n].y);
#pragma unroll
      for (int n = 0; n < GROUP; ++n) mma_bf16(acc[n0 + n], a1, v[n].z, v[n].w);
    }
  }
}

// Grid: (128-row CTA tiles × cluster size, 1, token tiles of 8 · NT); the cluster (size, 1, 1) is one
// CTA tile's k split.
// Two CTAs an SM up to 4 n-tiles (128 registers); 8 n-tiles need more (they spilled ~140 bytes at 128).
template <int NT>
__global__ void __launch_bounds__(WARPS * 32, NT < 8 ? 2 : 1) skinny_dense_cluster_kernel(const Params p) {
  extern __shared__ __align__(16) uint8_t smem[];
  const cg::cluster_group cluster = cg::this_cluster();
  const int ranks = int(cluster.num_blocks()), rank = int(cluster.block_rank());
  const int cta_tile = int(blockIdx.x) / ranks;
  int s = 0;
#pragma unroll
  for (int i = 1; i < MAX_SEGMENTS; ++i)
    if (i < p.count && cta_tile >= p.seg[i].cta_begin) s = i;
  const Segment& seg = p.seg[s];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int row0 = (cta_tile - seg.cta_begin) * CTA_ROWS, m0 = row0 + 16 * warp;
  const int kb0 = rank * p.cta_blocks, blocks = max(0, min(p.cta_blocks, p.k / 128 - kb0));
  const int t0 = int(blockIdx.z) * 8 * NT, tokens = min(8 * NT, p.m - t0);

  const size_t code_row = size_t(p.k) / 2, scale_row = size_t(p.k) / 16;
  const uint8_t* row_codes[2];
  const uint8_t* row_scales[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = m0 + g + 8 * h;
    row_codes[h] = row < seg.rows ? seg.codes + row * code_row : nullptr;  // past the weight: zeros
    row_scales[h] = seg.scales + min(row, seg.rows - 1) * scale_row;
  }
  WeightFragments<PASS_BLOCKS> w;
  w.load(row_codes, row_scales, kb0, min(PASS_BLOCKS, blocks), c);  // the weights do not depend on earlier kernels
  pdl_wait();
  pdl_launch_dependents();

  // The CTA's x: a cp.async group a k-block, so the first block's MMAs start once it alone landed.
  // Token rows past the batch are not copied: their columns hold stale values, and each mma column
  // depends only on its own token, whose outputs are never stored.
  const int pitch = x_pitch(p.cta_blocks);
  const uint32_t x_smem = smem_address(smem);
  for (int b = 0; b < blocks; ++b) {
    for (int i = threadIdx.x; i < tokens * 16; i += WARPS * 32) {
      const int t = i >> 4, chunk = i & 15;
      cp_async_shared<16>(x_smem + t * pitch + b * 256 + 16 * swizzled_chunk(chunk),
                          p.x + size_t(t0 + t) * p.k + (kb0 + b) * 128 + chunk * 8);
    }
    cp_async_commit();
  }

  float acc[NT][4] = {};
  const uint8_t* x_lane = smem + g * pitch;
  for (int pass = 0; pass < blocks; pass += PASS_BLOCKS) {
    if (pass > 0) w.load(row_codes, row_scales, kb0 + pass, min(PASS_BLOCKS, blocks - pass), c);
#pragma unroll
    for (int b = 0; b < PASS_BLOCKS; ++b) {
      const int kb = pass + b;
      if (kb >= blocks) break;
      cp_async_wait_at_most(blocks - 1 - kb);
      __syncthreads();  // every thread's copies of block kb landed
      mma_staged_block<NT>({w.codes[0][b], w.codes[1][b]}, {w.scales[0][b], w.scales[1][b]}, x_lane + kb * 256, pitch, c,
                           acc);
    }
  }

  // Partial sums [token][row] in this CTA's shared memory (past x: no barrier needed before writing).
  float* partial = reinterpret_cast<float*>(smem + size_t(8 * NT) * pitch);
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i)  // acc i: row g + 8·(i / 2), token column 2c + i % 2
      partial[(8 * n + 2 * c + (i & 1)) * PARTIAL_PITCH + 16 * warp + g + 8 * (i >> 1)] = acc[n][i];
  cluster.sync();  // release / acquire: every rank's partial sums are visible to the cluster

  // Rank r sums its share of the tile's outputs (runs of 4 rows) over the ranks, in rank order.
  const int runs = tokens * (CTA_ROWS / 4), share = (runs + ranks - 1) / ranks;
  const int end = min(runs, (rank + 1) * share);
  for (int u = rank * share + int(threadIdx.x); u < end; u += WARPS * 32) {
    const int t = u / (CTA_ROWS / 4), row = row0 + 4 * (u % (CTA_ROWS / 4));
    if (row >= seg.rows) continue;
    const int offset = t * PARTIAL_PITCH + row - row0;
    float4 sum = *reinterpret_cast<const float4*>(cluster.map_shared_rank(partial, 0) + offset);
    for (int r = 1; r < ranks; ++r) {
      const float4 v = *reinterpret_cast<const float4*>(cluster.map_shared_rank(partial, r) + offset);
      sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
    }
    const float scale = p.row_scales ? seg.alpha * p.row_scales[t0 + t] : seg.alpha;
    float* y = seg.y + size_t(t0 + t) * seg.rows + row;
    const float4 out = make_float4(sum.x * scale, sum.y * scale, sum.z * scale, sum.w * scale);
    if (seg.rows % 4 == 0) {
      *reinterpret_cast<float4*>(y) = out;  // rows a multiple of 4: in bounds and 16-byte aligned
    } else {
      const float values[4] = {out.x, out.y, out.z, out.w};
      for (int j = 0; j < 4 && row + j < seg.rows; ++j) y[j] = values[j];
    }
  }
  cluster.sync();  // every rank has read this CTA's partial sums before it leaves
}

// k-blocks a CTA aims for (NIBBLE_SKINNY_CLUSTER_BLOCKS overrides: an experiment switch): K / 512
// CTAs a cluster, up to 8.
int target_cta_blocks() {
  static const int forced =
      std::getenv("NIBBLE_SKINNY_CLUSTER_BLOCKS") ? std::atoi(std::getenv("NIBBLE_SKINNY_CLUSTER_BLOCKS")) : 0;
  return forced >= 1 && forced <= MAX_CTA_BLOCKS ? forced : 4;
}

template <int NT>
Status launch(Params p, int tiles, int ranks, cudaStream_t stream) {
  const auto kernel = skinny_dense_cluster_kernel<NT>;
  const size_t bytes = smem_bytes(NT, p.cta_blocks);
  // Set once per instantiation and process, at the largest size any launch asks for.
  static const cudaError_t limit =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_bytes(NT, MAX_CTA_BLOCKS)));
  NIB_RETURN_IF_ERROR(cuda_status(limit, "skinny_linear (cluster): shared memory"));
  const dim3 grid(unsigned(tiles * ranks), 1, unsigned((p.m + 8 * NT - 1) / (8 * NT)));
  return cuda_status(launch_pdl_cluster(kernel, grid, dim3(WARPS * 32), bytes, unsigned(ranks), stream, p),
                     "skinny_linear (cluster) launch");
}

}  // namespace

bool skinny_cluster_supported(int64_t in_features) {
  return in_features > 0 && in_features % 128 == 0 && in_features <= int64_t{MAX_CLUSTER} * MAX_CTA_BLOCKS * 128;
}

int skinny_cluster_ranks(int64_t in_features) {
  const int blocks = int(in_features / 128);
  return std::min(MAX_CLUSTER, std::max(1, (blocks + target_cta_blocks() - 1) / target_cta_blocks()));
}

Status skinny_linear_cluster(const uint16_t* x, int64_t M, const DeviceNvfp4Weight* const* weights, float* const* outputs,
                             int count, const float* row_scales, cudaStream_t stream) {
  const int64_t K = weights[0]->cols;
  if (!skinny_cluster_supported(K))
    return Status::error("skinny_linear (cluster): in_features " + std::to_string(K) + " is not a multiple of 128 up to " +
                         std::to_string(MAX_CLUSTER * MAX_CTA_BLOCKS * 128));
  Params p{};
  p.count = count, p.x = x, p.m = int(M), p.k = int(K), p.row_scales = row_scales;
  int tiles = 0;
  for (int i = 0; i < count; ++i) {
    const DeviceNvfp4Weight& w = *weights[i];
    // The decoded weights are × 2⁻⁸ (nvfp4_layout.h): alpha's factor restores them, exactly.
    p.seg[i] = {w.packed, w.block_scales, w.weight_scale_2 * WEIGHT_DECODE_EPILOGUE, outputs[i], int(w.rows), tiles};
    tiles += int((w.rows + CTA_ROWS - 1) / CTA_ROWS);
  }
  const int blocks = int(K / 128), ranks = skinny_cluster_ranks(K);
  p.cta_blocks = (blocks + ranks - 1) / ranks;
  if (M <= 8) return launch<1>(p, tiles, ranks, stream);
  if (M <= 16) return launch<2>(p, tiles, ranks, stream);
  // NIBBLE_SKINNY_CLUSTER_TOKENS=32: token tiles of 32 rows beyond (an experiment switch), else of 64.
  static const bool tiles_of_32 =
      std::getenv("NIBBLE_SKINNY_CLUSTER_TOKENS") && std::atoi(std::getenv("NIBBLE_SKINNY_CLUSTER_TOKENS")) == 32;
  if (M <= 32 || tiles_of_32) return launch<4>(p, tiles, ranks, stream);
  return launch<8>(p, tiles, ranks, stream);  // token tiles of 64 (gridDim.z) beyond
}

}  // namespace nibble::cuda

// Paged attention: one CTA per (token, KV head), one warp per query head of that KV head's group.
// Keys come in tiles of 32 through shared memory (K rows padded so that lane j reading row j is
// bank-conflict free); lane j scores key j, the warp keeps an online softmax, and each lane
// accumulates its share of the head's dimensions.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "cuda/attention/attention.cuh"
#include "cuda/common/check.cuh"
#include "cuda/common/pdl.cuh"

namespace nibble::cuda {
namespace {

constexpr int TILE = 32;

__device__ __forceinline__ float bf16_to_float(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

// blockIdx.z: which of gridDim.z equal shares of the token's context this CTA covers (whole tiles).
// With one split the result goes to `out`; with several, (m, l, acc) go to `partial` for merge_kernel.
template <int DPL>  // dimensions per lane: ceil(head_dim / 32)
__global__ void paged_attention_kernel(const float* q, const uint16_t* k_cache, const uint16_t* v_cache,
                                       AttentionBatch b, uint16_t* out, float* partial) {
  extern __shared__ float smem[];
  pdl_wait();
  pdl_launch_dependents();
  const int64_t slot_index = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
  const int64_t t = b.decode_tokens ? int64_t{b.decode_tokens[slot_index]} : slot_index;  // the batch row
  const int group = static_cast<int>(b.n_heads / b.n_kv_heads);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int D = static_cast<int>(b.head_dim), k_stride = D + 2;
  float* qs = smem;                                            // [group, D]
  uint16_t* ks = reinterpret_cast<uint16_t*>(qs + group * D);  // [TILE, D + 2]
  uint16_t* vs = ks + TILE * k_stride;                         // [TILE, D]
  const int64_t head = kvh * group + warp;
  for (int c = lane; c < D; c += 32) qs[warp * D + c] = q[(t * b.n_heads + head) * D + c];

  const int64_t context = int64_t{b.positions[t]} + 1;
  const int64_t tiles = (context + TILE - 1) / TILE, chunk = (tiles + gridDim.z - 1) / gridDim.z * TILE;
  const int64_t first_key = split * chunk, n_keys = context < first_key + chunk ? context : first_key + chunk;
  const int32_t* table = b.block_tables + int64_t{b.token_seq[t]} * b.max_blocks;
  const int64_t kv_width = b.n_kv_heads * D;
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  float m = -INFINITY, l = 0.0f, acc[DPL];
#pragma unroll
  for (int i = 0; i < DPL; ++i) acc[i] = 0.0f;

  for (int64_t start = first_key; start < n_keys; start += TILE) {
    __syncthreads();  // the previous tile is consumed (and q is in place)
    const int n = static_cast<int>(n_keys - start < TILE ? n_keys - start : TILE);
    for (int e = threadIdx.x; e < n * (D / 2); e += blockDim.x) {
      const int row = e / (D / 2), c = (e % (D / 2)) * 2;
      const int64_t p = start + row;
      const int64_t slot = int64_t{table[p / b.block_size]} * b.block_size + p % b.block_size;
      const int64_t at = slot * kv_width + kvh * D + c;
      *reinterpret_cast<uint32_t*>(ks + row * k_stride + c) = *reinterpret_cast<const uint32_t*>(k_cache + at);
      *reinterpret_cast<uint32_t*>(vs + row * D + c) = *reinterpret_cast<const uint32_t*>(v_cache + at);
    }
    __syncthreads();
    float s = -INFINITY;
    if (lane < n) {
      const float* qv = qs + warp * D;
      const uint16_t* kr = ks + lane * k_stride;
      float dot = 0.0f;
      for (int c = 0; c < D; c += 2) {
        const uint32_t pair = *reinterpret_cast<const uint32_t*>(kr + c);
        dot += qv[c] * __uint_as_float(pair << 16);
        dot += qv[c + 1] * __uint_as_float(pair & 0xffff0000u);
      }
      s = dot * scale;
    }
    float tile_max = s;
    for (int o = 16; o > 0; o >>= 1) tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, o));
    const float m_new = fmaxf(m, tile_max);
    const float correction = m == -INFINITY ? 0.0f : expf(m - m_new);
    const float p = lane < n ? expf(s - m_new) : 0.0f;
    float p_sum = p;
    for (int o = 16; o > 0; o >>= 1) p_sum += __shfl_xor_sync(0xffffffffu, p_sum, o);
    l = l * correction + p_sum;
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[i] *= correction;
    for (int j = 0; j < n; ++j) {
      const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
      for (int i = 0; i < DPL; ++i) {
        const int c = lane + 32 * i;
        if (c < D) acc[i] += pj * bf16_to_float(vs[j * D + c]);
      }
    }
    m = m_new;
  }
  if (partial) {  // this split's share: its max, its sum and its unnormalized output
    float* p = partial + ((slot_index * b.n_heads + head) * gridDim.z + split) * (D + 2);
    if (lane == 0) p[0] = m, p[1] = l;
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
      const int c = lane + 32 * i;
      if (c < D) p[2 + c] = acc[i];
    }
    return;
  }
  uint16_t* o = out + (t * b.n_heads + head) * D;
#pragma unroll
  for (int i = 0; i < DPL; ++i) {
    const int c = lane + 32 * i;
    if (c < D) o[c] = __bfloat16_as_ushort(__float2bfloat16_rn(acc[i] / l));
  }
}

// One warp per (token slot, head): the softmax of all splits from their (m, l, acc).
__global__ void merge_kernel(const float* partial, int64_t rows, int64_t n_heads, const int32_t* tokens, int64_t splits,
                             int D, uint16_t* out) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const float* p = partial + row * splits * (D + 2);
  const int64_t slot = row / n_heads, out_row = (tokens ? int64_t{tokens[slot]} : slot) * n_heads + row % n_heads;
  float m = -INFINITY;
  for (int64_t s = 0; s < splits; ++s) m = fmaxf(m, p[s * (D + 2)]);
  float l = 0.0f;
  for (int64_t s = 0; s < splits; ++s) {
    const float ms = p[s * (D + 2)];
    if (ms != -INFINITY) l += p[s * (D + 2) + 1] * expf(ms - m);
  }
  for (int c = lane; c < D; c += 32) {
    float acc = 0.0f;
    for (int64_t s = 0; s < splits; ++s) {
      const float ms = p[s * (D + 2)];
      if (ms != -INFINITY) acc += p[s * (D + 2) + 2 + c] * expf(ms - m);
    }
    out[out_row * D + c] = __bfloat16_as_ushort(__float2bfloat16_rn(acc / l));
  }
}

template <int DPL>
Status launch(const float* q, const uint16_t* k, const uint16_t* v, const AttentionBatch& b, uint16_t* out,
              cudaStream_t stream, float* workspace) {
  const int group = static_cast<int>(b.n_heads / b.n_kv_heads), D = static_cast<int>(b.head_dim);
  const size_t shared = sizeof(float) * group * D + sizeof(uint16_t) * TILE * (D + 2) + sizeof(uint16_t) * TILE * D;
  const int64_t splits = b.splits;
  if (splits > 1 && !workspace) return Status::error("paged_attention: a split step needs its workspace");
  const int64_t slots = b.decode_tokens ? b.n_decode : b.tokens;
  if (slots == 0) return Status::ok();
  const dim3 grid(static_cast<unsigned>(slots), static_cast<unsigned>(b.n_kv_heads), static_cast<unsigned>(splits));
  NIB_RETURN_IF_ERROR(cuda_status(launch_pdl(paged_attention_kernel<DPL>, grid, dim3(unsigned(group * 32)), shared,
                                             stream, q, k, v, b, out, splits > 1 ? workspace : nullptr),
                                  "paged_attention"));
  if (splits == 1) return Status::ok();
  const int64_t rows = slots * b.n_heads;
  return cuda_status(launch_pdl(merge_kernel, dim3(unsigned((rows * 32 + 255) / 256)), dim3(256), 0, stream,
                                static_cast<const float*>(workspace), rows, b.n_heads, b.decode_tokens, splits, D, out),
                     "paged_attention merge");
}

}  // namespace

int64_t attention_splits(int64_t tokens, int64_t n_kv_heads, int64_t max_keys) {
  // Enough CTAs for four waves over the H200's 132 SMs (each CTA is latency-bound: more of them
  // hide more of it), each with at least two tiles of keys to walk.
  constexpr int64_t TARGET_CTAS = 528, MIN_KEYS_PER_SPLIT = 64, MAX_SPLITS = 32;
  const int64_t ctas = tokens * n_kv_heads;
  if (ctas <= 0) return 1;  // no token for the per-token kernel (a step of prefill chunks only)
  if (ctas >= TARGET_CTAS || (max_keys > 0 && max_keys <= MIN_KEYS_PER_SPLIT)) return 1;
  const int64_t by_keys = max_keys > 0 ? (max_keys + MIN_KEYS_PER_SPLIT - 1) / MIN_KEYS_PER_SPLIT : MAX_SPLITS;
  return std::max<int64_t>(1, std::min({(TARGET_CTAS + ctas - 1) / ctas, by_keys, MAX_SPLITS}));
}

Status paged_attention(const float* q, const uint16_t* k_cache, const uint16_t* v_cache, const AttentionBatch& b,
                       uint16_t* out, cudaStream_t stream, float* workspace) {
  if (b.tokens <= 0) return Status::ok();
  if (b.n_kv_heads <= 0 || b.n_heads % b.n_kv_heads != 0 || b.n_heads / b.n_kv_heads > 16)
    return Status::error("paged_attention: n_heads must be a multiple of n_kv_heads, at most 16 per KV head");
  if (b.head_dim % 2 != 0 || b.head_dim > 256 || b.head_dim <= 0)
    return Status::error("paged_attention: head_dim must be even and at most 256");
  const int dpl = static_cast<int>((b.head_dim + 31) / 32);
  if (b.splits < 1 || b.splits > 65535) return Status::error("paged_attention: splits must be in [1, 65535]");
  if (b.n_items > 0) {
    if (!b.decode_tokens) return Status::error("paged_attention: prefill items need the decode token list beside them");
    NIB_RETURN_IF_ERROR(prefill_attention(q, k_cache, v_cache, b, out, stream));
  }
  if (dpl <= 1) return launch<1>(q, k_cache, v_cache, b, out, stream, workspace);
  if (dpl <= 2) return launch<2>(q, k_cache, v_cache, b, out, stream, workspace);
  if (dpl <= 4) return launch<4>(q, k_cache, v_cache, b, out, stream, workspace);
  return launch<8>(q, k_cache, v_cache, b, out, stream, workspace);
}

}  // namespace nibble::cuda

// Decode attention in one launch (decode_attention.cuh): 4 warps a (token, KV head, split) on BF16
// mma.sync with fragments loaded straight from global memory; warps merge in shared memory, a row's
// splits (one thread-block cluster) a head a CTA through distributed shared memory.
#include "cuda/attention/decode_attention.cuh"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <string>

#include <cooperative_groups.h>

#include "cuda/common/check.cuh"
#include "cuda/attention/decode_attention_device.cuh"
#include "cuda/nvfp4/nvfp4_act_quant.cuh"
#include "cuda/common/pdl.cuh"

namespace nibble::cuda {
namespace {

using namespace decode_attention_device;

constexpr int WARPS = 4;
// Keys per CTA at least: two blocks a warp (both in flight at once, see the block loop), so contexts
// up to 128 keys need no merge.
constexpr int MIN_CHUNK = 2 * WARPS * BLOCK_KEYS;
constexpr int MAX_SPLITS = 8;  // a row's splits are one cluster: the portable size

// Stores output column d of head h (BF16) and, for static W4A4 (b.x_hat), its x̂ under the o
// projection's global scale: a 16-value block is 16 lanes of one warp. Every lane of the warp calls it.
__device__ __forceinline__ void store_output(const DecodeAttentionBatch& b, uint16_t* out, int64_t index, float value) {
  const uint16_t bits = __bfloat16_as_ushort(__float2bfloat16(value));
  out[index] = bits;
  if (!b.x_hat) return;
  const float v = __uint_as_float(uint32_t(bits) << 16);  // x̂ of the stored BF16, as the quantize kernel reads it
  float amax = fabsf(v);
  for (int offset = 1; offset < 16; offset <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
  b.x_hat[index] = uint16_t(ActBlockScale(amax, b.x_hat_global).bf16(v));
}

struct CtaShared {
  float m[WARPS][MAX_GROUP], l[WARPS][MAX_GROUP];
  float o[WARPS][MAX_GROUP][D];
  // The CTA's result, which the cluster's first CTA reads: per head m, l and o[D].
  float result_m[MAX_GROUP], result_l[MAX_GROUP];
  float result_o[MAX_GROUP][D];
};

__global__ void __launch_bounds__(WARPS * 32)
    decode_attention_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ k_cache,
                            const uint16_t* __restrict__ v_cache, const DecodeAttentionBatch b, int group,
                            float scale_log2, uint16_t* __restrict__ out) {
  __shared__ CtaShared sm;
  const int split = blockIdx.x, kv_head = blockIdx.y, t = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int splits = int(b.splits), n_kv_heads = int(b.n_kv_heads), page_size = int(b.page_size);
  // The staged step metadata predates the graph: readable before the PDL wait.
  const int ctx = b.positions[t] + 1;
  const int per_split = (ctx + splits - 1) / splits;
  const int chunk = (per_split + MIN_CHUNK - 1) / MIN_CHUNK * MIN_CHUNK;
  const int active = (ctx + chunk - 1) / chunk;
  // A short context leaves the grid's last splits empty; with more than one split they still meet
  // the cluster's barriers.
  if (active == 1 && split > 0) return;
  const int key0 = split * chunk, key_end = min(ctx, key0 + chunk);
  const int32_t* table = b.block_tables + int64_t(b.token_seq[t]) * b.max_blocks;
  const int64_t key_stride = int64_t(n_kv_heads) * D;
  const int head_offset = kv_head * D;

  // The warp's first block is read before the wait unless it holds the newest key, which the
  // kernel before this one (q/k norm, RoPE, KV store) writes.
  WarpSoftmax w;
  BlockFragments cur;
  int first = key0 + warp * BLOCK_KEYS;
  const bool early = first < key_end && first + BLOCK_KEYS < ctx;
  if (early) load_block(cur, k_cache, v_cache, table, page_size, key_stride, head_offset, first, ctx, g, c);
  pdl_wait();
  pdl_launch_dependents();
  if (first < key_end) {
    if (!early) load_block(cur, k_cache, v_cache, table, page_size, key_stride, head_offset, first, ctx, g, c);
    uint32_t qw[16];
    const uint4* q_src =
        reinterpret_cast<const uint4*>(q + (int64_t(t) * b.n_heads + int64_t(kv_head) * group + g) * D + 32 * c);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 v = g < group ? __ldcg(q_src + i) : make_uint4(0, 0, 0, 0);
      qw[4 * i] = v.x, qw[4 * i + 1] = v.y, qw[4 * i + 2] = v.z, qw[4 * i + 3] = v.w;
    }
    for (;;) {  // the next block's loads in flight while this one computes
      const int next = first + WARPS * BLOCK_KEYS;
      BlockFragments nxt;
      if (next < key_end) load_block(nxt, k_cache, v_cache, table, page_size, key_stride, head_offset, next, ctx, g, c);
      attend_block(w, cur, qw, first, ctx, scale_log2, c);
      if (next >= key_end) break;
      cur = nxt, first = next;
    }
    w.l += __shfl_xor_sync(0xFFFFFFFFu, w.l, 1);
    w.l += __shfl_xor_sync(0xFFFFFFFFu, w.l, 2);
  }

  // The warps' softmaxes meet in shared memory (a warp without a block: m = -FLT_MAX, l = 0, o = 0).
  store_softmax(w, sm.m[warp], sm.l[warp], sm.o[warp]);
  __syncthreads();
  const int d = threadIdx.x;  // 128 threads: one output column each
  const int64_t out_column = (int64_t(t) * b.n_heads + int64_t(kv_head) * group) * D + d;  // of the group's head 0
  for (int h = 0; h < group; ++h) {
    float m, l, o;
    merge_warps(sm.m, sm.l, sm.o, h, d, m, l, o);
    if (active == 1) {
      store_output(b, out, out_column + h * D, o / l);
    } else {
      if (d == 0) sm.result_m[h] = m, sm.result_l[h] = l;
      sm.result_o[h][d] = o;
    }
  }
  if (active == 1) return;
  // The cluster's CTAs share the merge, a head each (CTA r: heads r, r + active, …), every split's
  // result read from its shared memory in one round of loads; the second barrier keeps every CTA
  // (and its shared memory) alive until they have been read.
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  for (int h = split; split < active && h < group; h += active) {
    float m_r[MAX_SPLITS], l_r[MAX_SPLITS], o_r[MAX_SPLITS], m = -FLT_MAX;
#pragma unroll
    for (int r = 0; r < MAX_SPLITS; ++r) {
      const CtaShared* result = cluster.map_shared_rank(&sm, r < active ? r : split);
      m_r[r] = r < active ? result->result_m[h] : -FLT_MAX;
      l_r[r] = result->result_l[h], o_r[r] = result->result_o[h][d];
      m = fmaxf(m, m_r[r]);
    }
    float l = 0.0f, o = 0.0f;
#pragma unroll
    for (int r = 0; r < MAX_SPLITS; ++r) {
      if (r >= active) continue;
      const float weight = exp2f(m_r[r] - m);
      l += l_r[r] * weight, o += o_r[r] * weight;
    }
    store_output(b, out, out_column + h * D, o / l);
  }
  cluster.sync();
}

}  // namespace

bool decode_attention_supported(int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t page_size) {
  return head_dim == D && n_kv_heads > 0 && n_heads % n_kv_heads == 0 && n_heads / n_kv_heads <= MAX_GROUP &&
         page_size > 0 && page_size % BLOCK_KEYS == 0;
}

int64_t decode_attention_splits(int64_t tokens, int64_t n_kv_heads, int64_t sms) {
  const int64_t rows = std::max<int64_t>(1, tokens * n_kv_heads);
  return std::min<int64_t>(MAX_SPLITS, std::max<int64_t>(1, 2 * sms / rows));
}

Status decode_attention(const uint16_t* q, const uint16_t* k_cache, const uint16_t* v_cache,
                        const DecodeAttentionBatch& b, uint16_t* out, cudaStream_t stream) {
  if (!decode_attention_supported(b.n_heads, b.n_kv_heads, b.head_dim, b.page_size))
    return Status::error(
        "decode_attention: needs head_dim 128, at most 8 query heads per KV head and pages of a multiple of 16 tokens");
  if (b.tokens <= 0) return Status::ok();
  if (b.splits < 1 || b.splits > MAX_SPLITS || b.tokens > 65535 || b.n_kv_heads > 65535)
    return Status::error("decode_attention: splits must be in [1, " + std::to_string(MAX_SPLITS) +
                         "], tokens and KV heads below 65536");
  if (!q || !k_cache || !v_cache || !out || !b.token_seq || !b.positions || !b.block_tables)
    return Status::error("decode_attention: null pointer");
  const float scale_log2 = float(1.4426950408889634 / std::sqrt(double(D)));  // log2(e) / sqrt(head_dim)
  // A row's splits are one cluster (x).
  return cuda_status(
      launch_pdl_cluster(decode_attention_kernel, dim3(unsigned(b.splits), unsigned(b.n_kv_heads), unsigned(b.tokens)),
                         dim3(WARPS * 32), 0, unsigned(b.splits), stream, q, k_cache, v_cache, b,
                         int(b.n_heads / b.n_kv_heads), scale_log2, out),
      "decode_attention launch");
}

}  // namespace nibble::cuda

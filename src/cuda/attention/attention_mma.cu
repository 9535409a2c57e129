// Tensor-core attention for prefill chunks (flash-attention-2 style on mma.sync m16n8k16, BF16 in,
// fp32 accumulate). A CTA takes one item — up to 128/G consecutive tokens of one sequence — for one
// KV head; its 128 query rows are (token, query head of that KV head's group), 16 per warp. Keys
// come in tiles of 32 through shared memory, K and V both row-major (rows padded so fragment and
// ldmatrix loads are bank-conflict free; V's B fragments come from ldmatrix.trans); the next tile's
// K and V are loaded into registers with 16-byte loads while this one is computed; scores, the
// online softmax and P·V stay in registers.
#include <cuda_bf16.h>

#include <cmath>

#include "cuda/attention/attention.cuh"
#include "cuda/common/check.cuh"
#include "cuda/nvfp4/nvfp4_fragments.cuh"

namespace nibble::cuda {
namespace {

constexpr int KT = 32;    // keys per tile
constexpr int WARPS = 8;  // 16 query rows each (4 warps: pp2048 2.6% slower, H200)
constexpr int ROWS = 16 * WARPS;

// Four 8×8 BF16 matrices, transposed: lanes 8j … 8j + 7 give the row addresses of matrix j.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const uint16_t* row) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

template <int D>
__global__ void __launch_bounds__(WARPS * 32)
    prefill_attention_kernel(const float* q, const uint16_t* k_cache, const uint16_t* v_cache, AttentionBatch b,
                             uint16_t* out) {
  constexpr int KS = D / 16, NT = D / 8;                  // k-steps over the head dimension, n-tiles of the output
  constexpr int STRIDE = D + 8;                           // row stride in BF16: 16 bytes past a multiple of 128
  constexpr int CHUNKS = D / 8;                           // 16-byte chunks per key row
  constexpr int PER_THREAD = KT * CHUNKS / (WARPS * 32);  // chunks of K (and of V) each thread loads
  __shared__ __align__(16) uint16_t ks[KT * STRIDE];      // [key][dim]
  __shared__ __align__(16) uint16_t vs[KT * STRIDE];      // [key][dim]
  const int4 item = b.prefill_items[blockIdx.x];          // (sequence, first row, tokens, first position)
  const int64_t kvh = blockIdx.y;
  const int G = static_cast<int>(b.n_heads / b.n_kv_heads);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int32_t* table = b.block_tables + int64_t{item.x} * b.max_blocks;
  const int64_t kv_width = b.n_kv_heads * D;
  const float scale = 1.0f / sqrtf(static_cast<float>(D));

  // This thread's two rows (g and g + 8 of its warp): token, head, position, validity.
  int row_pos[2];
  bool row_ok[2];
  int64_t row_q[2];
  for (int h = 0; h < 2; ++h) {
    const int r = warp * 16 + g + 8 * h, token = r / G, head = r % G;
    row_ok[h] = token < item.z;
    row_pos[h] = item.w + token;
    row_q[h] = ((int64_t{item.y} + token) * b.n_heads + kvh * G + head) * D;
  }
  // Q as A fragments (rounded to BF16, as every tensor-core attention takes it).
  uint32_t qa[KS][4];
#pragma unroll
  for (int s = 0; s < KS; ++s) {
    const int c0 = s * 16 + 2 * tq, c1 = c0 + 8;
    const float* q0 = q + row_q[0];
    const float* q1 = q + row_q[1];
    qa[s][0] = row_ok[0] ? pack_bf16x2(q0[c0], q0[c0 + 1]) : 0u;
    qa[s][1] = row_ok[1] ? pack_bf16x2(q1[c0], q1[c0 + 1]) : 0u;
    qa[s][2] = row_ok[0] ? pack_bf16x2(q0[c1], q0[c1 + 1]) : 0u;
    qa[s][3] = row_ok[1] ? pack_bf16x2(q1[c1], q1[c1 + 1]) : 0u;
  }
  float o[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  const int n_keys = item.w + item.z;  // the last token's context
  // A tile's K and V rows in registers: chunk i of this thread is (key e / CHUNKS, 8 dims at e % CHUNKS).
  uint4 k_next[PER_THREAD], v_next[PER_THREAD];
  auto load_tile = [&](int start) {
#pragma unroll
    for (int i = 0; i < PER_THREAD; ++i) {
      const int e = threadIdx.x + i * WARPS * 32, p = start + e / CHUNKS;
      k_next[i] = v_next[i] = make_uint4(0, 0, 0, 0);
      if (p < n_keys) {
        const int64_t slot = int64_t{table[p / b.block_size]} * b.block_size + p % b.block_size;
        const int64_t at = slot * kv_width + kvh * D + (e % CHUNKS) * 8;
        k_next[i] = *reinterpret_cast<const uint4*>(k_cache + at);
        v_next[i] = *reinterpret_cast<const uint4*>(v_cache + at);
      }
    }
  };
  auto store_tile = [&] {
#pragma unroll
    for (int i = 0; i < PER_THREAD; ++i) {
      const int e = threadIdx.x + i * WARPS * 32, key = e / CHUNKS, c = (e % CHUNKS) * 8;
      *reinterpret_cast<uint4*>(ks + key * STRIDE + c) = k_next[i];
      *reinterpret_cast<uint4*>(vs + key * STRIDE + c) = v_next[i];
    }
  };
  load_tile(0);
  for (int start = 0; start < n_keys; start += KT) {
    __syncthreads();  // every warp is done with the previous tile
    store_tile();
    __syncthreads();
    if (start + KT < n_keys) load_tile(start + KT);  // in flight while this tile is computed
    // S = Q·Kᵀ for 4 n-tiles of 8 keys.
    float sc[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
      const uint16_t* krow = ks + (j * 8 + g) * STRIDE + 2 * tq;
#pragma unroll
      for (int s = 0; s < KS; ++s)
        mma_bf16(sc[j], qa[s], *reinterpret_cast<const uint32_t*>(krow + s * 16),
                 *reinterpret_cast<const uint32_t*>(krow + s * 16 + 8));
    }
    // Scale, causal mask, online softmax (a row's 4 threads share it through the quad).
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1, key = start + j * 8 + 2 * tq + (e & 1);
        const bool visible = row_ok[h] && key <= row_pos[h];
        sc[j][e] = visible ? sc[j][e] * scale : -INFINITY;
        tile_max[h] = fmaxf(tile_max[h], sc[j][e]);
      }
    float corr[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
      const float m_new = fmaxf(m[h], tile_max[h]);
      corr[h] = m_new == -INFINITY ? 1.0f : expf(m[h] - m_new);
      m[h] = m_new;
      l[h] *= corr[h];
    }
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1;
        const float p = m[h] == -INFINITY ? 0.0f : expf(sc[j][e] - m[h]);
        sc[j][e] = p;
        l[h] += p;
      }
#pragma unroll
    for (int n = 0; n < NT; ++n) o[n][0] *= corr[0], o[n][1] *= corr[0], o[n][2] *= corr[1], o[n][3] *= corr[1];
      // O += P·V: P's C fragments of two adjacent n-tiles make one A fragment of 16 keys; V's B
      // fragments for two output n-tiles at once (keys kk·16 + lane % 16, dims of tile n + lane / 16).
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      const uint32_t pa[4] = {pack_bf16x2(sc[2 * kk][0], sc[2 * kk][1]), pack_bf16x2(sc[2 * kk][2], sc[2 * kk][3]),
                              pack_bf16x2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                              pack_bf16x2(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
      for (int n = 0; n < NT; n += 2) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, vs + (kk * 16 + (lane & 15)) * STRIDE + (n + (lane >> 4)) * 8);
        mma_bf16(o[n], pa, vb[0], vb[1]);
        mma_bf16(o[n + 1], pa, vb[2], vb[3]);
      }
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (!row_ok[h]) continue;
    uint16_t* dst = out + row_q[h];
    const float inv = 1.0f / l[h];
#pragma unroll
    for (int n = 0; n < NT; ++n)
      *reinterpret_cast<uint32_t*>(dst + n * 8 + 2 * tq) = pack_bf16x2(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
  }
}

}  // namespace

// Any group up to 16: an item holds floor(128 / G) tokens, and the rows past tokens · G (128 mod G
// of them, e.g. 3 for ERNIE-4.5's G = 5) are masked as tokens beyond the item.
bool prefill_attention_supported(int64_t head_dim, int64_t group) {
  return (head_dim == 64 || head_dim == 128) && group >= 1 && group <= 16;
}

int64_t prefill_item_tokens(int64_t group) { return ROWS / group; }

Status prefill_attention(const float* q, const uint16_t* k_cache, const uint16_t* v_cache, const AttentionBatch& b,
                         uint16_t* out, cudaStream_t stream) {
  if (b.n_items <= 0) return Status::ok();
  const int64_t G = b.n_heads / b.n_kv_heads;
  if (!prefill_attention_supported(b.head_dim, G))
    return Status::error("prefill_attention: head_dim 64 or 128 and a query group of at most 16 only");
  const dim3 grid(static_cast<unsigned>(b.n_items), static_cast<unsigned>(b.n_kv_heads));
  if (b.head_dim == 64)
    prefill_attention_kernel<64><<<grid, WARPS * 32, 0, stream>>>(q, k_cache, v_cache, b, out);
  else
    prefill_attention_kernel<128><<<grid, WARPS * 32, 0, stream>>>(q, k_cache, v_cache, b, out);
  return cuda_status(cudaGetLastError(), "prefill_attention");
}

}  // namespace nibble::cuda

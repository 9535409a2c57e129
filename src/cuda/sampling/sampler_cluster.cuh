// The GPU sampler's cluster machinery: its shape constants, a CTA's shared scratch, and the
// deterministic reductions across the CTAs of a row's thread-block cluster (distributed shared memory,
// st.async into mbarrier-counted inboxes). Included by sampler.cu alone (its anonymous namespace).
#pragma once

#include <cooperative_groups.h>

#include <cstdint>

namespace nibble::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int CLUSTER = 8;  // CTAs a row: the portable cluster size
constexpr int THREADS = 512, WARPS = THREADS / 32;
constexpr int PROBES = 15;  // thresholds a search round: 4 bits of the 31 a round

constexpr int INBOX = PROBES + 1;  // words of a CTA's share in every CTA's inbox (an arg-max: 2)
// The short list: the top-k cut for k ≤ SHORT_K (and top-p where the top SHORT_K hold its mass) runs
// over the row's k largest candidates, found by merging lists (draw_from_short_list).
constexpr int SHORT_K = 64;
constexpr float NUCLEUS_FLOOR = 1.0f / 1024;  // top-p alone: of the best candidate's probability (1)

struct Scratch {
  uint64_t warp_keys[WARPS][SHORT_K];             // each warp's k largest candidate keys, descending
  uint64_t short_keys[SHORT_K];                   // this CTA's
  uint64_t cta_keys[CLUSTER][SHORT_K];            // every CTA's, by rank (sent by each)
  uint64_t row_keys[SHORT_K];                     // the row's
  uint64_t short_full;                            // cta_keys' mbarrier: one arrival (the expected bytes)
  double part[WARPS][PROBES];                     // each warp's share of a reduction
  __align__(16) double inbox[2][CLUSTER][INBOX];  // every CTA's share, by rank; two, alternating
  double result[INBOX];                           // a reduction's result, met by a few threads, for all
  uint64_t inbox_full[2];                         // their mbarriers: one arrival (the expected bytes)
  int64_t index_part[WARPS];
  int warp_sums[WARPS];  // block_exclusive_scan's
};

__device__ __forceinline__ uint32_t rank_address(uint32_t shared_address, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(shared_address), "r"(rank));
  return remote;
}

// A 64-bit word into shared address `slot` of every CTA of the cluster, counting its bytes on that
// CTA's mbarrier at `full` (st.async).
__device__ __forceinline__ void store_in_every_cta(uint32_t slot, uint64_t value, uint32_t full) {
  for (uint32_t q = 0; q < CLUSTER; ++q)
    asm volatile(
        "st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];\n" ::"r"(rank_address(slot, q)),
        "l"(value), "r"(rank_address(full, q))
        : "memory");
}

// Waits for the phase `phase` of this CTA's mbarrier at `full`, with acquire at cluster scope (what it
// counted was written by other CTAs; in SASS an L1 invalidation).
__device__ __forceinline__ void wait_cluster_stores(uint32_t full, uint32_t phase) {
  for (uint32_t done = 0; !done;)
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, "
        "p;\n}\n"
        : "=r"(done)
        : "r"(full), "r"(phase)
        : "memory");
}

// Reductions over every thread of the row's cluster; every thread of every CTA calls each one, and
// every thread gets the result. Order: a fixed tree within each warp, the warps in order, the CTAs in
// rank order — the same result in every CTA and every run. A CTA's share goes into every CTA's inbox
// by remote stores that count their bytes on that CTA's mbarrier (st.async), so a reduction waits
// only for the shares, with no cluster barrier (whose release is a GPU-wide MEMBAR in SASS; on the
// H200 that was a small part of a reduction's cost, docs/lab/perf-notebook.md). The inboxes alternate: a CTA's
// share of reduction k + 2 can only come once this CTA has sent its share of k + 1, which it does
// after every thread has read k's inbox.
class ClusterReducer {
 public:
  // Thread 0 has initialized the mbarriers and a cluster barrier has published them.
  __device__ ClusterReducer(Scratch& s, uint32_t rank) : s_(s), rank_(rank) {}

  // Sums (MAX: maxima) of N values. Within a warp, one or two values by a butterfly; more by a
  // reduce-scatter (each step a lane keeps half of its values and adds its partner's half: 16
  // shuffles for 16 values where a butterfly each takes 80 — a search round's 15 sums took ~5 µs
  // that way, shuffle-bound, H200). Then the warps' and the CTAs' sums, met by N threads and handed
  // to the others through shared memory.
  template <int N, bool MAX = false>
  __device__ void reduce(double (&v)[N]) {
    static_assert(N <= INBOX && N <= 16 && (!MAX || N <= 2));  // (the reduce-scatter pads with zeros: sums only)
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const auto combine = [](double a, double b) { return MAX ? fmax(a, b) : a + b; };
    if constexpr (N <= 2) {
#pragma unroll
      for (int i = 0; i < N; ++i)
        for (int o = 16; o > 0; o >>= 1) v[i] = combine(v[i], __shfl_xor_sync(0xFFFFFFFFu, v[i], o));
      if (lane == 0)
#pragma unroll
        for (int i = 0; i < N; ++i) s_.part[warp][i] = v[i];
    } else {
      double x[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) x[i] = i < N ? v[i] : 0.0;
      scatter_step<16>(x, lane, combine);  // lane bit 16 set: it keeps the upper 8 values, and so on
      scatter_step<8>(x, lane, combine);
      scatter_step<4>(x, lane, combine);
      scatter_step<2>(x, lane, combine);
      x[0] = combine(x[0], __shfl_xor_sync(0xFFFFFFFFu, x[0], 1));
      const int value = (lane >> 1) & 15;  // lanes 2j, 2j + 1 hold value j
      if ((lane & 1) == 0 && value < N) s_.part[warp][value] = x[0];
    }
    __syncthreads();
    if (int(threadIdx.x) < N) {
      double t = s_.part[0][threadIdx.x];
      for (int w = 1; w < WARPS; ++w) t = combine(t, s_.part[w][threadIdx.x]);
      send(threadIdx.x, t);
    }
    const double(*in)[INBOX] = receive(N);
    if (int(threadIdx.x) < N) {
      double t = in[0][threadIdx.x];
      for (int r = 1; r < CLUSTER; ++r) t = combine(t, in[r][threadIdx.x]);
      s_.result[threadIdx.x] = t;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = s_.result[i];
  }
  __device__ double sum(double v) {
    double a[1] = {v};
    reduce<1>(a);
    return a[0];
  }
  __device__ double max(double v) {
    double a[1] = {v};
    reduce<1, true>(a);
    return a[0];
  }

  // One reduce-scatter step: of the lane's first COUNT values it keeps the upper half (lane bit COUNT
  // set) or the lower, adding its partner's (lane ^ COUNT) copy of them; the kept ones move to the front.
  template <int COUNT, class Combine>
  __device__ static void scatter_step(double (&x)[16], int lane, Combine combine) {
    const bool upper = lane & COUNT;
#pragma unroll
    for (int i = 0; i < COUNT / 2; ++i) {
      const double received = __shfl_xor_sync(0xFFFFFFFFu, upper ? x[i] : x[i + COUNT / 2], COUNT);
      x[i] = combine(upper ? x[i + COUNT / 2] : x[i], received);
    }
  }

  // The best (score, index): the higher score, then the lower index; index -1: none. LOCAL: over
  // this CTA's threads only.
  template <bool LOCAL = false>
  __device__ int64_t argmax(double score, int64_t index) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const auto better = [](double s, int64_t k, double score, int64_t index) {
      return k >= 0 && (index < 0 || s > score || (s == score && k < index));
    };
    for (int o = 16; o > 0; o >>= 1) {
      const double s = __shfl_xor_sync(0xFFFFFFFFu, score, o);
      const int64_t k = __shfl_xor_sync(0xFFFFFFFFu, index, o);
      if (better(s, k, score, index)) score = s, index = k;
    }
    if (lane == 0) s_.part[warp][0] = score, s_.index_part[warp] = index;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < WARPS; ++w)
        if (better(s_.part[w][0], s_.index_part[w], score, index)) score = s_.part[w][0], index = s_.index_part[w];
      if constexpr (LOCAL)
        s_.index_part[0] = index;
      else
        send(0, score), send(1, __longlong_as_double(index));
    }
    if constexpr (LOCAL) {
      __syncthreads();
      index = s_.index_part[0];
      __syncthreads();
      return index;
    }
    const double(*in)[INBOX] = receive(2);
    score = -1.0, index = -1;
    for (int r = 0; r < CLUSTER; ++r)
      if (better(in[r][0], __double_as_longlong(in[r][1]), score, index))
        score = in[r][0], index = __double_as_longlong(in[r][1]);
    return index;
  }

  // The sum of `cta_value` (the same in every thread of a CTA) over the CTAs of lower rank.
  __device__ double before_this_cta(double cta_value) {
    if (threadIdx.x == 0) send(0, cta_value);
    const double(*in)[INBOX] = receive(1);
    double t = 0.0;
    for (int r = 0; r < int(rank_); ++r) t += in[r][0];
    return t;
  }

 private:
  // Word `word` of this CTA's share of the current reduction, into every CTA's inbox.
  __device__ void send(int word, double value) {
    const int box = count_ & 1;
    store_in_every_cta(smem_address(&s_.inbox[box][rank_][word]), uint64_t(__double_as_longlong(value)),
                       smem_address(&s_.inbox_full[box]));
  }
  // Waits until every CTA's `words` have arrived (thread 0 expects their bytes); the inbox by rank.
  __device__ const double (*receive(int words))[INBOX] {
    const int box = count_ & 1;
    const uint32_t phase = (count_ >> 1) & 1;
    ++count_;
    if (threadIdx.x == 0) barrier_arrive_expect_tx(&s_.inbox_full[box], uint32_t(CLUSTER * words * sizeof(double)));
    // One warp waits, and the CTA barrier passes it on to the others.
    if (threadIdx.x < 32) wait_cluster_stores(smem_address(&s_.inbox_full[box]), phase);
    __syncthreads();
    return s_.inbox[box];
  }

  Scratch& s_;
  uint32_t rank_;
  uint32_t count_ = 0;  // reductions so far: the inbox (count % 2) and its mbarrier's phase (count / 2 % 2)
};

// The CTA's slice of a row: vocabulary indices [begin, begin + n), its values w[0, n) in shared memory.
struct Slice {
  float* w;
  int64_t begin, n;
};

}  // namespace
}  // namespace nibble::cuda

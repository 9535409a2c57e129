// GPU sampler: a thread-block cluster of CLUSTER CTAs per row, CTA r holding slice r of the row's
// logits in shared memory through every pass (the row is read from global memory once). A top-k of
// at most SHORT_K (and top-p whose nucleus is among few candidates) takes the row's k largest
// candidates by merging sorted lists — the lanes', the warps', the CTAs' — and cuts them as the CPU
// does; other filters that the CPU sampler computes by sorting become threshold searches over the
// probability's float bits (order-preserving for positive floats), PROBES thresholds a round, with
// ties broken by index exactly as the CPU's (prob desc, index asc) order. Sums, maxima and arg-maxima
// meet across the cluster through distributed shared memory in rank order, so every CTA holds the
// same result and a row's draw is deterministic. (Temperature 0.7, top-k 20, top-p 0.8 took tg128 from
// 476 to 351 tok/s with one CTA a row and bisections; 473.5 against 479 greedy now; docs/lab/perf-notebook.md.)
#include <cooperative_groups.h>

#include <cmath>
#include <string>
#include <type_traits>

#include "core/philox.h"
#include "cuda/common/async_copy.cuh"
#include "cuda/common/check.cuh"
#include "cuda/common/device_context.cuh"
#include "cuda/moe/moe_routing_device.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/diagnostics/phase_stamps.cuh"
#include "cuda/sampling/sampler.cuh"
#include "cuda/sampling/sampler_cluster.cuh"

namespace nibble::cuda {
namespace {

// Phases of sample_kernel, timed with NIBBLE_DIAG_PHASE_TIMING=1 (sampler_timing).
constexpr int STAMPS = 11;
constexpr const char* STAMP_NAMES[STAMPS] = {"start",      "logprobs' log Z", "processed logits",
                                             "max, exp",   "short: lanes",    "short: warps",
                                             "short: CTA", "top-k",           "top-p",
                                             "draw",       "top logprobs"};
__device__ long long sampler_stamps[PHASE_STAMP_MAX_CTAS * STAMPS];
long long* timing_stamps() {
  static long long* stamps = phase_stamp_buffer(sampler_stamps);
  return stamps;
}

// The largest float v ≥ 0 (searched over its bits: order-preserving for v ≥ 0) for which `need` is
// met by the candidates (w > 0) at or above v: their count (MASS false) or their summed
// probability; `need` is met at v = 0 (the callers' guarantee). PROBES thresholds a round.
template <bool MASS>
__device__ float largest_threshold(const Slice& s, double need, ClusterReducer& red) {
  uint32_t lo = 0, hi = 0x7f800000u;
  while (lo < hi) {
    uint32_t probe[PROBES];  // increasing, in (lo, hi]
#pragma unroll
    for (int j = 0; j < PROBES; ++j) probe[j] = lo + uint32_t((uint64_t(hi - lo) * (j + 1) + PROBES) / (PROBES + 1));
    using Acc = std::conditional_t<MASS, double, int>;  // (counts in int: no FP64 adds)
    // Only values inside the range are compared with every probe; those above it count for all of
    // them at once (after the first rounds nearly every value is outside: a round of the top-k
    // search took ~12 µs comparing each with all 15, H200).
    Acc mine[PROBES] = {}, above_range = 0;
    for (int64_t i = threadIdx.x; i < s.n; i += THREADS) {
      const float x = s.w[i];
      const uint32_t bits = __float_as_uint(x);
      if (!(x > 0.0f) || bits < probe[0]) continue;
      if (bits > hi) {
        above_range += MASS ? Acc(x) : Acc(1);
        continue;
      }
#pragma unroll
      for (int j = 0; j < PROBES; ++j)
        if (bits >= probe[j]) mine[j] += MASS ? Acc(x) : Acc(1);
    }
    double at_least[PROBES];
#pragma unroll
    for (int j = 0; j < PROBES; ++j) at_least[j] = double(mine[j] + above_range);
    red.reduce<PROBES>(at_least);
    // Between the last probe that meets the need (monotone: the ones before it meet it too) and the
    // next one, which is larger (or hi). Unrolled selects: a probe indexed at run time would put the
    // array in local memory, read in every value's loop above (a round took ~14 µs, H200).
    uint32_t next_lo = lo, next_hi = probe[0] - 1;
#pragma unroll
    for (int j = 0; j < PROBES; ++j)
      if (at_least[j] >= need) next_lo = probe[j], next_hi = j + 1 < PROBES ? probe[j + 1] - 1 : hi;
    lo = next_lo, hi = next_hi;
  }
  return __uint_as_float(lo);
}

// Of the candidates equal to `v`, keeps the `keep` with the lowest vocabulary indices and drops the
// rest: each thread ranks a contiguous run of the slice, after the runs of lower threads and CTAs.
__device__ void keep_lowest_ties(const Slice& s, float v, int64_t keep, ClusterReducer& red, Scratch& scratch) {
  const int64_t per = (s.n + THREADS - 1) / THREADS, first = threadIdx.x * per, last = min(s.n, first + per);
  __syncthreads();  // (the values were written in the strided passes)
  int mine = 0;
  for (int64_t i = first; i < last; ++i) mine += s.w[i] == v;
  int cta_total = 0;
  const int before_thread = block_exclusive_scan<THREADS>(mine, scratch.warp_sums, &cta_total);
  int64_t rank = int64_t(red.before_this_cta(double(cta_total))) + before_thread;
  for (int64_t i = first; i < last; ++i)
    if (s.w[i] == v) s.w[i] = rank++ < keep ? v : 0.0f;
  __syncthreads();
}

// Over the candidates (w > 0): the number (or, mass, the summed probability) of those above v, and
// the number of those equal to v.
struct AboveAndTies {
  double above, ties;
};
__device__ AboveAndTies count_candidates(const Slice& s, float v, bool mass, ClusterReducer& red) {
  double t[2] = {};
  for (int64_t i = threadIdx.x; i < s.n; i += THREADS) {
    const float x = s.w[i];
    if (x > 0.0f && x > v) t[0] += mass ? double(x) : 1.0;
    if (x > 0.0f && x == v) t[1] += 1.0;
  }
  red.reduce<2>(t);
  return {t[0], t[1]};
}

// The exponential race's score of candidate t of probability p (sampling::sample_next's draw).
__device__ __forceinline__ double race_score(float p, const SamplerRow& P, int64_t t) {
  return static_cast<double>(p) / -log(philox_uniform(P.seed, P.position, static_cast<uint32_t>(t)));
}

// A candidate as one sortable word: its probability's bits (order-preserving for p > 0) over its
// index's complement, so that a larger key is the CPU's earlier candidate (probability desc, index
// asc); 0: none.
__device__ __forceinline__ uint64_t candidate_key(float p, int64_t t) {
  return uint64_t(__float_as_uint(p)) << 32 | uint32_t(~uint32_t(t));
}
__device__ __forceinline__ float key_prob(uint64_t key) { return __uint_as_float(uint32_t(key >> 32)); }
__device__ __forceinline__ int64_t key_token(uint64_t key) { return int64_t(~uint32_t(key)); }

// The largest key of the warp's lanes (keys are distinct, or 0): a redux of the probability bits,
// then one of the indices among the lanes that hold them.
__device__ __forceinline__ uint64_t warp_max_key(uint64_t key) {
  const uint32_t hi = __reduce_max_sync(0xFFFFFFFFu, uint32_t(key >> 32));
  const uint32_t lo = __reduce_max_sync(0xFFFFFFFFu, uint32_t(key >> 32) == hi ? uint32_t(key) : 0u);
  return uint64_t(hi) << 32 | lo;
}

// By one warp: out[0 .. k) = the k largest keys of the descending lists of lanes l < n_lists (at list
// + l * stride, k long, padded with 0), descending: k rounds of the lanes' heads. (Ranking every key
// by binary searches in the other lists, a thread a key, was slower on the H200: docs/lab/perf-notebook.md.)
__device__ void merge_sorted_lists(const uint64_t* list, int stride, int n_lists, int k, uint64_t* out) {
  const int lane = threadIdx.x & 31;
  int at = 0;
  uint64_t head = lane < n_lists ? list[lane * stride] : 0;
  for (int r = 0; r < k; ++r) {
    const uint64_t top = warp_max_key(head);
    if (lane == 0) out[r] = top;
    if (top != 0 && head == top) head = ++at < k ? list[lane * stride + at] : 0;
  }
}

// The lane's LANE_KEPT largest candidate keys below `below` in its strided share of the slice,
// descending (0: none). A value below the smallest kept one is passed over on its probability alone.
constexpr int LANE_KEPT = 4;
__device__ void lane_largest_keys(const Slice& s, uint64_t below, uint64_t (&kept)[LANE_KEPT]) {
#pragma unroll
  for (int j = 0; j < LANE_KEPT; ++j) kept[j] = 0;
  float floor = 0.0f;  // kept[LANE_KEPT - 1]'s probability
  for (int64_t i = threadIdx.x; i < s.n; i += THREADS) {
    const float x = s.w[i];
    if (!(x > 0.0f) || x < floor) continue;
    uint64_t key = candidate_key(x, s.begin + i);
    if (key >= below || key <= kept[LANE_KEPT - 1]) continue;
#pragma unroll
    for (int j = 0; j < LANE_KEPT; ++j)  // insertion: the larger stays, the smaller moves down
      if (key > kept[j]) {
        const uint64_t t = kept[j];
        kept[j] = key, key = t;
      }
    floor = key_prob(kept[LANE_KEPT - 1]);
  }
}

// Top-k (with_k: k = P.top_k ≤ SHORT_K; fewer than k candidates cut nothing) then top-p, and the
// draw, over the row's k largest candidates, found without a threshold search: each warp takes its k
// largest by k rounds of a warp maximum (its lanes keeping their LANE_KEPT largest in registers), one
// warp merges the warps' lists into the CTA's, and in every CTA one warp merges the CTAs' lists (sent
// to all by st.async) — the row's top k in the CPU's order, the same in every CTA. Without with_k
// (top-p alone: its nucleus among the k candidates that hold the mass) the cut must fall within
// them. Every CTA reaches the same outcome: the token, or -1 (the caller takes the long way).
// p_total: top-p alone's total, over every candidate (as the CPU's).
template <class Stamp>
__device__ int64_t draw_from_short_list(const Slice& s, const SamplerRow& P, int k, bool with_k, double p_total,
                                        ClusterReducer& red, Scratch& scratch, int rank, const Stamp& stamp) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint64_t kept[LANE_KEPT];
  lane_largest_keys(s, ~uint64_t{0}, kept);
  stamp(4);
  uint64_t* warp_list = scratch.warp_keys[warp];
  for (int r = 0; r < k; ++r) {
    const uint64_t top = warp_max_key(kept[0]);
    if (lane == 0) warp_list[r] = top;
    if (top == 0) {  // (the warp's candidates are spent: the rest of its list is 0)
      for (int j = r + 1 + lane; j < k; j += 32) warp_list[j] = 0;
      break;
    }
    if (kept[0] == top) {
#pragma unroll
      for (int j = 0; j + 1 < LANE_KEPT; ++j) kept[j] = kept[j + 1];
      kept[LANE_KEPT - 1] = 0;
      if (kept[0] == 0) lane_largest_keys(s, top, kept);  // (rare: a lane holds more than LANE_KEPT of the top k)
    }
  }
  __syncthreads();
  stamp(5);
  const uint32_t lists = smem_address(scratch.cta_keys), full = smem_address(&scratch.short_full);
  if (warp == 0) {
    merge_sorted_lists(&scratch.warp_keys[0][0], SHORT_K, WARPS, k, scratch.short_keys);
    if (lane == 0) barrier_arrive_expect_tx(&scratch.short_full, uint32_t(CLUSTER * k * sizeof(uint64_t)));
  }
  __syncthreads();
  stamp(6);
  for (int j = threadIdx.x; j < k; j += THREADS)  // this CTA's list into every CTA's row `rank`
    store_in_every_cta(lists + uint32_t((rank * SHORT_K + j) * sizeof(uint64_t)), scratch.short_keys[j], full);
  if (warp == 0) {
    wait_cluster_stores(full, 0);
    merge_sorted_lists(&scratch.cta_keys[0][0], SHORT_K, CLUSTER, k, scratch.row_keys);
  }
  __syncthreads();
  stamp(7);
  const uint64_t* key = scratch.row_keys;
  int n = 0;  // the row's candidates among them (k, or all where fewer)
  while (n < k && key[n] != 0) ++n;
  // The race's scores of all n (by the threads from warp 1 on), beside top-p's sum in thread 0.
  const int j = int(threadIdx.x) - 32;
  double score = -1.0;
  int64_t token = -1;
  if (j >= 0 && j < n) token = key_token(key[j]), score = race_score(key_prob(key[j]), P, token);
  // Top-p in the CPU's order (keep_top_p): the mass summed in turn until it reaches top_p of the total
  // (with_k: the n's); none reaching it keeps all (rounding), or (top-p alone) the long way.
  int keep = n;
  if (P.top_p < 1.0f) {
    __shared__ int kept_count;
    if (threadIdx.x == 0) {
      double total_mass = 0.0;
      if (with_k)
        for (int i = 0; i < n; ++i) total_mass += key_prob(key[i]);
      else
        total_mass = p_total;
      const double target = static_cast<double>(P.top_p) * total_mass;
      double mass = 0.0;
      kept_count = with_k ? n : -1;
      for (int i = 0; i < n; ++i)
        if ((mass += key_prob(key[i])) >= target) {
          kept_count = i + 1;
          break;
        }
    }
    __syncthreads();
    keep = kept_count;
    __syncthreads();
    if (keep < 0) return -1;  // (the same in every CTA)
  }
  stamp(8);
  if (j >= keep) score = -1.0, token = -1;
  return red.argmax<true>(score, token);
}

// Top-k (cut_k) then top-p, and the draw, by threshold searches over the whole row: ties at a cut
// kept in index order across the CTAs.
// p_total: top-p alone's total where known already (else < 0).
template <class Stamp>
__device__ int64_t draw_the_long_way(const Slice& s, const SamplerRow& P, bool cut_k, double p_total,
                                     ClusterReducer& red, Scratch& scratch, const Stamp& stamp) {
  stamp(4), stamp(5), stamp(6);
  float* w = s.w;
  if (cut_k) {
    const float vk = largest_threshold<false>(s, double(P.top_k), red);
    const double above = count_candidates(s, vk, false, red).above;
    for (int64_t i = threadIdx.x; i < s.n; i += THREADS)
      if (w[i] < vk) w[i] = 0.0f;
    keep_lowest_ties(s, vk, P.top_k - int64_t(above), red, scratch);
  }
  stamp(7);
  if (P.top_p < 1.0f) {
    const double total = !cut_k && p_total >= 0.0 ? p_total : count_candidates(s, 0.0f, true, red).above;
    const double target = static_cast<double>(P.top_p) * total;
    const float vp = largest_threshold<true>(s, target, red);
    const auto [above, ties] = count_candidates(s, vp, true, red);
    if (vp > 0.0f) {  // (0: rounding kept the mass below the target at every cut; every candidate stays)
      // Ties at the cut join in index order until the mass reaches the target.
      int64_t keep = static_cast<int64_t>(ceil((target - above) / static_cast<double>(vp)));
      keep = keep < 1 ? 1 : keep > int64_t(ties) ? int64_t(ties) : keep;
      for (int64_t i = threadIdx.x; i < s.n; i += THREADS)
        if (w[i] < vp) w[i] = 0.0f;
      keep_lowest_ties(s, vp, keep, red, scratch);
    }
  }
  stamp(8);
  double best = -1.0;
  int64_t at = -1;
  for (int64_t i = threadIdx.x; i < s.n; i += THREADS) {
    if (!(w[i] > 0.0f)) continue;
    const int64_t t = s.begin + i;
    const double score = race_score(w[i], P, t);
    if (at < 0 || score > best) best = score, at = t;
  }
  return red.argmax(best, at);
}

__global__ void __launch_bounds__(THREADS, 1) sample_kernel(SamplerBatch b, int64_t per, long long* stamps) {
  extern __shared__ float w[];  // the slice [per], then the two token sets of the slice (bits)
  __shared__ Scratch scratch;
  const auto stamp = [&](int phase) {
    phase_stamp(blockIdx.x < PHASE_STAMP_MAX_CTAS ? stamps : nullptr, STAMPS, phase);
  };
  stamp(0);
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank());
  if (threadIdx.x == 0) {
    barrier_init(&scratch.inbox_full[0], 1), barrier_init(&scratch.inbox_full[1], 1),
        barrier_init(&scratch.short_full, 1);
    fence_barrier_init();
  }
  cluster.sync();  // every CTA's inbox mbarriers initialized before any share is sent
  ClusterReducer red(scratch, uint32_t(rank));
  pdl_wait();
  const int64_t row = blockIdx.x / CLUSTER, V = b.vocab;
  const int64_t begin = min(V, rank * per), end = min(V, begin + per);
  const Slice s{w, begin, end - begin};
  const SamplerRow P = b.params[row];
  const float* raw = b.logits + row * V;                      // the whole row (indexed by vocabulary index)
  uint32_t* seen_all = reinterpret_cast<uint32_t*>(w + per);  // prompt ∪ output
  uint32_t* seen_out = seen_all + per / 32;                   // output
  // Pending ids become the tokens they stand for; CTA 0 also writes them back into the row's lists
  // (the others may read either form: the same token).
  const auto resolve = [&](int32_t t) { return t < 0 && b.drawn ? b.drawn[-1 - t] : t; };
  if (rank == 0 && b.drawn) {
    for (int k = threadIdx.x; k < P.prompt_len + P.output_len; k += THREADS)
      if (int32_t& t = b.tokens[P.prompt_offset + k]; t < 0) t = resolve(t);
    for (int k = threadIdx.x; k < P.masked_len; k += THREADS)
      if (int32_t& t = b.tokens[P.masked_offset + k]; t < 0) t = resolve(t);
  }
  const auto in_slice = [&](int32_t t) { return t >= begin && t < end; };

  // Raw-distribution logprobs (sampling::sample_next: max, then Σ exp in double), when asked for.
  float log_z = 0.0f;
  if (P.logprobs >= 0) {
    float raw_max = -INFINITY;
    for (int64_t t = begin + threadIdx.x; t < end; t += THREADS) raw_max = fmaxf(raw_max, raw[t]);
    raw_max = float(red.max(raw_max));
    double z = 0.0;
    for (int64_t t = begin + threadIdx.x; t < end; t += THREADS) z += exp(double(raw[t] - raw_max));
    log_z = raw_max + float(log(red.sum(z)));
  }
  stamp(1);

  // Processed logits: mask, logit_bias, repetition (prompt ∪ output), presence and frequency (output).
  // Greedy rows without any of them take the argmax of the raw logits (no copy).
  const bool greedy = P.temperature < 1e-5f;
  const bool plain = P.masked_len == 0 && P.mask_row < 0 && P.bias_len == 0 && P.repetition_penalty == 1.0f &&
                     P.presence_penalty == 0.0f && P.frequency_penalty == 0.0f;
  const bool scoring = P.score_token >= 0;  // a prompt position: only the logprobs below
  const bool staged = !(greedy && plain) && !scoring;
  if (staged) {
    for (int64_t i = threadIdx.x; i < s.n; i += THREADS) w[i] = raw[begin + i];
    for (int64_t k = threadIdx.x; k < 2 * (per / 32); k += THREADS) seen_all[k] = 0;
    __syncthreads();
    const int32_t* mask = b.tokens + P.masked_offset;
    for (int k = threadIdx.x; k < P.masked_len; k += THREADS)
      if (const int32_t t = resolve(mask[k]); in_slice(t)) w[t - begin] = -INFINITY;
    if (P.mask_row >= 0) {  // structured output: tokens outside the grammar's mask
      const uint32_t* allowed = b.allowed + P.mask_row * b.mask_words;
      for (int64_t i = threadIdx.x; i < s.n; i += THREADS) {
        const int64_t t = begin + i;
        if (!(allowed[t >> 5] >> (t & 31) & 1u)) w[i] = -INFINITY;
      }
    }
    __syncthreads();
    if (P.bias_len > 0) {  // after the mask (a masked token stays -inf), before the penalties; distinct tokens
      for (int k = threadIdx.x; k < P.bias_len; k += THREADS)
        if (const int32_t t = b.tokens[P.bias_offset + k]; in_slice(t))
          w[t - begin] += b.bias_values[P.bias_offset + k];
      __syncthreads();
    }
    const int32_t* prompt = b.tokens + P.prompt_offset;
    const int32_t* output = prompt + P.prompt_len;
    if (P.repetition_penalty != 1.0f) {
      for (int k = threadIdx.x; k < P.prompt_len + P.output_len; k += THREADS)
        if (const int32_t t = resolve(prompt[k]); in_slice(t))
          atomicOr(&seen_all[(t - begin) >> 5], 1u << ((t - begin) & 31));
      __syncthreads();
      for (int64_t i = threadIdx.x; i < s.n; i += THREADS)
        if (seen_all[i >> 5] >> (i & 31) & 1u)
          w[i] = w[i] > 0 ? w[i] / P.repetition_penalty : w[i] * P.repetition_penalty;
      __syncthreads();
    }
    if (P.presence_penalty != 0.0f || P.frequency_penalty != 0.0f) {
      for (int k = threadIdx.x; k < P.output_len; k += THREADS) {
        const int32_t t = resolve(output[k]);
        if (!in_slice(t)) continue;
        const uint32_t bit = 1u << ((t - begin) & 31);
        if (atomicOr(&seen_out[(t - begin) >> 5], bit) & bit) continue;  // another thread owns t
        int n = 0;
        for (int j = 0; j < P.output_len; ++j) n += resolve(output[j]) == t;
        w[t - begin] -= P.frequency_penalty * static_cast<float>(n) + P.presence_penalty;
      }
      __syncthreads();
    }
  }

  stamp(2);
  int64_t token;
  if (scoring) {
    token = P.score_token;
  } else if (greedy) {
    float best = -INFINITY;
    int64_t at = -1;
    for (int64_t i = threadIdx.x; i < s.n; i += THREADS) {
      const float x = staged ? w[i] : raw[begin + i];
      if (at < 0 || x > best) best = x, at = begin + i;
    }
    token = red.argmax(best, at);
  } else {
    const float inv_t = 1.0f / P.temperature;
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < s.n; i += THREADS) m = fmaxf(m, w[i] *= inv_t);
    m = float(red.max(m));
    if (m == -INFINITY) {
      token = 0;  // everything masked: the CPU's argmax of all -inf
    } else {
      // w becomes the candidates' unnormalized probabilities (0: not a candidate).
      for (int64_t i = threadIdx.x; i < s.n; i += THREADS) {
        const float p = expf(w[i] - m);
        w[i] = p > 0.0f && p >= P.min_p ? p : 0.0f;
      }
      stamp(3);
      // Top-k of at most SHORT_K: the short list, whose length also says whether there are more
      // candidates than k (else nothing is cut, as the CPU's). Only a larger top-k counts them first.
      const bool small_k = P.top_k > 0 && P.top_k <= SHORT_K;
      const bool cut_k = small_k || (P.top_k > 0 && P.top_k < count_candidates(s, 0.0f, false, red).above);
      token = -1;
      double p_total = -1.0;
      int nucleus = 0;  // top-p alone: the candidates within NUCLEUS_FLOOR of the best
      bool short_list = small_k;
      if (!cut_k && P.top_p < 1.0f) {
        // Top-p alone: the short list where the candidates within NUCLEUS_FLOOR of the best are few
        // enough and hold the mass (the cut then falls among them), with the total the cut needs.
        double t[3] = {};
        for (int64_t i = threadIdx.x; i < s.n; i += THREADS)
          if (const float x = w[i]; x > 0.0f) {
            t[0] += double(x);
            if (x >= NUCLEUS_FLOOR) t[1] += 1.0, t[2] += double(x);
          }
        red.reduce<3>(t);
        p_total = t[0];
        short_list = t[1] <= SHORT_K && t[2] >= static_cast<double>(P.top_p) * p_total;
        nucleus = int(t[1]);
      }
      if (short_list)
        token = draw_from_short_list(s, P, small_k ? P.top_k : nucleus, small_k, p_total, red, scratch, rank, stamp);
      if (token < 0) token = draw_the_long_way(s, P, cut_k, p_total, red, scratch, stamp);
    }
  }
  stamp(9);
  if (rank == 0 && threadIdx.x == 0) {
    b.out_tokens[row] = static_cast<int32_t>(token);
    b.out_logprobs[row] = P.logprobs >= 0 ? raw[token] - log_z : 0.0f;
  }
  // The top logprobs: k rounds of argmax below the previous pick in (logit desc, index asc) order.
  float prev_value = INFINITY;
  int64_t prev_index = -1;
  for (int k = 0; k < P.logprobs && k < MAX_TOP_LOGPROBS && k < V; ++k) {
    float best = -INFINITY;
    int64_t at = -1;
    for (int64_t t = begin + threadIdx.x; t < end; t += THREADS) {
      const float l = raw[t];
      const bool below = l < prev_value || (l == prev_value && t > prev_index);
      if (below && (at < 0 || l > best)) best = l, at = t;
    }
    const int64_t pick = red.argmax(best, at);
    if (rank == 0 && threadIdx.x == 0) {
      b.out_top_tokens[row * MAX_TOP_LOGPROBS + k] = static_cast<int32_t>(pick);
      b.out_top_logprobs[row * MAX_TOP_LOGPROBS + k] = raw[pick] - log_z;
    }
    prev_value = raw[pick];
    prev_index = pick;
  }
  stamp(10);
  cluster.sync();  // no CTA leaves while another's stores into its inbox may be in flight
}

// A row's slice of the vocabulary (whole words of its token sets) and its shared memory.
int64_t slice_tokens(int64_t vocab) { return ((vocab + CLUSTER - 1) / CLUSTER + 31) / 32 * 32; }
size_t slice_smem(int64_t per) { return size_t(per) * sizeof(float) + 2 * size_t(per / 32) * sizeof(uint32_t); }

}  // namespace

Status prepare_sampler(int64_t vocab) {
  if (vocab <= 0 || vocab > (int64_t{1} << 31)) return Status::error("sample_rows: bad vocabulary size");
  const size_t smem = slice_smem(slice_tokens(vocab));
  // The slice's shared memory, opted into once for the largest vocabulary seen (the default leaves
  // 48 KB less the kernel's static arrays); the attribute calls load the kernel.
  static size_t opted = 0;
  if (smem <= opted) return Status::ok();
  const int optin = device_limits().smem_optin;
  if (smem + sizeof(Scratch) > size_t(optin))
    return Status::error("sample_rows: a vocabulary of " + std::to_string(vocab) + " needs " +
                         std::to_string((smem + sizeof(Scratch)) / 1024) + " KB of shared memory a CTA (" +
                         std::to_string(CLUSTER) + " a row); this GPU has " + std::to_string(optin / 1024));
  cudaFuncAttributes attributes{};
  NIB_RETURN_IF_ERROR(
      cuda_status(cudaFuncGetAttributes(&attributes, sample_kernel), "sample_rows: loading the kernel"));
  NIB_RETURN_IF_ERROR(
      cuda_status(cudaFuncSetAttribute(sample_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
                  "sample_rows: shared memory attribute"));
  opted = smem;
  return Status::ok();
}

Status sample_rows(const SamplerBatch& batch, cudaStream_t stream) {
  if (batch.rows <= 0) return Status::ok();
  NIB_RETURN_IF_ERROR(prepare_sampler(batch.vocab));
  const int64_t per = slice_tokens(batch.vocab);
  return cuda_status(launch_pdl_cluster(sample_kernel, dim3(unsigned(batch.rows * CLUSTER)), dim3(THREADS),
                                        slice_smem(per), CLUSTER, stream, batch, per, timing_stamps()),
                     "sample_rows");
}

std::string sampler_timing(int64_t rows) {
  return phase_report("sampler", timing_stamps(), int(std::min<int64_t>(rows * CLUSTER, PHASE_STAMP_MAX_CTAS)), STAMPS,
                      STAMP_NAMES);
}

}  // namespace nibble::cuda

// GPU sampler: one 1024-thread CTA per row. Filters that the CPU sampler computes by sorting
// (top_k, top_p) become threshold searches over the probability's float bits (order-preserving for
// positive floats), with ties broken by index exactly as the CPU's (prob desc, index asc) order.
#include <cmath>

#include "core/philox.h"
#include "cuda/check.cuh"
#include "cuda/sampler.cuh"

namespace nibble::cuda {
namespace {

constexpr int THREADS = 1024;

struct Reducer {  // block-wide reductions through shared memory; every thread gets the result
  double* d;
  int64_t* i;
  __device__ double sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) d[threadIdx.x >> 5] = v;
    __syncthreads();
    double total = 0;
    for (int w = 0; w < THREADS / 32; ++w) total += d[w];
    return total;
  }
  __device__ int64_t count(int64_t v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) i[threadIdx.x >> 5] = v;
    __syncthreads();
    int64_t total = 0;
    for (int w = 0; w < THREADS / 32; ++w) total += i[w];
    return total;
  }
  // The best (score, index): higher score, then lower index. Empty threads pass index -1.
  __device__ int64_t argmax(double score, int64_t index) {
    for (int o = 16; o > 0; o >>= 1) {
      const double s = __shfl_xor_sync(0xffffffffu, score, o);
      const int64_t k = __shfl_xor_sync(0xffffffffu, index, o);
      if (k >= 0 && (index < 0 || s > score || (s == score && k < index))) score = s, index = k;
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) d[threadIdx.x >> 5] = score, i[threadIdx.x >> 5] = index;
    __syncthreads();
    double best = 0;
    int64_t at = -1;
    for (int w = 0; w < THREADS / 32; ++w)
      if (i[w] >= 0 && (at < 0 || d[w] > best || (d[w] == best && i[w] < at))) best = d[w], at = i[w];
    return at;
  }
};

// Keeps only candidates (work[t] > 0) at or above the value found by `enough(v)`, the largest
// float v > 0 for which enough(v) holds; returns it.
template <class Enough>
__device__ float largest_value_that(Enough enough) {
  uint32_t lo = 0, hi = 0x7f800000u;  // bit patterns of positive floats: order-preserving
  while (lo < hi) {  // largest bits with enough(value(bits))
    const uint32_t mid = lo + (hi - lo + 1) / 2;
    if (enough(__uint_as_float(mid))) lo = mid;
    else hi = mid - 1;
  }
  return __uint_as_float(lo);
}

// Of the candidates equal to `v`, keeps the `keep` with the lowest indices, drops the rest.
__device__ void keep_lowest_ties(float* p, int64_t V, float v, int64_t keep, int64_t* shared_prefix) {
  const int64_t per = (V + THREADS - 1) / THREADS, begin = threadIdx.x * per, end = V < begin + per ? V : begin + per;
  int64_t mine = 0;
  for (int64_t t = begin; t < end; ++t) mine += p[t] == v;
  // exclusive prefix over threads, in thread (= index) order
  __syncthreads();
  shared_prefix[threadIdx.x] = mine;
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t run = 0;
    for (int k = 0; k < THREADS; ++k) {
      const int64_t c = shared_prefix[k];
      shared_prefix[k] = run;
      run += c;
    }
  }
  __syncthreads();
  int64_t rank = shared_prefix[threadIdx.x];
  for (int64_t t = begin; t < end; ++t)
    if (p[t] == v) p[t] = rank++ < keep ? v : 0.0f;
  __syncthreads();
}

__global__ void __launch_bounds__(THREADS) sample_kernel(SamplerBatch b) {
  __shared__ double red_d[THREADS / 32];
  __shared__ int64_t red_i[THREADS / 32];
  __shared__ int64_t prefix[THREADS];
  Reducer r{red_d, red_i};
  const int64_t row = blockIdx.x, V = b.vocab;
  const SamplerRow P = b.params[row];
  const float* raw = b.logits + row * V;
  float* w = b.work + row * V;
  const int64_t words = (V + 31) / 32;
  uint32_t* seen_all = b.seen + row * 2 * words;  // prompt ∪ output
  uint32_t* seen_out = seen_all + words;          // output

  // Raw-distribution logprobs (sampling::sample_next: max, then Σ exp in double), when asked for.
  float log_z = 0.0f;
  if (P.logprobs >= 0) {
    float raw_max = -INFINITY;
    for (int64_t t = threadIdx.x; t < V; t += THREADS) raw_max = fmaxf(raw_max, raw[t]);
    double m = raw_max;
    for (int o = 16; o > 0; o >>= 1) m = fmax(m, __shfl_xor_sync(0xffffffffu, m, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red_d[threadIdx.x >> 5] = m;
    __syncthreads();
    m = -INFINITY;
    for (int k = 0; k < THREADS / 32; ++k) m = fmax(m, red_d[k]);
    raw_max = static_cast<float>(m);
    double z = 0;
    for (int64_t t = threadIdx.x; t < V; t += THREADS) z += exp(static_cast<double>(raw[t] - raw_max));
    log_z = raw_max + static_cast<float>(log(r.sum(z)));
  }

  // Processed logits: mask, logit_bias, repetition (prompt ∪ output), presence and frequency (output). Greedy
  // rows without any of them take the argmax of the raw logits (no copy).
  const bool greedy = P.temperature < 1e-5f;
  const bool plain = P.masked_len == 0 && P.bias_len == 0 && P.repetition_penalty == 1.0f &&
                     P.presence_penalty == 0.0f && P.frequency_penalty == 0.0f;
  const float* processed = greedy && plain ? raw : w;
  if (processed == w)
    for (int64_t t = threadIdx.x; t < V; t += THREADS) w[t] = raw[t];
  for (int64_t k = threadIdx.x; k < 2 * words; k += THREADS) seen_all[k] = 0;
  // The row's own lists (disjoint from other rows'): pending ids become the tokens they stand for.
  if (b.drawn) {
    for (int k = threadIdx.x; k < P.prompt_len + P.output_len; k += THREADS)
      if (int32_t& t = b.tokens[P.prompt_offset + k]; t < 0) t = b.drawn[-1 - t];
    for (int k = threadIdx.x; k < P.masked_len; k += THREADS)
      if (int32_t& t = b.tokens[P.masked_offset + k]; t < 0) t = b.drawn[-1 - t];
  }
  __syncthreads();
  const int32_t* mask = b.tokens + P.masked_offset;
  for (int k = threadIdx.x; k < P.masked_len; k += THREADS)
    if (mask[k] >= 0 && mask[k] < V) w[mask[k]] = -INFINITY;
  const int32_t* prompt = b.tokens + P.prompt_offset;
  const int32_t* output = prompt + P.prompt_len;
  const int n_all = P.prompt_len + P.output_len;
  __syncthreads();
  if (P.bias_len > 0) {  // after the mask (a masked token stays -inf), before the penalties; distinct tokens
    for (int k = threadIdx.x; k < P.bias_len; k += THREADS)
      if (const int32_t t = b.tokens[P.bias_offset + k]; t >= 0 && t < V) w[t] += b.bias_values[P.bias_offset + k];
    __syncthreads();
  }
  if (P.repetition_penalty != 1.0f) {
    for (int k = threadIdx.x; k < n_all; k += THREADS) {
      const int32_t t = prompt[k];
      if (t >= 0 && t < V) atomicOr(&seen_all[t >> 5], 1u << (t & 31));
    }
    __syncthreads();
    for (int64_t t = threadIdx.x; t < V; t += THREADS)
      if (seen_all[t >> 5] >> (t & 31) & 1u) w[t] = w[t] > 0 ? w[t] / P.repetition_penalty : w[t] * P.repetition_penalty;
    __syncthreads();
  }
  if (P.presence_penalty != 0.0f || P.frequency_penalty != 0.0f) {
    for (int k = threadIdx.x; k < P.output_len; k += THREADS) {
      const int32_t t = output[k];
      if (t < 0 || t >= V) continue;
      if (atomicOr(&seen_out[t >> 5], 1u << (t & 31)) >> (t & 31) & 1u) continue;  // another thread owns t
      int n = 0;
      for (int j = 0; j < P.output_len; ++j) n += output[j] == t;
      w[t] -= P.frequency_penalty * static_cast<float>(n) + P.presence_penalty;
    }
    __syncthreads();
  }

  int64_t token;
  if (greedy) {
    float best = -INFINITY;
    int64_t at = -1;
    for (int64_t t = threadIdx.x; t < V; t += THREADS)
      if (at < 0 || processed[t] > best) best = processed[t], at = t;
    token = r.argmax(best, at);
  } else {
    const float inv_t = 1.0f / P.temperature;
    float m = -INFINITY;
    for (int64_t t = threadIdx.x; t < V; t += THREADS) m = fmaxf(m, w[t] *= inv_t);
    {
      double mm = m;
      for (int o = 16; o > 0; o >>= 1) mm = fmax(mm, __shfl_xor_sync(0xffffffffu, mm, o));
      __syncthreads();
      if ((threadIdx.x & 31) == 0) red_d[threadIdx.x >> 5] = mm;
      __syncthreads();
      mm = -INFINITY;
      for (int k = 0; k < THREADS / 32; ++k) mm = fmax(mm, red_d[k]);
      m = static_cast<float>(mm);
    }
    if (m == -INFINITY) {
      token = 0;  // everything masked: the CPU's argmax of all -inf
    } else {
      // w becomes the candidates' unnormalized probabilities (0: not a candidate).
      for (int64_t t = threadIdx.x; t < V; t += THREADS) {
        const float p = expf(w[t] - m);
        w[t] = p > 0.0f && p >= P.min_p ? p : 0.0f;
      }
      __syncthreads();
      auto count_at_least = [&](float v) {
        int64_t c = 0;
        for (int64_t t = threadIdx.x; t < V; t += THREADS) c += w[t] >= v && w[t] > 0.0f;
        return r.count(c);
      };
      const int64_t n_cand = count_at_least(__uint_as_float(1u));  // every positive probability
      if (P.top_k > 0 && P.top_k < n_cand) {
        const float vk = largest_value_that([&](float v) { return count_at_least(v) >= P.top_k; });
        int64_t above = 0;
        for (int64_t t = threadIdx.x; t < V; t += THREADS) above += w[t] > vk;
        above = r.count(above);
        for (int64_t t = threadIdx.x; t < V; t += THREADS)
          if (w[t] < vk) w[t] = 0.0f;
        __syncthreads();
        keep_lowest_ties(w, V, vk, P.top_k - above, prefix);
      }
      if (P.top_p < 1.0f) {
        auto mass_at_least = [&](float v) {
          double s = 0;
          for (int64_t t = threadIdx.x; t < V; t += THREADS)
            if (w[t] >= v && w[t] > 0.0f) s += w[t];
          return r.sum(s);
        };
        const double total = mass_at_least(__uint_as_float(1u));
        const double target = static_cast<double>(P.top_p) * total;
        const float vp = largest_value_that([&](float v) { return mass_at_least(v) >= target; });
        double above = 0;
        int64_t ties = 0;
        for (int64_t t = threadIdx.x; t < V; t += THREADS) {
          if (w[t] > vp) above += w[t];
          ties += w[t] == vp;
        }
        above = r.sum(above);
        ties = r.count(ties);
        // Ties at the cut join in index order until the mass reaches the target.
        int64_t keep = ties;
        if (vp > 0.0f) {
          keep = static_cast<int64_t>(ceil((target - above) / static_cast<double>(vp)));
          keep = keep < 1 ? 1 : keep > ties ? ties : keep;
        }
        for (int64_t t = threadIdx.x; t < V; t += THREADS)
          if (w[t] < vp) w[t] = 0.0f;
        __syncthreads();
        keep_lowest_ties(w, V, vp, keep, prefix);
      }
      double best = -1.0;
      int64_t at = -1;
      for (int64_t t = threadIdx.x; t < V; t += THREADS) {
        if (!(w[t] > 0.0f)) continue;
        const double score = static_cast<double>(w[t]) / -log(philox_uniform(P.seed, P.position, static_cast<uint32_t>(t)));
        if (at < 0 || score > best) best = score, at = t;
      }
      token = r.argmax(best, at);
    }
  }
  if (threadIdx.x == 0) {
    b.out_tokens[row] = static_cast<int32_t>(token);
    b.out_logprobs[row] = P.logprobs >= 0 ? raw[token] - log_z : 0.0f;
  }
  // The top logprobs: k rounds of argmax below the previous pick in (logit desc, index asc) order.
  float prev_value = INFINITY;
  int64_t prev_index = -1;
  for (int k = 0; k < P.logprobs && k < MAX_TOP_LOGPROBS && k < V; ++k) {
    float best = -INFINITY;
    int64_t at = -1;
    for (int64_t t = threadIdx.x; t < V; t += THREADS) {
      const float l = raw[t];
      const bool below = l < prev_value || (l == prev_value && t > prev_index);
      if (below && (at < 0 || l > best)) best = l, at = t;
    }
    const int64_t pick = r.argmax(best, at);
    if (threadIdx.x == 0) {
      b.out_top_tokens[row * MAX_TOP_LOGPROBS + k] = static_cast<int32_t>(pick);
      b.out_top_logprobs[row * MAX_TOP_LOGPROBS + k] = raw[pick] - log_z;
    }
    prev_value = raw[pick];
    prev_index = pick;
  }
}

}  // namespace

Status sample_rows(const SamplerBatch& batch, cudaStream_t stream) {
  if (batch.rows <= 0) return Status::ok();
  if (batch.vocab <= 0 || batch.vocab > (int64_t{1} << 31)) return Status::error("sample_rows: bad vocabulary size");
  sample_kernel<<<static_cast<unsigned>(batch.rows), THREADS, 0, stream>>>(batch);
  return cuda_status(cudaGetLastError(), "sample_rows");
}

}  // namespace nibble::cuda

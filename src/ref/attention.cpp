// Reference paged attention: one (token, head) pair at a time, keys visited in position order.
#include "ref/attention.h"

#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "formats/bf16.h"
#include "formats/e4m3.h"
#include "ref/dot.h"

namespace nibble::ref {
namespace {

int64_t slot_of(const PagedKvLayer& kv, const AttentionSequence& seq, int64_t position) {
  return static_cast<int64_t>(seq.block_table[position / kv.block_size]) * kv.block_size + position % kv.block_size;
}

}  // namespace

float kv_round(float x, KvRounding rounding, float scale) {
  switch (rounding) {
    case KvRounding::BF16:
      return formats::bf16_round(x);
    case KvRounding::FP8:
      return formats::e4m3_decode(formats::e4m3_encode(x / scale)) * scale;  // exact at scale 1
    case KvRounding::NONE:
      break;
  }
  return x;
}

void kv_store(const PagedKvLayer& kv, const AttentionSequence& seq, const float* k, const float* v) {
  const int64_t width = kv.n_kv_heads * kv.head_dim;
  for (int64_t i = 0; i < seq.n_tokens; ++i) {
    const int64_t slot = slot_of(kv, seq, seq.start_position + i);
    for (int64_t j = 0; j < width; ++j) {
      kv.k[slot * width + j] = kv_round(k[i * width + j], kv.rounding, kv.k_scale);
      kv.v[slot * width + j] = kv_round(v[i * width + j], kv.rounding, kv.v_scale);
    }
  }
}

void paged_attention(const float* q, int64_t n_heads, const PagedKvLayer& kv, const AttentionSequence* seqs,
                     int64_t n_seqs, float* out) {
  const int64_t d = kv.head_dim, width = kv.n_kv_heads * d, group = n_heads / kv.n_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<std::pair<int64_t, int64_t>> work;  // (sequence, token within it)
  for (int64_t s = 0; s < n_seqs; ++s)
    for (int64_t i = 0; i < seqs[s].n_tokens; ++i) work.emplace_back(s, i);
  parallel_for(work.size() * static_cast<size_t>(n_heads), [&](size_t item) {
    const auto [s, i] = work[item / n_heads];
    const int64_t h = static_cast<int64_t>(item % n_heads), kvh = h / group;
    const AttentionSequence& seq = seqs[s];
    const int64_t row = seq.token_offset + i, n_keys = seq.start_position + i + 1;  // causal
    const float* qv = q + (row * n_heads + h) * d;
    std::vector<float> scores(n_keys);
    float max_score = -INFINITY;
    for (int64_t j = 0; j < n_keys; ++j) {
      const float* kr = kv.k + slot_of(kv, seq, j) * width + kvh * d;
      scores[j] = dot(qv, kr, d) * scale;
      max_score = std::max(max_score, scores[j]);
    }
    float sum = 0.0f;
    for (float& sc : scores) sum += (sc = std::exp(sc - max_score));
    float* o = out + (row * n_heads + h) * d;
    for (int64_t c = 0; c < d; ++c) o[c] = 0.0f;
    for (int64_t j = 0; j < n_keys; ++j) {
      const float* vr = kv.v + slot_of(kv, seq, j) * width + kvh * d;
      const float p = scores[j] / sum;
      for (int64_t c = 0; c < d; ++c) o[c] += p * vr[c];
    }
  });
}

}  // namespace nibble::ref

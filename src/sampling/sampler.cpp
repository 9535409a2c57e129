// The sampler: logits processing in vLLM's order (vllm/v1/sample/sampler.py), candidates kept as
// an index list so top-p sorts only what it must (the top 1024 first, everything if they hold too
// little mass), and the exponential race over the candidates (vLLM's random_sample draws q ~ Exp(1)
// and takes argmax p / q the same way).
#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>

#include "core/philox.h"

namespace nibble::sampling {
namespace {

constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

void apply_penalties(std::vector<float>& logits, const SamplingParams& p, const SequenceContext& c) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  auto in_vocab = [vocab](int32_t t) { return t >= 0 && t < vocab; };
  if (p.repetition_penalty != 1.0f) {
    std::vector<uint8_t> seen(logits.size(), 0);
    for (int32_t t : c.prompt)
      if (in_vocab(t)) seen[t] = 1;
    for (int32_t t : c.output)
      if (in_vocab(t)) seen[t] = 1;
    for (size_t t = 0; t < logits.size(); ++t)
      if (seen[t]) logits[t] = logits[t] > 0 ? logits[t] / p.repetition_penalty : logits[t] * p.repetition_penalty;
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int32_t> counts;
    for (int32_t t : c.output)
      if (in_vocab(t)) ++counts[t];
    for (const auto& [t, n] : counts) logits[t] -= p.frequency_penalty * n + p.presence_penalty;
  }
}

// The candidates sorted by probability (descending) until their mass reaches top_p of `total`.
void keep_top_p(std::vector<int32_t>& candidates, const std::vector<float>& probs, double total, float top_p) {
  auto by_prob = [&probs](int32_t a, int32_t b) { return probs[a] > probs[b] || (probs[a] == probs[b] && a < b); };
  const double target = static_cast<double>(top_p) * total;
  size_t sorted = std::min<size_t>(candidates.size(), 1024);
  for (;;) {
    std::partial_sort(candidates.begin(), candidates.begin() + sorted, candidates.end(), by_prob);
    double mass = 0.0;
    for (size_t i = 0; i < sorted; ++i) {
      mass += probs[candidates[i]];
      if (mass >= target) {
        candidates.resize(i + 1);
        return;
      }
    }
    if (sorted == candidates.size()) return;  // rounding: everything is kept
    sorted = candidates.size();
  }
}

int32_t draw(const std::vector<int32_t>& candidates, const std::vector<float>& probs, const DrawKey& key) {
  int32_t best = candidates.front();
  double best_score = -1.0;
  for (int32_t t : candidates) {  // ties (measure zero) go to the lower index
    const double score = static_cast<double>(probs[t]) / race_noise(key, t);
    if (score > best_score || (score == best_score && t < best)) best_score = score, best = t;
  }
  return best;
}

int32_t sample_random(std::vector<float>& logits, const SamplingParams& p, const DrawKey& key) {
  const float inv_t = 1.0f / p.temperature;
  float max_logit = NEG_INF;
  for (float& l : logits) {
    l *= inv_t;
    max_logit = std::max(max_logit, l);
  }
  if (max_logit == NEG_INF) return argmax(logits);  // everything masked: nothing to draw from
  std::vector<float>& probs = logits;               // unnormalized: exp(l - max), so the best token has 1
  for (float& l : probs) l = std::exp(l - max_logit);
  std::vector<int32_t> candidates;
  const float min_prob = p.min_p;  // min_p · max p, and max p is 1 here
  candidates.reserve(probs.size());
  for (size_t t = 0; t < probs.size(); ++t)
    if (probs[t] > 0.0f && probs[t] >= min_prob) candidates.push_back(static_cast<int32_t>(t));
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < candidates.size()) {
    auto by_prob = [&probs](int32_t a, int32_t b) { return probs[a] > probs[b] || (probs[a] == probs[b] && a < b); };
    std::nth_element(candidates.begin(), candidates.begin() + (p.top_k - 1), candidates.end(), by_prob);
    candidates.resize(p.top_k);
  }
  if (p.top_p < 1.0f) {
    double total = 0.0;
    for (int32_t t : candidates) total += probs[t];
    keep_top_p(candidates, probs, total, p.top_p);
  }
  return draw(candidates, probs, key);
}

}  // namespace

int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

double race_noise(const DrawKey& key, int32_t token) {
  return -std::log(philox_uniform(key.seed, key.position, static_cast<uint32_t>(token)));
}

SampledToken score_token(std::span<const float> logits, int32_t token, int32_t k_top) {
  SampledToken out;
  out.token = token;
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l - max_logit));
  const float log_z = max_logit + static_cast<float>(std::log(sum));
  out.logprob = logits[token] - log_z;
  const size_t k = std::min<size_t>(std::max(k_top, 0), logits.size());
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&logits](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  for (size_t i = 0; i < k; ++i) out.top.push_back({order[i], logits[order[i]] - log_z});
  return out;
}

SampledToken sample_next(std::span<const float> logits, const SamplingParams& p, const SequenceContext& c,
                         const DrawKey& key) {
  SampledToken out;
  const bool processed =
      !c.masked.empty() || !c.allowed.empty() || !p.logit_bias.empty() || p.has_penalties() || !p.greedy();
  std::vector<float> work;
  if (processed) {
    work.assign(logits.begin(), logits.end());
    const int32_t vocab = static_cast<int32_t>(work.size());
    for (int32_t t : c.masked)
      if (t >= 0 && t < vocab) work[t] = NEG_INF;
    if (!c.allowed.empty())  // structured output: tokens outside the grammar's mask cannot be drawn
      for (int32_t t = 0; t < vocab; ++t)
        if (static_cast<size_t>(t / 32) >= c.allowed.size() || !(c.allowed[t / 32] >> (t % 32) & 1u)) work[t] = NEG_INF;
    for (const auto& [t, bias] : p.logit_bias)
      if (t < vocab) work[t] += bias;
    apply_penalties(work, p, c);
  }
  if (p.greedy())
    out.token = argmax(processed ? std::span<const float>(work) : logits);
  else
    out.token = sample_random(work, p, key);

  if (p.logprobs >= 0) {
    SampledToken scored = score_token(logits, out.token, p.logprobs);
    out.logprob = scored.logprob;
    out.top = std::move(scored.top);
  }
  return out;
}

}  // namespace nibble::sampling

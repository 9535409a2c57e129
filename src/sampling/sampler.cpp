// Sampling by inverse CDF over softmax(logits / T) in double, so rare tokens keep their mass.
#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace nibble::sampling {

int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

int32_t sample(std::span<const float> logits, float temperature, std::mt19937_64& rng) {
  if (temperature <= 0.0f) return argmax(logits);
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  std::vector<double> cdf(logits.size());
  double total = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    total += std::exp(static_cast<double>(logits[i] - max_logit) / temperature);
    cdf[i] = total;
  }
  const double u = std::uniform_real_distribution<double>(0.0, total)(rng);
  const size_t index = static_cast<size_t>(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
  return static_cast<int32_t>(std::min(index, logits.size() - 1));  // u == total by rounding: last token
}

}  // namespace nibble::sampling

// rope_for: the RoPE table of a config (rope.h), step by step as transformers computes YaRN.
#include "models/rope.h"

#include <algorithm>
#include <cmath>

namespace nibble::models {
namespace {

constexpr double PI = 3.14159265358979323846;

// YaRN's "inverse dimension formula": the pair index whose wavelength turns `rotations` times over
// the pretraining context.
double correction_dim(double rotations, double dim, double base, double context) {
  return dim * std::log(context / (rotations * 2.0 * PI)) / (2.0 * std::log(base));
}

}  // namespace

ref::Rope rope_for(const io::ModelConfig& config) {
  const io::RopeScaling& s = config.rope_scaling;
  const int64_t dim = config.head_dim, half = dim / 2;
  ref::Rope rope{ref::rope_inv_freq(config.rope_theta, dim), 1.0f};
  if (s.type == io::RopeScalingType::LINEAR) {
    for (float& f : rope.inv_freq) f /= static_cast<float>(s.factor);
  } else if (s.type == io::RopeScalingType::YARN) {
    const double base = config.rope_theta;
    double low = correction_dim(s.beta_fast, double(dim), base, double(s.original_max_position_embeddings));
    double high = correction_dim(s.beta_slow, double(dim), base, double(s.original_max_position_embeddings));
    if (s.truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0), high = std::min(high, double(dim - 1));
    if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
    const float lo = static_cast<float>(low), span = static_cast<float>(high) - lo,
                factor = static_cast<float>(s.factor);
    for (int64_t i = 0; i < half; ++i) {
      // pos_freqs = base ** (2i / dim); the extrapolated frequency 1 / pos_freqs, the interpolated
      // 1 / (factor · pos_freqs), weighted by 1 - ramp (ramp 0 below `low` pairs, 1 above `high`).
      const float pos_freq = std::pow(static_cast<float>(base), static_cast<float>(2 * i) / static_cast<float>(dim));
      const float extrapolated = 1.0f / pos_freq, interpolated = 1.0f / (factor * pos_freq);
      const float ramp = std::clamp((static_cast<float>(i) - lo) / span, 0.0f, 1.0f);
      const float keep = 1.0f - ramp;
      rope.inv_freq[size_t(i)] = interpolated * (1.0f - keep) + extrapolated * keep;
    }
    rope.attention_scaling = static_cast<float>(s.attention_factor);
  }
  return rope;
}

}  // namespace nibble::models

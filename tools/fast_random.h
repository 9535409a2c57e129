// Fast deterministic random numbers for synthetic checkpoints: xoshiro256** seeded by SplitMix64;
// normals by inverse-CDF table lookup (4,096 quantiles, linearly interpolated: a normal truncated at
// ±3.5σ; the table stays in L1 and one 64-bit draw makes two normals, several times faster than
// Box-Muller or the polar method, which bounded synth's speed). Each module
// gets its own stream (seed, module name), so the output does not depend on how work is spread over
// threads. Not for anything statistical beyond test weights.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>
#include <vector>

namespace nibble::tools {

class FastRandom {
 public:
  FastRandom(uint64_t seed, std::string_view stream) {
    uint64_t h = seed ^ 0x9E3779B97F4A7C15ull;
    for (char c : stream) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001B3ull;  // FNV-1a mix
    for (uint64_t& s : state_) s = splitmix(h);
  }

  uint64_t next() {
    const uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }
  // Uniform in (0, 1].
  float uniform() { return static_cast<float>((next() >> 40) + 1) * (1.0f / 16777216.0f); }
  // n normals (n a multiple of 16) from 8 xoshiro256** streams run side by side (seeded from this
  // generator on first use), one 64-bit draw per lane giving two normals; AVX2 where the CPU has it.
  void fill_normals(float* out, size_t n);  // fast_random.cpp
  // The largest magnitude normal() and fill_normals() return (the table's end: about 3.5σ).
  static float max_abs_normal() { return quantiles()[N]; }
  // 32 random bits → a normal: 12 bits pick the quantile bin, 20 bits interpolate inside it. The
  // AVX2 generator (fast_random.cpp) computes the same thing with gathers.
  static constexpr int TABLE_BITS = 12;
  static float from_bits(uint32_t bits) {
    const uint32_t index = bits >> (32 - TABLE_BITS);
    const float frac = static_cast<float>(bits & ((1u << (32 - TABLE_BITS)) - 1)) * (1.0f / (1u << (32 - TABLE_BITS)));
    const float* q = quantiles();
    return q[index] + frac * (q[index + 1] - q[index]);
  }
  float normal() {
    if (has_spare_) {
      has_spare_ = false;
      return from_bits(spare_bits_);
    }
    const uint64_t r = next();
    spare_bits_ = static_cast<uint32_t>(r);
    has_spare_ = true;
    return from_bits(static_cast<uint32_t>(r >> 32));
  }

 private:
  static constexpr int LANES = 8;
  void seed_lanes() {
    for (auto& state : lane_)
      for (uint64_t& s : state) s = next() | 1;  // never all-zero
    lanes_seeded_ = true;
  }

  static constexpr int N = 1 << TABLE_BITS;

  // quantiles()[i] = Φ⁻¹(i / N) for i in 1..N-1, with the two ends set to Φ⁻¹(0.5 / N) and its
  // negative so every bin is finite. Computed once by bisection on std::erfc.
  static const float* quantiles() {
    static const std::vector<float> table = [] {
      std::vector<float> t(N + 1);
      auto inverse_cdf = [](double p) {
        double lo = -10.0, hi = 10.0;
        for (int it = 0; it < 60; ++it) {
          const double mid = 0.5 * (lo + hi);
          (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
        }
        return 0.5 * (lo + hi);
      };
      for (int i = 1; i < N; ++i) t[i] = static_cast<float>(inverse_cdf(static_cast<double>(i) / N));
      t[0] = static_cast<float>(inverse_cdf(0.5 / N));
      t[N] = -t[0];
      return t;
    }();
    return table.data();
  }
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  static uint64_t splitmix(uint64_t& x) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t state_[4];
  uint64_t lane_[4][LANES] = {};  // the 8-lane generator of fill_normals
  bool lanes_seeded_ = false;
  uint32_t spare_bits_ = 0;
  bool has_spare_ = false;
};

}  // namespace nibble::tools

// Fast deterministic random numbers for synthetic checkpoints: xoshiro256** seeded by SplitMix64,
// normals by Marsaglia's polar method. Each module gets its own stream (seed, module name), so the output does not
// depend on how work is spread over threads. Not for anything statistical beyond test weights.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

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
  float normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    float u, v, s;
    do {  // a uniform point in the unit disc (accepted with probability π/4)
      u = 2.0f * uniform() - 1.0f;
      v = 2.0f * uniform() - 1.0f;
      s = u * u + v * v;
    } while (s >= 1.0f || s == 0.0f);
    const float factor = std::sqrt(-2.0f * std::log(s) / s);
    spare_ = v * factor;
    has_spare_ = true;
    return u * factor;
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  static uint64_t splitmix(uint64_t& x) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t state_[4];
  float spare_ = 0.0f;
  bool has_spare_ = false;
};

}  // namespace nibble::tools

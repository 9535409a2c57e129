// Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2, 3", SC'11;
// the generator of Random123, cuRAND and torch), host and device: a counter-based RNG, so a draw is a
// pure function of (key, counter). The sampler keys it by the request seed and counts by token
// position and vocabulary index, so the CPU and the GPU draw the same numbers.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define NIB_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define NIB_HOST_DEVICE inline
#endif

namespace nibble {

struct Philox4 {
  uint32_t v[4];
};

NIB_HOST_DEVICE Philox4 philox4x32_10(Philox4 ctr, uint32_t key0, uint32_t key1) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(M0) * ctr.v[0], p1 = static_cast<uint64_t>(M1) * ctr.v[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    ctr = {{hi1 ^ ctr.v[1] ^ key0, lo1, hi0 ^ ctr.v[3] ^ key1, lo0}};
    key0 += W0;
    key1 += W1;
  }
  return ctr;
}

// A uniform double in (0, 1] (53 random bits) for draw `index` of `position` under `seed`.
NIB_HOST_DEVICE double philox_uniform(uint64_t seed, uint64_t position, uint32_t index) {
  const Philox4 r = philox4x32_10({{static_cast<uint32_t>(position), static_cast<uint32_t>(position >> 32), index, 0u}},
                                  static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  const uint64_t bits = (static_cast<uint64_t>(r.v[0]) << 21) ^ (r.v[1] >> 11);  // 53 bits
  return (static_cast<double>(bits & ((1ull << 53) - 1)) + 1.0) * (1.0 / 9007199254740992.0);
}

}  // namespace nibble

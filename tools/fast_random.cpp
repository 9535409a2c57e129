// FastRandom::fill_normals: a portable version and an AVX2 one (intrinsics: the table lookups are
// gathers, which the compiler would not emit), chosen at run time; NIBBLE_DIAG_NO_AVX2=1 forces the
// portable one (tests compare the two: same arithmetic, same order, so the same floats).
#include "tools/fast_random.h"

#include <immintrin.h>

#include <cstdlib>

#include "core/env.h"

namespace nibble::tools {
namespace {

constexpr int LANES = 8;
constexpr int FRAC_BITS = 32 - FastRandom::TABLE_BITS;  // 32 random bits: 12 pick the bin, 20 interpolate
constexpr float FRAC_SCALE = 1.0f / (1u << FRAC_BITS);

void fill_portable(uint64_t (&s)[4][LANES], float* out, size_t n) {
  for (size_t base = 0; base < n; base += 2 * LANES) {
    uint32_t bits[2 * LANES];
    for (int l = 0; l < LANES; ++l) {
      const uint64_t x = s[1][l] * 5;
      const uint64_t r = ((x << 7) | (x >> 57)) * 9;
      const uint64_t t = s[1][l] << 17;
      s[2][l] ^= s[0][l];
      s[3][l] ^= s[1][l];
      s[1][l] ^= s[2][l];
      s[0][l] ^= s[3][l];
      s[2][l] ^= t;
      s[3][l] = (s[3][l] << 45) | (s[3][l] >> 19);
      bits[l] = static_cast<uint32_t>(r);
      bits[l + LANES] = static_cast<uint32_t>(r >> 32);
    }
    for (int i = 0; i < 2 * LANES; ++i) out[base + i] = FastRandom::from_bits(bits[i]);
  }
}

__attribute__((target("avx2"))) __m256i rotl64(__m256i x, int k) {
  return _mm256_or_si256(_mm256_slli_epi64(x, k), _mm256_srli_epi64(x, 64 - k));
}

// The same generator with lanes 0-3 in one register and 4-7 in another.
__attribute__((target("avx2"))) void fill_avx2(uint64_t (&s)[4][LANES], const float* q, float* out, size_t n) {
  __m256i a[4][2];
  for (int w = 0; w < 4; ++w)
    for (int h = 0; h < 2; ++h) a[w][h] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&s[w][4 * h]));
  const __m256i even_then_odd = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  const __m256i frac_mask = _mm256_set1_epi32((1 << FRAC_BITS) - 1);
  const __m256 frac_scale = _mm256_set1_ps(FRAC_SCALE);
  for (size_t base = 0; base < n; base += 2 * LANES) {
    __m256i r[2];
    for (int h = 0; h < 2; ++h) {
      const __m256i x = _mm256_add_epi64(_mm256_slli_epi64(a[1][h], 2), a[1][h]);  // s1 * 5
      const __m256i rot = rotl64(x, 7);
      r[h] = _mm256_add_epi64(_mm256_slli_epi64(rot, 3), rot);  // * 9
      const __m256i t = _mm256_slli_epi64(a[1][h], 17);
      a[2][h] = _mm256_xor_si256(a[2][h], a[0][h]);
      a[3][h] = _mm256_xor_si256(a[3][h], a[1][h]);
      a[1][h] = _mm256_xor_si256(a[1][h], a[2][h]);
      a[0][h] = _mm256_xor_si256(a[0][h], a[3][h]);
      a[2][h] = _mm256_xor_si256(a[2][h], t);
      a[3][h] = rotl64(a[3][h], 45);
    }
    // [lo0 hi0 lo1 hi1 ...] → low halves of lanes 0-7, then high halves (the portable order).
    const __m256i p0 = _mm256_permutevar8x32_epi32(r[0], even_then_odd);
    const __m256i p1 = _mm256_permutevar8x32_epi32(r[1], even_then_odd);
    const __m256i halves[2] = {_mm256_permute2x128_si256(p0, p1, 0x20), _mm256_permute2x128_si256(p0, p1, 0x31)};
    for (int k = 0; k < 2; ++k) {
      const __m256i index = _mm256_srli_epi32(halves[k], FRAC_BITS);
      const __m256 frac = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(halves[k], frac_mask)), frac_scale);
      const __m256 lo = _mm256_i32gather_ps(q, index, 4);
      const __m256 hi = _mm256_i32gather_ps(q + 1, index, 4);
      _mm256_storeu_ps(out + base + 8 * k, _mm256_add_ps(lo, _mm256_mul_ps(frac, _mm256_sub_ps(hi, lo))));
    }
  }
  for (int w = 0; w < 4; ++w)
    for (int h = 0; h < 2; ++h) _mm256_storeu_si256(reinterpret_cast<__m256i*>(&s[w][4 * h]), a[w][h]);
}

}  // namespace

void FastRandom::fill_normals(float* out, size_t n) {
  static_assert(FastRandom::LANES == LANES);
  static const bool avx2 = __builtin_cpu_supports("avx2") && !env_flag("NIBBLE_DIAG_NO_AVX2");
  if (!lanes_seeded_) seed_lanes();
  if (avx2)
    fill_avx2(lane_, quantiles(), out, n);
  else
    fill_portable(lane_, out, n);
}

}  // namespace nibble::tools

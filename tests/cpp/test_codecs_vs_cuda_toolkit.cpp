// Our E2M1/E4M3/BF16 encoders against the CUDA toolkit's own host conversions (cuda_fp4.h,
// cuda_fp8.h, cuda_bf16.h): every rounding boundary and its float neighbours, both signs,
// subnormals, saturation, and millions of random values. Needs the toolkit headers, not a GPU.
#include <cuda_bf16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "formats/bf16.h"
#include "formats/e2m1.h"
#include "formats/e4m3.h"
#include "test_seed.h"

using namespace nibble::formats;

namespace {

uint8_t toolkit_e2m1(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest)) & 0xF;
}
uint8_t toolkit_e4m3(float x) { return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)); }
uint16_t toolkit_bf16(float x) {
  const __nv_bfloat16 b = __float2bfloat16_rn(x);
  uint16_t u;
  std::memcpy(&u, &b, sizeof u);
  return u;
}

// Each value, its float neighbours on both sides, and the negatives of all of them.
std::vector<float> around(const std::vector<float>& points) {
  std::vector<float> out;
  for (float p : points) {
    for (float v : {p, std::nextafter(p, 0.0f), std::nextafter(p, INFINITY),
                    std::nextafter(std::nextafter(p, INFINITY), INFINITY)}) {
      out.push_back(v);
      out.push_back(-v);
    }
  }
  return out;
}

// Random floats: uniform bit patterns (every exponent) and values spread over the format's range.
std::vector<float> random_floats(uint64_t seed, size_t n, float range) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<uint32_t> bits;
  std::uniform_real_distribution<float> uniform(-range, range);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (i % 2 == 0) {
      out[i] = uniform(rng);
    } else {
      const uint32_t u = bits(rng);
      std::memcpy(&out[i], &u, sizeof u);
      if (std::isnan(out[i])) out[i] = 0.5f;  // NaN handled separately
    }
  }
  return out;
}

// Our encoder against the toolkit's on every value; reports the first few mismatches.
template <class Ours, class Theirs>
void expect_all_agree(const std::vector<float>& xs, Ours ours, Theirs theirs) {
  size_t mismatches = 0;
  for (float x : xs) {
    if (ours(x) != theirs(x) && ++mismatches < 10) ADD_FAILURE() << x;
  }
  EXPECT_EQ(mismatches, 0u);
}

}  // namespace

TEST(CudaToolkit, E2M1Boundaries) {
  std::vector<float> points = {0.0f, 0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f,
                               2.5f, 3.0f,  3.5f, 4.0f,  5.0f, 6.0f,  7.0f, 1e38f, 1e-40f};
  for (float x : around(points)) EXPECT_EQ(e2m1_encode(x), toolkit_e2m1(x)) << x;
  EXPECT_EQ(e2m1_encode(INFINITY), toolkit_e2m1(INFINITY));
  EXPECT_EQ(e2m1_encode(-INFINITY), toolkit_e2m1(-INFINITY));
  EXPECT_EQ(e2m1_encode(NAN), toolkit_e2m1(NAN));
}

TEST(CudaToolkit, E2M1Random) {
  expect_all_agree(
      random_floats(nibble::test::test_seed("E2M1Random"), 4'000'000, 8.0f), [](float x) { return e2m1_encode(x); },
      toolkit_e2m1);
}

TEST(CudaToolkit, E4M3Boundaries) {
  std::vector<float> points = {0.0f, 448.0f, 464.0f, 480.0f, 1e38f, 1e-40f};
  for (int code = 0; code < 0x7F; ++code) {
    const float v = e4m3_decode(static_cast<uint8_t>(code));
    const float next = e4m3_decode(static_cast<uint8_t>(code + 1));
    points.push_back(v);
    if (!std::isnan(next)) points.push_back((v + next) / 2);  // midpoint, exact in float
  }
  for (float x : around(points)) EXPECT_EQ(e4m3_encode(x), toolkit_e4m3(x)) << x;
  EXPECT_EQ(e4m3_encode(INFINITY), toolkit_e4m3(INFINITY));
  EXPECT_EQ(e4m3_encode(-INFINITY), toolkit_e4m3(-INFINITY));
  EXPECT_EQ(e4m3_encode(NAN) & 0x7F, toolkit_e4m3(NAN) & 0x7F);  // NaN, sign aside
}

TEST(CudaToolkit, E4M3Random) {
  expect_all_agree(
      random_floats(nibble::test::test_seed("E4M3Random"), 4'000'000, 500.0f), [](float x) { return e4m3_encode(x); },
      toolkit_e4m3);
}

TEST(CudaToolkit, BF16Random) {
  expect_all_agree(
      random_floats(nibble::test::test_seed("BF16Random"), 4'000'000, 1e4f), [](float x) { return bf16_encode(x); },
      toolkit_bf16);
}

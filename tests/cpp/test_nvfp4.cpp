// NVFP4 matrices on the host: bad input errors, value bounds, dequantization forms, and the bound on
// what an approximate reciprocal (as the GPU and Blackwell kernels use) may change.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "formats/bf16.h"
#include "formats/e2m1.h"
#include "formats/e4m3.h"
#include "formats/nvfp4.h"
#include "formats/nvfp4_block.h"
#include "nvfp4_boundaries.h"
#include "test_seed.h"

using namespace nibble::formats;

namespace {

std::vector<float> normal_values(uint64_t seed, size_t n, float stddev) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

}  // namespace

TEST(Nvfp4Errors, NonFiniteValueNamesTensorAndPosition) {
  std::vector<float> w(4 * 32, 0.5f);
  w[2 * 32 + 17] = NAN;
  auto q = quantize_weight(w, 4, 32, "layers.3.mlp.down_proj.weight");
  ASSERT_FALSE(q.is_ok());
  EXPECT_NE(q.status().message().find("layers.3.mlp.down_proj.weight"), std::string::npos);
  EXPECT_NE(q.status().message().find("[2, 17]"), std::string::npos) << q.status().message();

  w[2 * 32 + 17] = -INFINITY;
  auto a = quantize_activation_per_token(w, 4, 32, "x");
  ASSERT_FALSE(a.is_ok());
  EXPECT_NE(a.status().message().find("[2, 17]"), std::string::npos) << a.status().message();
}

TEST(Nvfp4Errors, KNotMultipleOf16) {
  std::vector<float> w(3 * 24, 1.0f);
  auto q = quantize_weight(w, 3, 24, "proj.weight");
  ASSERT_FALSE(q.is_ok());
  EXPECT_NE(q.status().message().find("K = 24"), std::string::npos) << q.status().message();
  EXPECT_FALSE(quantize_activation_static(w, 3, 24, 0.1f, "x").is_ok());
}

TEST(Nvfp4Errors, BadScales) {
  std::vector<float> zeros(2 * 16, 0.0f);
  EXPECT_FALSE(quantize_weight(zeros, 2, 16, "w").is_ok());  // all-zero tensor: no global scale
  std::vector<float> x(2 * 16, 1.0f);
  EXPECT_FALSE(quantize_activation_static(x, 2, 16, 0.0f, "x").is_ok());
  EXPECT_FALSE(quantize_activation_static(x, 2, 16, NAN, "x").is_ok());
}

TEST(Nvfp4Weight, DequantizedWithinHalfStepOfInput) {
  const int64_t rows = 64, cols = 256;
  const auto w = normal_values(nibble::test::test_seed("Nvfp4Weight"), rows * cols, 0.02f);
  auto q = quantize_weight(w, rows, cols, "w");
  ASSERT_TRUE(q.is_ok()) << q.status().message();
  const auto deq = dequantize(*q);
  // Per block the E2M1 grid step is at most 2 (between 4 and 6) in units of the block scale, so
  // the rounding error is at most one unit; the E4M3 rounding of the scale adds ≤ 1/16 relative.
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float unit = e4m3_decode(q->block_scales[r * cols / 16 + c / 16]) * q->scale;
      ASSERT_LE(std::fabs(deq[r * cols + c] - w[r * cols + c]), unit * 1.0001f) << r << "," << c;
    }
  }
  // Global scale is amax/2688 and at least one block scale reaches 448.
  EXPECT_EQ(q->scale, weight_scale_2(w));
  const auto bf16 = dequantize_bf16(*q);
  for (size_t i = 0; i < deq.size(); ++i) ASSERT_EQ(bf16[i], bf16_encode(deq[i]));
}

TEST(Nvfp4Weight, AllZeroBlockGetsScaleOneAndZeroCodes) {
  std::vector<float> w(2 * 32, 0.0f);
  for (int i = 0; i < 16; ++i) w[i] = 0.01f * (i - 8);
  auto q = quantize_weight(w, 2, 32, "w");
  ASSERT_TRUE(q.is_ok());
  EXPECT_EQ(q->block_scales[1], e4m3_encode(1.0f));
  EXPECT_EQ(q->block_scales[3], e4m3_encode(1.0f));
  for (int c = 16; c < 32; ++c) EXPECT_EQ(q->code(0, c), 0);
}

TEST(Nvfp4Activation, PerTokenRowScaleAndBlockScaleRange) {
  const int64_t rows = 32, cols = 128;
  auto x = normal_values(nibble::test::test_seed("Nvfp4PerToken"), rows * cols, 3.0f);
  for (int64_t c = 0; c < cols; ++c) x[5 * cols + c] = 0.0f;  // an all-zero row
  auto q = quantize_activation_per_token(x, rows, cols, "x");
  ASSERT_TRUE(q.is_ok());
  for (int64_t r = 0; r < rows; ++r) {
    float amax = 0.0f, max_sf = 0.0f;
    for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(x[r * cols + c]));
    for (int64_t b = 0; b < cols / 16; ++b) max_sf = std::max(max_sf, e4m3_decode(q->block_scales[r * cols / 16 + b]));
    EXPECT_EQ(q->row_scales[r], amax / 2688.0f);
    // The block holding the row's amax gets SF = 448 up to the rounding of G·amax·(1/6).
    if (amax > 0) EXPECT_NEAR(max_sf, 448.0f, 16.0f) << r;
  }
  const auto deq = dequantize(*q);
  for (int64_t c = 0; c < cols; ++c) EXPECT_EQ(deq[5 * cols + c], 0.0f);
}

TEST(Nvfp4Activation, StaticSaturatesBeyondCalibratedRange) {
  std::vector<float> x(16, 0.1f);
  x[3] = 100.0f;  // far above amax = 6·448·input_scale = 2.688
  auto q = quantize_activation_static(x, 1, 16, 0.001f, "x");
  ASSERT_TRUE(q.is_ok());
  EXPECT_EQ(q->block_scales[0], 0x7E);  // clamped at 448
  EXPECT_EQ(q->code(0, 3), 7);          // saturated at 6
  const auto unscaled = dequantize_unscaled_bf16(*q);
  EXPECT_EQ(bf16_decode(unscaled[3]), 6.0f * 448.0f);
}

TEST(Nvfp4Activation, FakeQuantizeNoneIsIdentity) {
  const auto x = normal_values(7, 64, 1.0f);
  auto y = fake_quantize_activation(x, 2, 32, ActQuant::NONE, 0.0f, "x");
  ASSERT_TRUE(y.is_ok());
  EXPECT_EQ(*y, x);
  auto s = fake_quantize_activation(x, 2, 32, ActQuant::STATIC, 0.01f, "x");
  ASSERT_TRUE(s.is_ok());
  EXPECT_NE(*s, x);
}

// --- The approximate-reciprocal bound -----------------------------------------------------------
// The GPU kernels use rcp.approx.ftz.f32 (max error 1 ulp, PTX ISA "rcp.approx") as Blackwell's
// cvt_warp_fp16_to_fp4 does; the CPU reference divides exactly. Emulating the approximation as a
// random ±1-ulp error on each of the three reciprocals, a block scale may change only when the exact
// G·amax/6 lies within 4 ulps of an E4M3 rounding midpoint, and an element code only when x·scale
// lies within 4 ulps of an E2M1 midpoint.
namespace {

struct OneUlpReciprocal {
  std::mt19937_64* rng;
  float operator()(float x) const {
    const float r = 1.0f / x;
    switch ((*rng)() % 3) {
      case 0:
        return std::nextafter(r, 0.0f);
      case 1:
        return std::nextafter(r, INFINITY);
      default:
        return r;
    }
  }
};

}  // namespace

TEST(Nvfp4Activation, ApproximateReciprocalChangesOnlyNearBoundaries) {
  std::mt19937_64 rng(nibble::test::test_seed("ApproximateReciprocal"));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float midpoints[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  size_t changed_codes = 0, changed_scales = 0;
  for (int trial = 0; trial < 200000; ++trial) {
    const float global = std::ldexp(1.0f + 0.5f * (trial % 7), trial % 9 - 4);
    float x[16];
    for (float& v : x) v = normal(rng);
    if (trial % 2 == 0) {
      // Put elements exactly on E2M1 midpoints of a block whose scale is exact, to hit boundaries.
      const float out_scale = 1.0f / (e4m3_decode(0x40) / global);  // SF = 2.0
      for (int i = 0; i < 16; ++i) x[i] = midpoints[(trial + i) % 7] / out_scale * (i % 2 ? 1 : -1);
      x[0] = 6.0f * (e4m3_decode(0x40) / global);  // amax gives SF = 2.0 exactly
    }
    uint8_t exact[16], approx[16];
    const uint8_t sf_exact = quantize_activation_block(x, global, exact);
    const uint8_t sf_approx = quantize_activation_block(x, global, approx, OneUlpReciprocal{&rng});
    float amax = 0;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    if (sf_exact != sf_approx) {
      ++changed_scales;
      ASSERT_TRUE(nibble::test::near_e4m3_midpoint(global * (amax * (1.0f / 6.0f))))
          << "block scale changed away from a boundary, trial " << trial;
      continue;
    }
    const float out_scale = 1.0f / (e4m3_decode(sf_exact) * (1.0f / global));
    for (int i = 0; i < 16; ++i) {
      if (exact[i] == approx[i]) continue;
      ++changed_codes;
      ASSERT_TRUE(nibble::test::near_e2m1_midpoint(x[i] * out_scale))
          << "code changed away from a boundary: x=" << x[i] << " trial " << trial;
    }
  }
  std::printf("approximate reciprocal changed %zu codes and %zu block scales\n", changed_codes, changed_scales);
  EXPECT_GT(changed_codes, 0u);  // the boundary cases were exercised
}

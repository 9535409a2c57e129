// cuda::quantize_activation_nvfp4 (rcp.approx, as Blackwell) against the host quantizer (exact
// division) on Qwen3-30B-A3B activation shapes: block scales and codes agree except within a few
// ulps of a rounding midpoint (tests/cpp/nvfp4_boundaries.h), and such cases stay rare. The W4A4
// x̂ kernels against it: exactly its codes times its scales.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "cuda/nvfp4/nvfp4_layout.h"
#include "cuda/nvfp4/quantize_nvfp4.cuh"
#include "cuda_test_util.cuh"
#include "formats/bf16.h"
#include "formats/e2m1.h"
#include "formats/e4m3.h"
#include "formats/nvfp4.h"
#include "formats/nvfp4_block.h"
#include "nvfp4_boundaries.h"
#include "test_seed.h"

using namespace nibble;

namespace {

struct Case {
  int64_t rows, cols;
  float input_scale;  // 0 = per-token
};

void check_against_host(const Case& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(c.rows * c.cols));
  for (float& v : x) v = normal(rng) * (1 + (rng() % 64 == 0 ? 30.0f : 0.0f));

  test::DeviceBuffer<float> d_x(x);
  test::DeviceBuffer<uint8_t> d_packed(x.size() / 2), d_scales(x.size() / 16);
  test::DeviceBuffer<float> d_rows(static_cast<size_t>(c.rows));
  ASSERT_TRUE(cuda::quantize_activation_nvfp4(d_x.get(), c.rows, c.cols, c.input_scale,
                                              d_packed.get(), d_scales.get(), d_rows.get(), 0)
                  .is_ok());
  NIB_CUDA_CHECK(cudaDeviceSynchronize());
  const auto packed = d_packed.to_host(), scales = d_scales.to_host();

  auto host = c.input_scale > 0
                  ? formats::quantize_activation_static(x, c.rows, c.cols, c.input_scale, "x")
                  : formats::quantize_activation_per_token(x, c.rows, c.cols, "x");
  ASSERT_TRUE(host.is_ok());
  if (c.input_scale == 0) EXPECT_EQ(d_rows.to_host(), host->row_scales);

  size_t scale_diffs = 0, code_diffs = 0;
  const int64_t n_blocks = c.cols / 16;
  for (int64_t r = 0; r < c.rows; ++r) {
    const float global = c.input_scale > 0 ? 1.0f / c.input_scale
                                           : formats::per_token_global(host->row_scales[r]);
    for (int64_t b = 0; b < n_blocks; ++b) {
      const float* block = x.data() + r * c.cols + b * 16;
      const size_t s = static_cast<size_t>(r * n_blocks + b);
      if (scales[s] != host->block_scales[s]) {
        float amax = 0;
        for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(block[i]));
        ASSERT_TRUE(test::near_e4m3_midpoint(global * (amax * (1.0f / 6.0f))))
            << "block scale differs away from a boundary at row " << r << " block " << b;
        ++scale_diffs;
        continue;
      }
      const float out_scale = 1.0f / (formats::e4m3_decode(scales[s]) * (1.0f / global));
      for (int i = 0; i < 16; ++i) {
        const int64_t col = b * 16 + i;
        const uint8_t gpu = formats::e2m1_unpack(packed[(r * c.cols + col) / 2], col % 2);
        if (gpu == host->code(r, col)) continue;
        ASSERT_TRUE(test::near_e2m1_midpoint(block[i] * out_scale))
            << "code differs away from a boundary at [" << r << ", " << col << "]";
        ++code_diffs;
      }
    }
  }
  std::printf("rows %lld cols %lld %s: %zu block scales and %zu codes differ (all at boundaries)\n",
              static_cast<long long>(c.rows), static_cast<long long>(c.cols),
              c.input_scale > 0 ? "static" : "per-token", scale_diffs, code_diffs);
  EXPECT_LE(code_diffs, x.size() / 1000);
}

}  // namespace

TEST(CudaQuantizeActivation, MatchesHostOnModelShapes) {
  NIB_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::test_seed("CudaQuantizeActivation");
  // Qwen3-30B-A3B: hidden 2048 (q/k/v, gate/up inputs), 4096 (o_proj input), 768 (down input).
  const Case cases[] = {{1, 2048, 0}, {3, 2048, 0.002f}, {17, 4096, 0}, {255, 768, 0.0005f},
                        {4099, 2048, 0}, {4099, 768, 0.001f}};
  for (const Case& c : cases) check_against_host(c, seed + c.rows);
}

// The W4A4 form (x̂ = e2m1 · e4m3 as BF16, row scales) against the packed kernel above, an independent
// one-CTA-per-row implementation of the same block math: x̂ must be exactly its codes times its
// block scales. The shapes cover every thread layout of the x̂ kernel: rows narrower than a warp's
// blocks, a block a thread, several held per thread (4,096 and 8,192 wide) and rows read twice
// (12,288, ERNIE-4.5's dense down_proj input); fp32 and BF16 inputs.
TEST(CudaQuantizeActivation, DequantizedFormIsTheCodesTimesTheirScales) {
  NIB_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::test_seed("CudaQuantizeActivation.Dequantized");
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const Case cases[] = {{1, 4096, 0},    {1, 4096, 0.003f}, {8, 768, 0},      {8, 768, 0.0005f}, {5, 96, 0},
                        {33, 2048, 0},   {3, 8192, 0},      {3, 12288, 0},    {2, 12288, 0.002f}, {130, 768, 0},
                        // Prefill-sized: more blocks than the GPU holds threads (fewer threads a row).
                        {6000, 768, 0},  {6000, 768, 0.0005f}, {2100, 4096, 0}, {2100, 2048, 0}};
  for (const Case& c : cases)
    for (const bool bf16_input : {false, true}) {
      std::vector<float> x(static_cast<size_t>(c.rows * c.cols));
      std::vector<uint16_t> x_bits(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        x[i] = normal(rng) * (1 + (rng() % 64 == 0 ? 30.0f : 0.0f));
        if (bf16_input) x_bits[i] = formats::bf16_encode(x[i]), x[i] = formats::bf16_decode(x_bits[i]);
      }
      test::DeviceBuffer<float> d_x(x), d_rows(static_cast<size_t>(c.rows)), d_rows_hat(static_cast<size_t>(c.rows));
      test::DeviceBuffer<uint16_t> d_bits(x_bits), d_hat(x.size());
      test::DeviceBuffer<uint8_t> d_packed(x.size() / 2), d_scales(x.size() / 16);
      ASSERT_TRUE(cuda::quantize_activation_nvfp4(d_x.get(), c.rows, c.cols, c.input_scale, d_packed.get(), d_scales.get(),
                                                  d_rows.get(), 0)
                      .is_ok());
      ASSERT_TRUE((bf16_input ? cuda::quantize_dequantize_activation_bf16(d_bits.get(), c.rows, c.cols, c.input_scale,
                                                                          d_hat.get(), d_rows_hat.get(), 0)
                              : cuda::quantize_dequantize_activation_f32(d_x.get(), c.rows, c.cols, c.input_scale,
                                                                         d_hat.get(), d_rows_hat.get(), 0))
                      .is_ok());
      NIB_CUDA_CHECK(cudaDeviceSynchronize());
      const auto packed = d_packed.to_host(), scales = d_scales.to_host();
      const auto hat = d_hat.to_host();
      const auto rows_hat = d_rows_hat.to_host(), rows = d_rows.to_host();
      size_t differ = 0;
      for (int64_t r = 0; r < c.rows; ++r) {
        EXPECT_EQ(rows_hat[size_t(r)], c.input_scale > 0 ? c.input_scale : rows[size_t(r)]) << "row " << r;
        for (int64_t col = 0; col < c.cols; ++col) {
          const size_t i = static_cast<size_t>(r * c.cols + col);
          const float value = formats::e2m1_decode(formats::e2m1_unpack(packed[i / 2], int(col % 2))) *
                              formats::e4m3_decode(scales[i / 16]);  // ≤ 6 significant bits: exact in BF16
          uint32_t bits;
          std::memcpy(&bits, &value, sizeof(bits));
          differ += hat[i] != uint16_t(bits >> 16);
        }
      }
      EXPECT_EQ(differ, 0u) << c.rows << " x " << c.cols << (c.input_scale > 0 ? " static" : " per-token")
                            << (bf16_input ? ", BF16 input" : ", fp32 input");
      if (!bf16_input && c.cols % 32 == 0) {  // the wgmma MoE down's input: the same x̂, each row in fragment order
        test::DeviceBuffer<uint16_t> d_frag(x.size());
        test::DeviceBuffer<float> d_rows_frag(static_cast<size_t>(c.rows));
        ASSERT_TRUE(cuda::quantize_dequantize_activation_f32(d_x.get(), c.rows, c.cols, c.input_scale, d_frag.get(),
                                                             d_rows_frag.get(), 0, true)
                        .is_ok());
        const auto frag = d_frag.to_host();
        EXPECT_EQ(d_rows_frag.to_host(), rows_hat) << "row scales, fragment order";
        size_t moved = 0;
        for (int64_t r = 0; r < c.rows; ++r)
          for (int64_t col = 0; col < c.cols; ++col)
            moved += frag[size_t(r * c.cols + cuda::fragment_order_index(col))] != hat[size_t(r * c.cols + col)];
        EXPECT_EQ(moved, 0u) << c.rows << " x " << c.cols << " in fragment order";
      }
    }
}

TEST(CudaQuantizeActivation, RejectsBadShapes) {  // host-side checks: runs without a GPU too
  EXPECT_FALSE(cuda::quantize_activation_nvfp4(nullptr, 4, 24, 0.1f, nullptr, nullptr, nullptr, 0)
                   .is_ok());
  EXPECT_FALSE(cuda::quantize_activation_nvfp4(nullptr, 4, 32, 0.0f, nullptr, nullptr, nullptr, 0)
                   .is_ok());
}

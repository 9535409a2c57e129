// cuda::linear_nvfp4 (every backend, all three activation modes) against ref::linear_nvfp4 on
// Qwen3-30B-A3B shapes (q/k/v/o 2048↔4096/512, expert gate/up 768×2048, down 2048×768) and odd M
// (1, 3, 17, 255, 4099), with fresh seeded weights quantized as ModelOpt does and BF16 activations;
// prints max and mean relative error (to max|y|). Tolerance 1e-4: both sides multiply the same
// exact values (BF16 x or x̂, Ŵ = e2m1·e4m3) and differ only in fp32 summation order over K ≤ 4096
// terms (~sqrt(K)·2⁻²⁴ ≈ 4e-6). In the W4A4 modes the GPU quantizes x with rcp.approx as Blackwell
// does and the CPU with exact division, so a code at a rounding boundary may differ (one E2M1 step,
// which near the top of a block with an outlier moves y by ~1%): the x̂ the GPU used is checked
// against the CPU's (row scales equal, differing codes rare) and the GEMM is checked on the GPU's x̂.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/gemm/linear_nvfp4.cuh"
#include "cuda/nvfp4/quantize_nvfp4.cuh"
#include "cuda/gemm/skinny_gemm.cuh"
#include "cuda_test_util.cuh"
#include "formats/bf16.h"
#include "formats/e4m3.h"
#include "nvfp4_boundaries.h"
#include "formats/nvfp4.h"
#include "ref/ops.h"
#include "test_seed.h"

using namespace nibble;

namespace {

struct Shape {
  int64_t n, k;
  const char* what;
};

struct Problem {
  std::vector<float> x;          // BF16-representable
  std::vector<uint16_t> x_bf16;
  formats::Nvfp4Matrix w;
};

Problem make_problem(int64_t m, const Shape& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Problem p;
  std::vector<float> w(static_cast<size_t>(s.n * s.k));
  for (float& v : w) v = 0.02f * normal(rng);
  auto q = formats::quantize_weight(w, s.n, s.k, "w");
  EXPECT_TRUE(q.is_ok());
  p.w = std::move(q.value());
  p.x.resize(static_cast<size_t>(m * s.k));
  p.x_bf16.resize(p.x.size());
  for (size_t i = 0; i < p.x.size(); ++i) {
    p.x_bf16[i] = formats::bf16_encode(normal(rng) * (rng() % 97 == 0 ? 20.0f : 1.0f));  // some outliers
    p.x[i] = formats::bf16_decode(p.x_bf16[i]);
  }
  return p;
}

void check(int64_t m, const Shape& s, DenseKernel backend, uint64_t seed,
           formats::ActQuant mode = formats::ActQuant::NONE) {
  const Problem p = make_problem(m, s, seed);
  const formats::Nvfp4WeightView view{p.w.packed.data(), p.w.block_scales.data(), s.n, s.k, p.w.scale};
  float amax = 0.0f;  // a calibrated static input_scale: amax / (6 · 448)
  for (float v : p.x) amax = std::max(amax, std::fabs(v));
  const float input_scale = amax / 2688.0f;
  std::vector<float> expected(static_cast<size_t>(m * s.n));

  test::DeviceBuffer<uint16_t> d_x(p.x_bf16), d_workspace(static_cast<size_t>(s.n * s.k));
  test::DeviceNvfp4 d_w(p.w.packed, p.w.block_scales);
  test::DeviceBuffer<float> d_y(expected.size()), d_row_scales(static_cast<size_t>(m));
  test::DeviceBuffer<uint16_t> d_x_hat(p.x_bf16.size());
  cublasHandle_t handle;
  ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
  const cuda::DeviceNvfp4Weight w{d_w.packed.get(), d_w.scales.get(), s.n, s.k, p.w.scale};
  const cuda::GemmContext ctx{nullptr, handle, d_workspace.get(), static_cast<size_t>(s.n * s.k),
                              d_x_hat.get(), d_row_scales.get(), p.x_bf16.size()};
  const Status status = cuda::linear_nvfp4(d_x.get(), m, w, mode, input_scale, d_y.get(), backend, ctx);
  ASSERT_TRUE(status.is_ok()) << status.message();
  NIB_CUDA_CHECK(cudaDeviceSynchronize());
  cublasDestroy(handle);
  const std::vector<float> got = d_y.to_host();
  if (mode == formats::ActQuant::NONE) {
    ASSERT_TRUE(ref::linear_nvfp4(p.x.data(), m, view, mode, input_scale, expected.data()).is_ok());
  } else {
    // The quantization: the GPU's x̂ and row scales against the CPU quantizer's.
    const std::vector<uint16_t> x_hat_bits = d_x_hat.to_host();
    const std::vector<float> row_scales = d_row_scales.to_host();
    auto q = mode == formats::ActQuant::STATIC ? formats::quantize_activation_static(p.x, m, s.k, input_scale, "x")
                                               : formats::quantize_activation_per_token(p.x, m, s.k, "x");
    ASSERT_TRUE(q.is_ok());
    const formats::Nvfp4WeightView qv{q->packed.data(), q->block_scales.data(), m, s.k, 1.0f};
    std::vector<float> x_hat(p.x.size()), cpu_row(static_cast<size_t>(s.k));
    // Every difference must sit at a rounding boundary: x · out_scale (exact) within a few ulps of
    // an E2M1 midpoint. BF16 inputs land exactly on midpoints far more often than fp32 ones.
    size_t differing = 0;
    for (int64_t r = 0; r < m; ++r) {
      EXPECT_EQ(row_scales[r], q->row_scale(r)) << "row " << r;
      formats::decode_row_unscaled(qv, r, cpu_row.data());
      const float global = 1.0f / row_scales[r];
      for (int64_t c = 0; c < s.k; ++c) {
        x_hat[r * s.k + c] = formats::bf16_decode(x_hat_bits[r * s.k + c]);
        if (x_hat[r * s.k + c] == cpu_row[c]) continue;
        ++differing;
        const float block_scale = formats::e4m3_decode(q->block_scales[r * (s.k / 16) + c / 16]);
        const float out_scale = 1.0f / (block_scale * (1.0f / global));
        ASSERT_TRUE(test::near_e2m1_midpoint(std::fabs(p.x[r * s.k + c] * out_scale)))
            << "x̂ differs away from a rounding boundary at row " << r << " col " << c;
      }
    }
    std::printf("  x̂: %zu of %zu codes differ from the exact-division quantizer, all at rounding boundaries\n",
                differing, p.x.size());
    EXPECT_LE(differing, 16 + p.x.size() / 200) << "boundary differences should stay rare";
    // The GEMM on the GPU's x̂: row_scale · (x̂ · Ŵ) · weight_scale_2.
    ASSERT_TRUE(ref::linear_nvfp4(x_hat.data(), m, view, formats::ActQuant::NONE, 0.0f, expected.data()).is_ok());
    for (int64_t r = 0; r < m; ++r)
      for (int64_t n = 0; n < s.n; ++n) expected[r * s.n + n] *= row_scales[r];
  }

  double max_ref = 0, max_err = 0, sum_err = 0;
  for (float v : expected) max_ref = std::max(max_ref, double(std::fabs(v)));
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - expected[i]);
    max_err = std::max(max_err, err);
    sum_err += err;
  }
  const double max_rel = max_err / max_ref, mean_rel = sum_err / got.size() / max_ref;
  std::printf("linear_nvfp4 %-9s %-15s %-8s M=%-5lld N=%-5lld K=%-5lld max rel err %.2e mean %.2e\n",
              formats::act_quant_name(mode), kernel_name(backend), s.what, static_cast<long long>(m),
              static_cast<long long>(s.n), static_cast<long long>(s.k), max_rel, mean_rel);
  EXPECT_LT(max_rel, 1e-4) << s.what << " M=" << m;
}

// q, k and v (Qwen3-30B-A3B's shapes) on one x, as one skinny_linear (or skinny_linear_split) launch
// and as three; the split kernel also twice more, with the same bits (its k splits meet in a fixed order).
void check_three_weights(int64_t m, uint64_t seed, bool split = false) {
  const int64_t k = 2048, rows[3] = {4096, 512, 512};
  std::vector<Problem> problems;
  for (int i = 0; i < 3; ++i) problems.push_back(make_problem(m, {rows[i], k, "qkv"}, seed + i));
  test::DeviceBuffer<uint16_t> d_x(problems[0].x_bf16);
  std::vector<std::unique_ptr<test::DeviceNvfp4>> device_weights;
  std::vector<std::unique_ptr<test::DeviceBuffer<float>>> together, alone;
  std::vector<cuda::DeviceNvfp4Weight> w;
  for (int i = 0; i < 3; ++i) {
    device_weights.push_back(std::make_unique<test::DeviceNvfp4>(problems[i].w.packed, problems[i].w.block_scales));
    together.push_back(std::make_unique<test::DeviceBuffer<float>>(static_cast<size_t>(m * rows[i])));
    alone.push_back(std::make_unique<test::DeviceBuffer<float>>(static_cast<size_t>(m * rows[i])));
    w.push_back({device_weights[i]->packed.get(), device_weights[i]->scales.get(), rows[i], k, problems[i].w.scale});
  }
  const cuda::DeviceNvfp4Weight* weights[3] = {&w[0], &w[1], &w[2]};
  float* outs[3] = {together[0]->get(), together[1]->get(), together[2]->get()};
  auto run = [&](const cuda::DeviceNvfp4Weight* const* ws, float* const* o, int count) {
    return split ? cuda::skinny_linear_split(d_x.get(), m, ws, o, count, nullptr, nullptr)
                 : cuda::skinny_linear(d_x.get(), m, ws, o, count, nullptr, nullptr);
  };
  ASSERT_TRUE(run(weights, outs, 3).is_ok());
  for (int i = 0; i < 3; ++i) {
    float* out[1] = {alone[i]->get()};
    ASSERT_TRUE(run(&weights[i], out, 1).is_ok());
  }
  NIB_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<std::vector<float>> first;
  for (int i = 0; i < 3; ++i) {
    first.push_back(together[i]->to_host());
    EXPECT_EQ(first[i], alone[i]->to_host()) << "weight " << i << ", M=" << m;
    EXPECT_GT(*std::max_element(first[i].begin(), first[i].end()), 0.0f);  // not a run of zeros
  }
  if (!split) return;
  for (int again = 0; again < 2; ++again) {
    ASSERT_TRUE(run(weights, outs, 3).is_ok());
    NIB_CUDA_CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < 3; ++i) EXPECT_EQ(together[i]->to_host(), first[i]) << "weight " << i << ", M=" << m << ", run " << again + 2;
  }
}

const Shape SHAPES[] = {{4096, 2048, "q_proj"}, {512, 2048, "k_proj"}, {2048, 4096, "o_proj"},
                        {768, 2048, "gate"},    {2048, 768, "down"}};

TEST(CudaLinearNvfp4, FusedMatchesReferenceOnModelShapes) {
  NIB_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::test_seed("CudaLinearNvfp4.Fused");
  for (int64_t m : {1, 3, 8, 16})
    for (const Shape& s : SHAPES) check(m, s, DenseKernel::GEMV, seed + m);
  check(17, SHAPES[3], DenseKernel::GEMV, seed);  // past one M tile
}

TEST(CudaLinearNvfp4, SkinnyMatchesReferenceOnModelShapes) {
  NIB_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::test_seed("CudaLinearNvfp4.Skinny");
  // One and two n-tiles, token tiles past the first, and 64-row batches and one row more.
  for (int64_t m : {1, 3, 8, 9, 16, 33, 64, 65})
    for (const Shape& s : SHAPES) check(m, s, DenseKernel::SKINNY, seed + m);
  check(5, {40, 384, "odd rows"}, DenseKernel::SKINNY, seed);  // rows not a multiple of 16, 3 k-blocks
  check(24, {41, 640, "odd rows"}, DenseKernel::SKINNY, seed);  // two n-tiles, 5 k-blocks
  check(2, {24, 8192, "long k"}, DenseKernel::SKINNY, seed);    // 16 warps
  for (int64_t m : {1, 5, 12})  // ERNIE-4.5's dense down_proj: two k ranges, the second adding to y
    check(m, {2560, 12288, "k ranges"}, DenseKernel::SKINNY, seed + 100 + m);
}

// q, k and v as one launch give what three launches give, bit for bit (each row's sum is the same),
// with one n-tile (5 rows) and with three token tiles of two (40).
TEST(CudaLinearNvfp4, SkinnyThreeWeightsInOneLaunch) {
  NIB_SKIP_WITHOUT_GPU();
  for (int64_t m : {5, 40}) check_three_weights(m, test::test_seed("CudaLinearNvfp4.SkinnyThree") + m);
}

// The split-K kernel: every n-tile count (M 1 … 64), weights whose rows are not a multiple of 16 or
// 128, k of one partial split (3 k-blocks: a cluster of one), two splits the second of one block (5),
// 16 and 24 splits (clusters of 8 ranks taking two and three splits each).
TEST(CudaLinearNvfp4, SkinnySplitMatchesReferenceOnModelShapes) {
  NIB_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::test_seed("CudaLinearNvfp4.SkinnySplit");
  for (int64_t m : {1, 9, 16, 17, 33, 48, 64})
    for (const Shape& s : SHAPES) check(m, s, DenseKernel::SKINNY_SPLIT, seed + m);
  check(5, {40, 384, "odd rows"}, DenseKernel::SKINNY_SPLIT, seed);
  check(24, {41, 640, "odd rows"}, DenseKernel::SKINNY_SPLIT, seed);
  check(37, {200, 8192, "long k"}, DenseKernel::SKINNY_SPLIT, seed);
  check(12, {2560, 12288, "ERNIE down"}, DenseKernel::SKINNY_SPLIT, seed);
  check(40, SHAPES[0], DenseKernel::AUTO, seed);  // AUTO takes it at 17-40 rows
}

// q/k/v in one split launch: the bits of three launches, the same again on reruns.
TEST(CudaLinearNvfp4, SkinnySplitThreeWeightsInOneLaunch) {
  NIB_SKIP_WITHOUT_GPU();
  for (int64_t m : {3, 40, 64}) check_three_weights(m, test::test_seed("CudaLinearNvfp4.SkinnySplitThree") + m, true);
}

// One W4A4 token on the skinny backend quantizes inside the GEMM (skinny_linear_quantizing); that
// must be bit for bit the separate quantize launch followed by the GEMM on its x̂: the same x̂ and
// row scale written back, the same outputs (the same per-warp sums, the same epilogue product), for
// one weight and for q/k/v in one launch, in both modes.
TEST(CudaLinearNvfp4, QuantizingSkinnyIsTheQuantizeThenTheGemm) {
  NIB_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::test_seed("CudaLinearNvfp4.QuantizingSkinny");
  struct Case {
    int64_t k;
    std::vector<int64_t> rows;
  };
  const Case cases[] = {{4096, {2048}}, {2048, {4096, 512, 512}}, {768, {2048}}, {8192, {24}}};
  for (formats::ActQuant mode : {formats::ActQuant::STATIC, formats::ActQuant::PER_TOKEN}) {
    for (const Case& c : cases) {
      const int count = int(c.rows.size());
      std::vector<Problem> problems;
      for (int i = 0; i < count; ++i) problems.push_back(make_problem(1, {c.rows[i], c.k, "w"}, seed + 7 * i + c.k));
      float amax = 0.0f;
      for (float v : problems[0].x) amax = std::max(amax, std::fabs(v));
      const float input_scale = amax / 2688.0f;
      test::DeviceBuffer<uint16_t> d_x(problems[0].x_bf16), d_x_hat_fused(size_t(c.k)), d_x_hat_chain(size_t(c.k));
      test::DeviceBuffer<float> d_scale_fused(1), d_scale_chain(1);
      std::vector<std::unique_ptr<test::DeviceNvfp4>> device_weights;
      std::vector<std::unique_ptr<test::DeviceBuffer<float>>> fused, chain;
      std::vector<cuda::DeviceNvfp4Weight> w;
      for (int i = 0; i < count; ++i) {
        device_weights.push_back(std::make_unique<test::DeviceNvfp4>(problems[i].w.packed, problems[i].w.block_scales));
        fused.push_back(std::make_unique<test::DeviceBuffer<float>>(size_t(c.rows[i])));
        chain.push_back(std::make_unique<test::DeviceBuffer<float>>(size_t(c.rows[i])));
        w.push_back({device_weights[i]->packed.get(), device_weights[i]->scales.get(), c.rows[i], c.k, problems[i].w.scale});
      }
      std::vector<const cuda::DeviceNvfp4Weight*> weights;
      std::vector<float*> fused_out, chain_out;
      for (int i = 0; i < count; ++i) weights.push_back(&w[i]), fused_out.push_back(fused[i]->get()), chain_out.push_back(chain[i]->get());
      const cuda::GemmContext fused_ctx{nullptr, nullptr, nullptr, 0, d_x_hat_fused.get(), d_scale_fused.get(), size_t(c.k)};
      const cuda::GemmContext chain_ctx{nullptr, nullptr, nullptr, 0, d_x_hat_chain.get(), d_scale_chain.get(), size_t(c.k)};
      const float scale = mode == formats::ActQuant::STATIC ? input_scale : 0.0f;
      // The fused path (x not yet quantized), and the chain: the quantize launch, then the GEMM told x̂ is ready.
      const Status s = cuda::linear_nvfp4_shared_input(d_x.get(), 1, weights.data(), fused_out.data(), count, mode,
                                                       input_scale, DenseKernel::SKINNY, fused_ctx);
      ASSERT_TRUE(s.is_ok()) << s.message();
      const Status quantized =
          cuda::quantize_dequantize_activation_bf16(d_x.get(), 1, c.k, scale, d_x_hat_chain.get(), d_scale_chain.get(), nullptr);
      ASSERT_TRUE(quantized.is_ok()) << quantized.message();
      const Status gemm = cuda::linear_nvfp4_shared_input(d_x.get(), 1, weights.data(), chain_out.data(), count, mode, input_scale,
                                                          DenseKernel::SKINNY, chain_ctx, /*x_quantized=*/true);
      ASSERT_TRUE(gemm.is_ok()) << gemm.message();
      NIB_CUDA_CHECK(cudaDeviceSynchronize());
      const std::string what = std::string(formats::act_quant_name(mode)) + " K=" + std::to_string(c.k) +
                               " weights=" + std::to_string(count);
      EXPECT_EQ(d_x_hat_fused.to_host(), d_x_hat_chain.to_host()) << what;
      EXPECT_EQ(d_scale_fused.to_host(), d_scale_chain.to_host()) << what;
      for (int i = 0; i < count; ++i) {
        const std::vector<float> got = fused[i]->to_host(), expected = chain[i]->to_host();
        EXPECT_EQ(got, expected) << what << ", weight " << i;
        EXPECT_GT(*std::max_element(expected.begin(), expected.end()), 0.0f) << what;  // not a run of zeros
      }
      std::printf("  quantizing skinny %-9s K=%-5lld %d weight(s): x̂, row scale and outputs as the chain's\n",
                  formats::act_quant_name(mode), static_cast<long long>(c.k), count);
    }
  }
}

TEST(CudaLinearNvfp4, DequantCublasMatchesReferenceOnModelShapes) {
  NIB_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::test_seed("CudaLinearNvfp4.DequantCublas");
  for (int64_t m : {1, 17, 255})
    for (const Shape& s : SHAPES) check(m, s, DenseKernel::CUBLAS, seed + m);
  check(4099, SHAPES[4], DenseKernel::CUBLAS, seed);
  check(4099, SHAPES[4], DenseKernel::AUTO, seed + 1);
}

TEST(CudaLinearNvfp4, WgmmaMatchesReferenceOnModelShapes) {
  NIB_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::test_seed("CudaLinearNvfp4.Wgmma");
  for (int64_t m : {1, 8, 40, 129, 300})  // tile heights 32, 64, 128, 256 (a partial one at 300)
    for (const Shape& s : SHAPES) check(m, s, DenseKernel::WGMMA, seed + m);
  check(4099, SHAPES[2], DenseKernel::WGMMA, seed);
  check(70, {200, 192, "partial weight tile"}, DenseKernel::WGMMA, seed);  // 200 of 256 rows, 3 k-steps
  check(9, {41, 128, "odd rows"}, DenseKernel::WGMMA, seed);  // 41 of 128 weight rows
  check(9, {40, 96, "k not a multiple of 64"}, DenseKernel::WGMMA, seed);  // falls back to AUTO's kernel
}

TEST(CudaLinearNvfp4, W4A4ModesMatchReference) {
  NIB_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::test_seed("CudaLinearNvfp4.W4A4");
  for (formats::ActQuant mode : {formats::ActQuant::STATIC, formats::ActQuant::PER_TOKEN})
    for (DenseKernel backend : {DenseKernel::GEMV, DenseKernel::CUBLAS, DenseKernel::SKINNY,
                                      DenseKernel::WGMMA, DenseKernel::SKINNY_SPLIT})
      for (int64_t m : {1, 3, 16})
        for (const Shape& s : SHAPES) check(m, s, backend, seed + m, mode);
  check(40, SHAPES[2], DenseKernel::SKINNY, seed, formats::ActQuant::PER_TOKEN);  // row scales past the first token tile
  check(40, SHAPES[2], DenseKernel::SKINNY_SPLIT, seed, formats::ActQuant::PER_TOKEN);
  check(64, SHAPES[0], DenseKernel::SKINNY_SPLIT, seed, formats::ActQuant::STATIC);
  check(255, SHAPES[0], DenseKernel::AUTO, seed, formats::ActQuant::PER_TOKEN);
  check(3, {2560, 12288, "k ranges"}, DenseKernel::SKINNY, seed, formats::ActQuant::PER_TOKEN);  // row scales per range
  check(4099, SHAPES[4], DenseKernel::AUTO, seed, formats::ActQuant::STATIC);
}

TEST(CudaLinearNvfp4, BadShapesAreErrors) {
  NIB_SKIP_WITHOUT_GPU();
  const cuda::DeviceNvfp4Weight odd{reinterpret_cast<const uint8_t*>(16), reinterpret_cast<const uint8_t*>(16), 8, 40,
                                    1.0f};
  const cuda::GemmContext ctx{};
  const Status s = cuda::linear_nvfp4_w4a16(reinterpret_cast<const uint16_t*>(16), 1, odd,
                                            reinterpret_cast<float*>(16), DenseKernel::GEMV, ctx);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("multiple of 32"), std::string::npos) << s.message();
  const cuda::DeviceNvfp4Weight ok{reinterpret_cast<const uint8_t*>(16), reinterpret_cast<const uint8_t*>(16), 8, 64,
                                   1.0f};
  const Status no_handle = cuda::linear_nvfp4_w4a16(reinterpret_cast<const uint16_t*>(16), 32, ok,
                                                    reinterpret_cast<float*>(16), DenseKernel::AUTO, ctx);
  EXPECT_NE(no_handle.message().find("cuBLAS"), std::string::npos) << no_handle.message();
}

}  // namespace

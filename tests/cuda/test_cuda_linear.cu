// cuda::linear_nvfp4_w4a16 (both backends) against ref::linear_nvfp4 (mode NONE) on Qwen3-30B-A3B
// shapes (q/k/v/o 2048↔4096/512, expert gate/up 768×2048, down 2048×768) and odd M (1, 3, 17, 255,
// 4099), with fresh seeded weights quantized as ModelOpt does and BF16 activations; prints max and
// mean relative error. Tolerance 1e-4 of max|y|: both sides multiply the same exact values (BF16 x,
// Ŵ = e2m1·e4m3) and differ only in fp32 summation order over K ≤ 4096 terms (~sqrt(K)·2⁻²⁴ ≈ 4e-6).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cuda/linear_nvfp4.cuh"
#include "cuda_test_util.cuh"
#include "formats/bf16.h"
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

void check(int64_t m, const Shape& s, cuda::GemmBackend backend, uint64_t seed) {
  const Problem p = make_problem(m, s, seed);
  const formats::Nvfp4WeightView view{p.w.packed.data(), p.w.block_scales.data(), s.n, s.k, p.w.scale};
  std::vector<float> expected(static_cast<size_t>(m * s.n));
  ASSERT_TRUE(ref::linear_nvfp4(p.x.data(), m, view, formats::ActQuant::NONE, 0.0f, expected.data()).is_ok());

  test::DeviceBuffer<uint16_t> d_x(p.x_bf16), d_workspace(static_cast<size_t>(s.n * s.k));
  test::DeviceBuffer<uint8_t> d_packed(p.w.packed), d_scales(p.w.block_scales);
  test::DeviceBuffer<float> d_y(expected.size());
  cublasHandle_t handle;
  ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
  const cuda::DeviceNvfp4Weight w{d_packed.get(), d_scales.get(), s.n, s.k, p.w.scale};
  const cuda::GemmContext ctx{nullptr, handle, d_workspace.get(), static_cast<size_t>(s.n * s.k)};
  const Status status = cuda::linear_nvfp4_w4a16(d_x.get(), m, w, d_y.get(), backend, ctx);
  ASSERT_TRUE(status.is_ok()) << status.message();
  NIB_CUDA_CHECK(cudaDeviceSynchronize());
  cublasDestroy(handle);
  const std::vector<float> got = d_y.to_host();

  double max_ref = 0, max_err = 0, sum_err = 0;
  for (float v : expected) max_ref = std::max(max_ref, double(std::fabs(v)));
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - expected[i]);
    max_err = std::max(max_err, err);
    sum_err += err;
  }
  const double max_rel = max_err / max_ref, mean_rel = sum_err / got.size() / max_ref;
  std::printf("linear_nvfp4 %-15s %-8s M=%-5lld N=%-5lld K=%-5lld max rel err %.2e mean %.2e\n",
              cuda::gemm_backend_name(backend), s.what, static_cast<long long>(m), static_cast<long long>(s.n),
              static_cast<long long>(s.k), max_rel, mean_rel);
  EXPECT_LT(max_rel, 1e-4) << s.what << " M=" << m;
}

const Shape SHAPES[] = {{4096, 2048, "q_proj"}, {512, 2048, "k_proj"}, {2048, 4096, "o_proj"},
                        {768, 2048, "gate"},    {2048, 768, "down"}};

TEST(CudaLinearNvfp4, FusedMatchesReferenceOnModelShapes) {
  NIB_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::test_seed("CudaLinearNvfp4.Fused");
  for (int64_t m : {1, 3, 8, 16})
    for (const Shape& s : SHAPES) check(m, s, cuda::GemmBackend::FUSED, seed + m);
  check(17, SHAPES[3], cuda::GemmBackend::FUSED, seed);  // past one M tile
}

TEST(CudaLinearNvfp4, DequantCublasMatchesReferenceOnModelShapes) {
  NIB_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::test_seed("CudaLinearNvfp4.DequantCublas");
  for (int64_t m : {1, 17, 255})
    for (const Shape& s : SHAPES) check(m, s, cuda::GemmBackend::DEQUANT_CUBLAS, seed + m);
  check(4099, SHAPES[4], cuda::GemmBackend::DEQUANT_CUBLAS, seed);
  check(4099, SHAPES[4], cuda::GemmBackend::AUTO, seed + 1);
}

TEST(CudaLinearNvfp4, BadShapesAreErrors) {
  NIB_SKIP_WITHOUT_GPU();
  const cuda::DeviceNvfp4Weight odd{reinterpret_cast<const uint8_t*>(16), reinterpret_cast<const uint8_t*>(16), 8, 40,
                                    1.0f};
  const cuda::GemmContext ctx{};
  const Status s = cuda::linear_nvfp4_w4a16(reinterpret_cast<const uint16_t*>(16), 1, odd,
                                            reinterpret_cast<float*>(16), cuda::GemmBackend::FUSED, ctx);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("multiple of 32"), std::string::npos) << s.message();
  const cuda::DeviceNvfp4Weight ok{reinterpret_cast<const uint8_t*>(16), reinterpret_cast<const uint8_t*>(16), 8, 64,
                                   1.0f};
  const Status no_handle = cuda::linear_nvfp4_w4a16(reinterpret_cast<const uint16_t*>(16), 32, ok,
                                                    reinterpret_cast<float*>(16), cuda::GemmBackend::AUTO, ctx);
  EXPECT_NE(no_handle.message().find("cuBLAS"), std::string::npos) << no_handle.message();
}

}  // namespace

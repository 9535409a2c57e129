// cuda::skinny_qkv_rope_store against the chain it replaces — skinny_linear of q, k and v, then
// qk_norm_rope_store into FlashInfer's BF16 q and the paged cache — bit for bit: both sides compute
// the same fp32 y rows in the same order and run the same head code on them. Seeded random NVFP4
// weights (ModelOpt's quantizer) and BF16 x; Qwen3-30B-A3B's q/k/v (head_dim 128) and a head_dim 64
// shape; 1 to 8 tokens at scattered slots and positions up to ~5k; neox and interleaved RoPE, with
// and without q/k norms, with W4A4's row scales, BF16 and FP8 caches.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/gemm/skinny_gemm.cuh"
#include "cuda/gemm/skinny_qkv_rope.cuh"
#include "cuda_test_util.cuh"
#include "formats/bf16.h"
#include "formats/nvfp4.h"
#include "ref/ops.h"
#include "test_seed.h"

using namespace nibble;

namespace {

struct Case {
  int64_t m, nh, nkv, d, k;
  bool interleaved, norms, row_scales, fp8;
};

void check(const Case& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t rows[3] = {c.nh * c.d, c.nkv * c.d, c.nkv * c.d};
  std::vector<std::unique_ptr<test::DeviceNvfp4>> uploads;
  std::vector<cuda::DeviceNvfp4Weight> weights;
  for (int64_t n : rows) {
    auto q = formats::quantize_weight(test::random_f32(size_t(n * c.k), rng, 0.02f), n, c.k, "w");
    ASSERT_TRUE(q.is_ok());
    uploads.push_back(std::make_unique<test::DeviceNvfp4>(q->packed, q->block_scales));
    weights.push_back({uploads.back()->packed.get(), uploads.back()->scales.get(), n, c.k, q->scale});
  }
  const cuda::DeviceNvfp4Weight* qkv[3] = {&weights[0], &weights[1], &weights[2]};
  std::vector<uint16_t> x(size_t(c.m * c.k));
  for (auto& v : x) v = formats::bf16_encode(std::normal_distribution<float>(0.0f, 1.0f)(rng));
  std::vector<float> row_scales(size_t(c.m));
  for (auto& s : row_scales) s = std::uniform_real_distribution<float>(0.001f, 0.01f)(rng);
  std::vector<uint16_t> q_norm(size_t(c.d)), k_norm(size_t(c.d));
  for (auto& v : q_norm) v = formats::bf16_encode(std::uniform_real_distribution<float>(0.5f, 1.5f)(rng));
  for (auto& v : k_norm) v = formats::bf16_encode(std::uniform_real_distribution<float>(0.5f, 1.5f)(rng));
  // A YaRN-shaped table: the slow half of the pairs interpolated, cos and sin scaled.
  ref::Rope rope{ref::rope_inv_freq(1e6, c.d), 1.1386294f};
  for (size_t i = rope.inv_freq.size() / 2; i < rope.inv_freq.size(); ++i) rope.inv_freq[i] /= 4.0f;
  const int64_t slots_total = 64 * 16;
  std::vector<int32_t> positions(size_t(c.m));
  std::vector<int64_t> slots(size_t(c.m));
  for (int64_t t = 0; t < c.m; ++t)
    positions[t] = int32_t(rng() % 5000), slots[t] = int64_t((t * 131 + rng() % 97) % slots_total);
  const size_t kv_bytes = size_t(slots_total * c.nkv * c.d) * (c.fp8 ? 1 : 2);
  std::vector<uint8_t> cache_init(kv_bytes);
  for (auto& b : cache_init) b = uint8_t(rng());  // untouched slots must stay as they were

  test::DeviceBuffer<uint16_t> d_x(x), d_qn(q_norm), d_kn(k_norm);
  test::DeviceBuffer<float> d_rs(row_scales), d_freq(rope.inv_freq);
  test::DeviceBuffer<int32_t> d_pos(positions);
  test::DeviceBuffer<int64_t> d_slots(slots);
  test::DeviceBuffer<float> d_q(size_t(c.m * rows[0])), d_k(size_t(c.m * rows[1])), d_v(size_t(c.m * rows[2]));
  test::DeviceBuffer<uint16_t> q_chain(size_t(c.m * rows[0])), q_fused(size_t(c.m * rows[0]));
  test::DeviceBuffer<uint8_t> kc_chain(cache_init), vc_chain(cache_init), kc_fused(cache_init), vc_fused(cache_init);
  const cuda::QkvLayout layout{c.m, c.nh, c.nkv, c.d, d_pos.get(), d_slots.get(), d_freq.get(), c.interleaved,
                               rope.attention_scaling};
  const float* rs = c.row_scales ? d_rs.get() : nullptr;
  const uint16_t* qn = c.norms ? d_qn.get() : nullptr;
  const uint16_t* kn = c.norms ? d_kn.get() : nullptr;
  const cuda::KvFormat format = c.fp8 ? cuda::KvFormat::FP8 : cuda::KvFormat::BF16;
  const float k_scale = c.fp8 ? 0.031f : 1.0f, v_scale = c.fp8 ? 0.017f : 1.0f;

  float* outputs[3] = {d_q.get(), d_k.get(), d_v.get()};
  ASSERT_TRUE(cuda::skinny_linear(d_x.get(), c.m, qkv, outputs, 3, rs, nullptr).is_ok());
  ASSERT_TRUE(cuda::qk_norm_rope_store({d_q.get(), d_k.get(), d_v.get()}, layout, qn, kn, 1e-6f, nullptr,
                                       kc_chain.get(), vc_chain.get(), nullptr, q_chain.get(), format, k_scale, v_scale)
                  .is_ok());
  const cuda::QkvRopeStore out{layout, qn, kn, 1e-6f, q_fused.get(), kc_fused.get(), vc_fused.get(), format, k_scale,
                               v_scale};
  const Status fused = cuda::skinny_qkv_rope_store(d_x.get(), c.m, qkv, rs, out, nullptr);
  ASSERT_TRUE(fused.is_ok()) << fused.message();
  NIB_CUDA_CHECK(cudaDeviceSynchronize());

  const auto qa = q_chain.to_host(), qb = q_fused.to_host();
  size_t q_diff = 0;
  for (size_t i = 0; i < qa.size(); ++i) q_diff += qa[i] != qb[i];
  EXPECT_EQ(q_diff, 0u) << "q after norm and RoPE: " << q_diff << " of " << qa.size() << " values differ";
  EXPECT_EQ(kc_chain.to_host(), kc_fused.to_host()) << "the K cache";
  EXPECT_EQ(vc_chain.to_host(), vc_fused.to_host()) << "the V cache";
  size_t nonzero = 0;  // the comparison means something: q was written
  for (uint16_t b : qb) nonzero += (b & 0x7FFF) != 0;
  EXPECT_GT(nonzero, qb.size() / 2);
  std::printf("  M=%lld NH=%lld NKV=%lld D=%lld K=%lld %s norms=%d row_scales=%d %s: equal\n", (long long)c.m,
              (long long)c.nh, (long long)c.nkv, (long long)c.d, (long long)c.k, c.interleaved ? "interleaved" : "neox",
              c.norms, c.row_scales, c.fp8 ? "fp8" : "bf16");
}

TEST(CudaQkvRope, EqualsTheSkinnyGemmThenQkNormRopeStore) {
  NIB_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::test_seed("CudaQkvRope");
  uint64_t n = 0;
  for (int64_t m : {1, 2, 5, 8})
    check({m, 32, 4, 128, 2048, false, true, false, false}, seed + n++);  // Qwen3-30B-A3B, W4A16
  check({1, 32, 4, 128, 2048, false, true, true, false}, seed + n++);    // W4A4: x̂'s row scale
  check({2, 32, 4, 128, 2048, false, true, false, true}, seed + n++);    // FP8 cache
  check({3, 16, 2, 128, 1024, true, false, true, false}, seed + n++);    // ERNIE-like: interleaved, no q/k norm
  check({1, 8, 2, 64, 512, false, true, false, false}, seed + n++);  // head_dim 64: 4-CTA clusters, 2 blocks a warp
  check({8, 8, 2, 64, 4096, true, true, true, true}, seed + n++);
}

TEST(CudaQkvRope, RefusesWhatItCannotTake) {  // host-only
  EXPECT_FALSE(cuda::skinny_qkv_rope_supported(9, 2048, 128));   // more tokens than one n-tile
  EXPECT_FALSE(cuda::skinny_qkv_rope_supported(1, 2048, 256));   // a head wider than a portable cluster
  EXPECT_FALSE(cuda::skinny_qkv_rope_supported(1, 2000, 128));   // k not whole 128-blocks
  EXPECT_TRUE(cuda::skinny_qkv_rope_supported(1, 2048, 128));
  // Errors name what was wrong before anything reaches the device (the pointers are never read).
  alignas(16) static uint8_t fake[64];
  const cuda::DeviceNvfp4Weight q{fake, fake, 32 * 128, 2048, 1.0f}, kv{fake, fake, 4 * 128, 2048, 1.0f};
  const cuda::DeviceNvfp4Weight* qkv[3] = {&q, &kv, &kv};
  const int32_t* positions = reinterpret_cast<const int32_t*>(fake);
  const int64_t* slots = reinterpret_cast<const int64_t*>(fake);
  const float* freq = reinterpret_cast<const float*>(fake);
  cuda::QkvRopeStore out{{1, 32, 4, 128, positions, slots, freq}, nullptr, nullptr, 1e-6f,
                         reinterpret_cast<uint16_t*>(fake), fake, fake};
  const uint16_t* x = reinterpret_cast<const uint16_t*>(fake);
  EXPECT_TRUE(cuda::skinny_qkv_rope_store(x, 2, qkv, nullptr, out, nullptr).message().find("layout has 1") !=
              std::string::npos);
  out.layout.n_kv_heads = 8;
  EXPECT_TRUE(cuda::skinny_qkv_rope_store(x, 1, qkv, nullptr, out, nullptr).message().find("rows") !=
              std::string::npos);
  out.layout.n_kv_heads = 4, out.q_out_bf16 = reinterpret_cast<uint16_t*>(fake + 2);
  EXPECT_TRUE(cuda::skinny_qkv_rope_store(x, 1, qkv, nullptr, out, nullptr).message().find("aligned") !=
              std::string::npos);
  out.q_out_bf16 = nullptr;
  EXPECT_TRUE(cuda::skinny_qkv_rope_store(x, 1, qkv, nullptr, out, nullptr).message().find("null") !=
              std::string::npos);
}

}  // namespace

// The one-launch attention half of a decode layer (cuda::attention_decode_block) against the kernel
// chain it replaces — skinny q/k/v, qk_norm_rope_store, the one-launch decode attention, skinny
// o_proj, each tested against its ref:: twin in test_cuda_linear / test_cuda_ops — on Qwen3-30B-A3B's
// shapes, contexts from 1 to 5,000 keys (one split to every split, one to three blocks a warp), neox
// and interleaved RoPE, with and without q/k norms, W4A16 and both W4A4 modes, launched repeatedly on
// one barrier.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "cuda/attention_decode.cuh"
#include "cuda/decode_attention.cuh"
#include "cuda/quantize_nvfp4.cuh"
#include "cuda/skinny_gemm.cuh"
#include "cuda/transformer_ops.cuh"
#include "cuda_test_util.cuh"
#include "formats/bf16.h"
#include "formats/nvfp4.h"
#include "ref/ops.h"
#include "test_seed.h"

using namespace nibble;
using formats::bf16_decode;
using formats::bf16_encode;

namespace {

constexpr int64_t H = 2048, NH = 32, NKV = 4, D = 128, PAGE = 16;

std::vector<uint16_t> random_bf16(size_t n, std::mt19937_64& rng, float mean, float sd) {
  std::normal_distribution<float> normal(mean, sd);
  std::vector<uint16_t> out(n);
  for (auto& v : out) v = bf16_encode(normal(rng));
  return out;
}

struct Weight {
  formats::Nvfp4Matrix host;
  std::unique_ptr<test::DeviceNvfp4> device;
  cuda::DeviceNvfp4Weight view;
};

Weight random_weight(int64_t rows, int64_t cols, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (float& v : w) v = normal(rng);
  auto q = formats::quantize_weight(w, rows, cols, "w");
  EXPECT_TRUE(q.is_ok());
  Weight out{std::move(q.value()), nullptr, {}};
  out.device = std::make_unique<test::DeviceNvfp4>(out.host.packed, out.host.block_scales);
  out.view = {out.device->packed.get(), out.device->scales.get(), rows, cols, out.host.scale};
  return out;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

std::vector<float> decode(const std::vector<uint16_t>& bits) {
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = bf16_decode(bits[i]);
  return out;
}

}  // namespace

TEST(CudaAttentionBlock, MatchesTheKernelChain) {
  NIB_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::test_seed("CudaAttentionBlock.MatchesTheKernelChain");
  std::mt19937_64 rng(seed);
  Weight q = random_weight(NH * D, H, rng), k = random_weight(NKV * D, H, rng), v = random_weight(NKV * D, H, rng),
         o = random_weight(H, NH * D, rng);
  const auto q_norm = random_bf16(D, rng, 1.0f, 0.1f), k_norm = random_bf16(D, rng, 1.0f, 0.1f);
  test::DeviceBuffer<uint16_t> d_qn(q_norm), d_kn(k_norm);
  test::DeviceBuffer<float> d_freq(ref::rope_inv_freq(1e6, D));
  const int64_t scratch_floats = cuda::attention_decode_workspace_floats({H, NH, NKV, D, PAGE});
  test::DeviceBuffer<float> d_scratch(static_cast<size_t>(scratch_floats));
  test::DeviceBuffer<uint16_t> d_block_attn(static_cast<size_t>(NH * D));
  test::DeviceBuffer<unsigned> d_barrier(std::vector<unsigned>{0, 0});

  using formats::ActQuant;
  struct Case {
    int64_t cached;  // keys before the new one
    bool interleaved, norms;
    ActQuant mode = ActQuant::NONE;
  };
  const Case cases[] = {{0, false, true},    {1, false, true},    {15, false, true},  {16, false, true},
                        {100, false, true},  {127, false, true},  {129, false, true}, {500, false, true},
                        {1000, false, true}, {3000, false, true}, {5000, false, true}, {200, true, false},
                        {2047, true, true},  {1000, false, true, ActQuant::STATIC},   {130, false, true, ActQuant::PER_TOKEN},
                        {3000, false, true, ActQuant::PER_TOKEN}};
  const float x_input_scale = 4.0f / 2688.0f, o_input_scale = 3.0f / 2688.0f;  // calibrated-like: amax / (6 · 448)
  for (const Case& c : cases) {
    const int64_t ctx = c.cached + 1, pages = (ctx + PAGE - 1) / PAGE + 3;  // spare pages the step must not touch
    const int64_t kv_width = NKV * D, max_blocks = pages;
    const auto k_cache = random_bf16(size_t(pages * PAGE * kv_width), rng, 0.0f, 1.0f);
    const auto v_cache = random_bf16(k_cache.size(), rng, 0.0f, 1.0f);
    std::vector<int32_t> table(static_cast<size_t>(pages));
    for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t(i);
    std::shuffle(table.begin(), table.end(), rng);
    const int32_t position = int32_t(c.cached);
    const int64_t slot = int64_t{table[size_t(position / PAGE)]} * PAGE + position % PAGE;
    const auto x = random_bf16(size_t(H), rng, 0.0f, 1.0f);
    test::DeviceBuffer<uint16_t> d_x(x), d_kc(k_cache), d_vc(v_cache), d_kc2(k_cache), d_vc2(v_cache);
    test::DeviceBuffer<int32_t> d_pos(std::vector<int32_t>{position}), d_seq(std::vector<int32_t>{0}), d_table(table);
    test::DeviceBuffer<int64_t> d_slot(std::vector<int64_t>{slot});
    const uint16_t* qn = c.norms ? d_qn.get() : nullptr;
    const uint16_t* kn = c.norms ? d_kn.get() : nullptr;

    // The chain, as the runner runs it for a decode row (W4A4: x̂ and its row scale as the input
    // norm writes them, quantize_dequantize_activation_bf16's).
    const bool w4a4 = c.mode != ActQuant::NONE;
    test::DeviceBuffer<float> d_q{size_t(NH * D)}, d_k{size_t(kv_width)}, d_v{size_t(kv_width)}, d_out{size_t(H)};
    test::DeviceBuffer<uint16_t> d_qb{size_t(NH * D)}, d_attn{size_t(NH * D)}, d_xhat{size_t(H)}, d_ohat{size_t(NH * D)};
    test::DeviceBuffer<float> d_row_scale(1), d_o_row_scale(1);
    if (w4a4)
      ASSERT_TRUE(cuda::quantize_dequantize_activation_bf16(d_x.get(), 1, H, c.mode == ActQuant::STATIC ? x_input_scale : 0.0f,
                                                            d_xhat.get(), d_row_scale.get(), nullptr)
                      .is_ok());
    const uint16_t* qkv_in = w4a4 ? d_xhat.get() : d_x.get();
    const cuda::DeviceNvfp4Weight* qkv_w[3] = {&q.view, &k.view, &v.view};
    float* qkv_out[3] = {d_q.get(), d_k.get(), d_v.get()};
    ASSERT_TRUE(cuda::skinny_linear(qkv_in, 1, qkv_w, qkv_out, 3, w4a4 ? d_row_scale.get() : nullptr, nullptr).is_ok());
    const cuda::QkvLayout layout{1, NH, NKV, D, d_pos.get(), d_slot.get(), d_freq.get(), c.interleaved};
    ASSERT_TRUE(cuda::qk_norm_rope_store({d_q.get(), d_k.get(), d_v.get()}, layout, qn, kn, 1e-6f, nullptr, d_kc.get(),
                                         d_vc.get(), nullptr, d_qb.get())
                    .is_ok());
    const cuda::DecodeAttentionBatch db{1, NH, NKV, D, PAGE, d_seq.get(), d_pos.get(), d_table.get(), max_blocks,
                                        cuda::decode_attention_splits(1, NKV, 132)};
    ASSERT_TRUE(cuda::decode_attention(d_qb.get(), d_kc.get(), d_vc.get(), db, d_attn.get(), nullptr).is_ok());
    const cuda::GemmContext gemm{nullptr, nullptr, nullptr, 0, d_ohat.get(), d_o_row_scale.get(), size_t(NH * D)};
    ASSERT_TRUE(cuda::linear_nvfp4(d_attn.get(), 1, o.view, c.mode, o_input_scale, d_out.get(), cuda::GemmBackend::SKINNY, gemm)
                    .is_ok());

    // The block, three launches on one barrier (the generations count on), each the same.
    const cuda::AttentionDecodeWeights weights{&q.view, &k.view, &v.view, &o.view, qn, kn, o_input_scale};
    const cuda::AttentionDecodeStep step{H, NH, NKV, D, PAGE, d_pos.get(), d_slot.get(), d_seq.get(), d_table.get(),
                                         max_blocks, d_freq.get(), c.interleaved, 1e-6f, c.mode, d_row_scale.get()};
    ASSERT_TRUE(cuda::attention_decode_block_supported(weights, step)) << "Qwen3-30B-A3B's attention on this GPU";
    const cuda::AttentionDecodeWorkspace ws{d_scratch.get(), d_block_attn.get(), d_barrier.get()};
    std::vector<std::vector<float>> outs;
    for (int launch = 0; launch < 3; ++launch) {
      test::DeviceBuffer<float> d_out2{size_t(H)};
      ASSERT_TRUE(cuda::attention_decode_block(qkv_in, weights, step, d_kc2.get(), d_vc2.get(), ws, d_out2.get(), nullptr).is_ok());
      NIB_CUDA_CHECK(cudaDeviceSynchronize());
      outs.push_back(d_out2.to_host());
    }
    EXPECT_EQ(outs[1], outs[0]) << "a second launch on the same barrier";
    EXPECT_EQ(outs[2], outs[0]) << "a third launch on the same barrier";

    // The cache: only the new slot changes; K and V there are the BF16 of fp32 projections that
    // differ from the chain's by summation order (~1e-6 relative): equal or one BF16 ulp apart.
    const auto kc = d_kc.to_host(), vc = d_vc.to_host(), kc2 = d_kc2.to_host(), vc2 = d_vc2.to_host();
    size_t changed = 0;
    for (size_t i = 0; i < kc.size(); ++i) {
      const bool at_slot = int64_t(i) / kv_width == slot;
      if (!at_slot) {
        changed += kc2[i] != k_cache[i] || vc2[i] != v_cache[i];
        continue;
      }
      for (auto [a, b] : {std::pair{kc[i], kc2[i]}, std::pair{vc[i], vc2[i]}})
        EXPECT_LE(std::fabs(bf16_decode(a) - bf16_decode(b)), std::fabs(bf16_decode(a)) / 128 + 1e-30f)
            << "new K/V element " << i % kv_width << ", context " << ctx;
    }
    EXPECT_EQ(changed, 0u) << "cache entries outside the new slot changed, context " << ctx;

    // The attention output: both are mixes of the same V rows (|v| ≲ 4) under softmaxes that differ
    // by summation order and split merges (~1e-6) and by q's BF16 rounding where the projections
    // differ by an ulp: within the attention test's bound, 8e-3 of max|out|.
    const auto attn = decode(d_attn.to_host()), attn2 = decode(d_block_attn.to_host());
    const double attn_err = max_diff(attn2, attn), attn_max = max_abs(attn);
    EXPECT_LE(attn_err, 8e-3 * attn_max) << "attention output, context " << ctx;
    // The o projection of inputs that agree to ~1e-3 relative: a sum of 4,096 products of random
    // sign whose inputs' differences add incoherently: far below 1e-2 of max|out|. W4A4: where an
    // input sits at an E2M1 rounding edge, an ulp moves its x̂ by a whole step (up to a third of
    // its block's amax), and a block's amax can move all 16 of its values: a few such inputs of
    // 4,096 stay within 3e-2.
    const auto out = d_out.to_host();
    const double out_err = max_diff(outs[0], out), out_max = max_abs(out);
    std::printf("context %lld%s%s%s: attention max error %.2e of max %.2f; o projection max error %.2e of max %.3f\n",
                (long long)ctx, c.interleaved ? " (interleaved RoPE)" : "", c.norms ? "" : " (no q/k norm)",
                c.mode == ActQuant::STATIC ? " (static W4A4)" : c.mode == ActQuant::PER_TOKEN ? " (per-token W4A4)" : "",
                attn_err, attn_max, out_err, out_max);
    EXPECT_LE(out_err, (w4a4 ? 3e-2 : 1e-2) * out_max) << "o projection output, context " << ctx;
    EXPECT_GT(out_max, 0.0) << "a real output";
  }
}

TEST(CudaAttentionBlock, UnsupportedShapesAreRefused) {
  NIB_SKIP_WITHOUT_GPU();
  cuda::DeviceNvfp4Weight q{reinterpret_cast<const uint8_t*>(256), reinterpret_cast<const uint8_t*>(256), NH * D, H, 1.0f};
  cuda::DeviceNvfp4Weight kv{q.packed, q.block_scales, NKV * D, H, 1.0f}, o{q.packed, q.block_scales, H, NH * D, 1.0f};
  const cuda::AttentionDecodeWeights w{&q, &kv, &kv, &o, nullptr, nullptr};
  cuda::AttentionDecodeStep step{H, NH, NKV, D, PAGE};
  EXPECT_TRUE(cuda::attention_decode_block_supported(w, step));
  cuda::AttentionDecodeStep bad = step;
  bad.head_dim = 64;
  EXPECT_FALSE(cuda::attention_decode_block_supported(w, bad)) << "head_dim 64";
  bad = step, bad.page_size = 8;
  EXPECT_FALSE(cuda::attention_decode_block_supported(w, bad)) << "pages of 8 tokens";
  bad = step, bad.hidden = 2560;
  EXPECT_FALSE(cuda::attention_decode_block_supported(w, bad)) << "weights of another hidden size";
  cuda::DeviceNvfp4Weight wide_q = q, wide_kv = kv, wide_o = o;  // ERNIE-4.5-21B-A3B: 160 CTAs, more than the SMs
  wide_q.rows = 20 * D, wide_q.cols = wide_kv.cols = wide_o.rows = 2560, wide_o.cols = 20 * D;
  const cuda::AttentionDecodeWeights ernie{&wide_q, &wide_kv, &wide_kv, &wide_o, nullptr, nullptr};
  EXPECT_FALSE(cuda::attention_decode_block_supported(ernie, {2560, 20, NKV, D, PAGE})) << "hidden 2560: 160 CTAs";
  bad = step, bad.act_quant = formats::ActQuant::STATIC;
  EXPECT_FALSE(cuda::attention_decode_block_supported(w, bad)) << "static W4A4 without the o projection's input scale";
  const cuda::AttentionDecodeWeights no_o{&q, &kv, &kv, nullptr, nullptr, nullptr};
  EXPECT_FALSE(cuda::attention_decode_block_supported(no_o, step)) << "no o projection";
  EXPECT_FALSE(cuda::attention_decode_block(nullptr, no_o, step, nullptr, nullptr, {}, nullptr, nullptr).is_ok());
}

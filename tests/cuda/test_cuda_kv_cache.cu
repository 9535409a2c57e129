// The KV cache's other forms and FlashInfer's planning beside their ref:: twins: an FP8 E4M3 cache
// written by qk_norm_rope_store and read by FlashInfer's FA2 kernels, and decode graphs replayed
// under plans for other contexts. (The BF16 cache's ops are in test_cuda_ops.cu.)
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cuda/attention/flashinfer_attention.cuh"
#include "cuda/ops/transformer_ops.cuh"
#include "cuda_test_util.cuh"
#include "formats/bf16.h"
#include "formats/e4m3.h"
#include "ref/attention.h"
#include "ref/ops.h"
#include "test_seed.h"

using namespace nibble;
using formats::bf16_encode;
using test::decode;
using test::random_bf16;
using test::random_f32;

namespace {

// An FP8 E4M3 KV cache (--kv-cache-dtype fp8): the store writes the codes of the normed, rotated K
// and of V divided by their scales (round to nearest even, saturating: formats::e4m3_encode of the same
// fp32 values), and FlashInfer's FA2 kernels read them (scores × k_scale, outputs × v_scale), against
// ref::paged_attention over the same rounded cache; with unit and with calibrated scales.
TEST(CudaKvCache, Fp8KvCacheStoreAndFlashInfer) {
  NIB_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::test_seed("CudaKvCache.Fp8KvCacheStoreAndFlashInfer");
  std::mt19937_64 rng(seed);
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  struct Case {
    int64_t NH, NKV;
    std::vector<std::pair<int64_t, int64_t>> seqs;  // (cached tokens, new tokens)
  };
  const Case cases[] = {
      {32, 4, {{0, 37}, {100, 1}, {5, 1}, {33, 20}, {1023, 1}}},                // Qwen3-30B-A3B: prefill, decodes, a chunk
      {32, 4, {{3000, 1}}},                                                     // one long decode: split over CTAs
      {32, 4, {{999, 1}, {0, 1}, {15, 1}, {300, 1}, {2047, 1}}},               // decodes (also as a graph plan)
      {32, 4, {{999, 1}, {300, 1}, {17, 5}, {0, 700}, {64, 200}}},             // mixed: prompts stay on FA2
      {20, 4, {{100, 1}, {7, 1}, {0, 200}}},                                    // ERNIE-4.5: groups of 5
  };
  const int64_t D = 128, bs = 16;
  // Unit scales (--kv-cache-dtype fp8 alone) and a checkpoint's calibrated k_scale / v_scale.
  for (const auto& [k_scale, v_scale] : {std::pair{1.0f, 1.0f}, std::pair{0.0123f, 0.0071f}})
  for (const Case& c : cases) {
    int64_t T = 0, blocks = 0;
    for (auto [cached, fresh] : c.seqs) T += fresh, blocks += (cached + fresh + bs - 1) / bs;
    const int64_t kv_width = c.NKV * D;
    // The cached tokens' codes: E4M3 of normal values (|x| up to ~4: every binade down to subnormals).
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<uint8_t> k_codes(size_t(blocks * bs * kv_width)), v_codes(k_codes.size());
    for (uint8_t& b : k_codes) b = formats::e4m3_encode(normal(rng));
    for (uint8_t& b : v_codes) b = formats::e4m3_encode(normal(rng));
    std::vector<float> ref_k(k_codes.size()), ref_v(v_codes.size());
    for (size_t i = 0; i < k_codes.size(); ++i)
      ref_k[i] = formats::e4m3_decode(k_codes[i]) * k_scale, ref_v[i] = formats::e4m3_decode(v_codes[i]) * v_scale;
    std::vector<int32_t> pool(static_cast<size_t>(blocks));
    for (size_t i = 0; i < pool.size(); ++i) pool[i] = int32_t(i);
    std::shuffle(pool.begin(), pool.end(), rng);
    const auto q = random_f32(size_t(T * c.NH * D), rng, 1.0f), k = random_f32(size_t(T * kv_width), rng, 1.0f),
               v = random_f32(size_t(T * kv_width), rng, 1.0f);
    const auto q_norm = random_bf16(size_t(D), rng, 1.0f, 0.1f), k_norm = random_bf16(size_t(D), rng, 1.0f, 0.1f);
    ref::PagedKvLayer kv{ref_k.data(), ref_v.data(), blocks, bs, c.NKV, D, ref::KvRounding::FP8, k_scale, v_scale};
    std::vector<std::vector<int32_t>> tables;
    std::vector<ref::AttentionSequence> seqs;
    std::vector<int32_t> positions;
    std::vector<int64_t> slots, positions64;
    int64_t next_block = 0, offset = 0;
    bool decode_only = true;
    for (auto [cached, fresh] : c.seqs) {
      const int64_t n = (cached + fresh + bs - 1) / bs;
      tables.emplace_back(pool.begin() + next_block, pool.begin() + next_block + n);
      next_block += n;
      seqs.push_back({tables.back().data(), n, cached, fresh, offset});
      for (int64_t i = 0; i < fresh; ++i) {
        const int64_t p = cached + i;
        positions.push_back(int32_t(p)), positions64.push_back(p);
        slots.push_back(int64_t{tables.back()[p / bs]} * bs + p % bs);
      }
      offset += fresh, decode_only &= fresh == 1;
    }
    std::vector<float> rq = q, rk = k;
    ref::rmsnorm(rq.data(), T * c.NH, D, q_norm.data(), 1e-6f, rq.data());
    ref::rmsnorm(rk.data(), T * c.NKV, D, k_norm.data(), 1e-6f, rk.data());
    const ref::Rope rope{ref::rope_inv_freq(1e6, D), 1.0f};
    ref::rope_neox(rq.data(), T, c.NH, D, positions64.data(), rope);
    ref::rope_neox(rk.data(), T, c.NKV, D, positions64.data(), rope);
    for (const auto& sq : seqs) ref::kv_store(kv, sq, rk.data() + sq.token_offset * kv_width, v.data() + sq.token_offset * kv_width);
    std::vector<float> want(q.size());
    ref::paged_attention(rq.data(), c.NH, kv, seqs.data(), int64_t(seqs.size()), want.data());

    // The store into a cache holding the cached tokens' codes.
    test::DeviceBuffer<float> d_q(q), d_k(k), d_v(v), d_freq(ref::rope_inv_freq(1e6, D));
    test::DeviceBuffer<uint8_t> d_kc(k_codes), d_vc(v_codes);
    test::DeviceBuffer<uint16_t> d_qn(q_norm), d_kn(k_norm), d_qb(q.size()), d_out(q.size());
    test::DeviceBuffer<int32_t> d_pos(positions);
    test::DeviceBuffer<int64_t> d_slots(slots);
    const cuda::QkvLayout layout{T, c.NH, c.NKV, D, d_pos.get(), d_slots.get(), d_freq.get()};
    ASSERT_TRUE(cuda::qk_norm_rope_store({d_q.get(), d_k.get(), d_v.get()}, layout, d_qn.get(), d_kn.get(), 1e-6f, nullptr,
                                         d_kc.get(), d_vc.get(), nullptr, d_qb.get(), cuda::KvFormat::FP8, k_scale, v_scale)
                    .is_ok());
    NIB_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint8_t> got_k = d_kc.to_host(), got_v = d_vc.to_host();
    // V is stored without math: its codes exactly. K's fp32 norm and RoPE differ from the CPU's by a
    // few ulp, so a code may sit one step off where the value is at a rounding edge: rare, never more.
    std::vector<uint8_t> kc2(ref_k.size()), vc2(ref_v.size());  // the reference cache's codes
    for (size_t i = 0; i < kc2.size(); ++i)  // (code · s) / s is within an ulp of the code: its own nearest
      kc2[i] = formats::e4m3_encode(ref_k[i] / k_scale), vc2[i] = formats::e4m3_encode(ref_v[i] / v_scale);
    EXPECT_EQ(got_v, vc2) << "V is stored without math: its codes exactly";
    size_t k_off = 0;
    for (size_t i = 0; i < got_k.size(); ++i) {
      if (got_k[i] == kc2[i]) continue;
      ++k_off;
      ASSERT_LE(std::abs(int(got_k[i] & 0x7F) - int(kc2[i] & 0x7F)), 1) << "K code " << i;
    }
    EXPECT_LE(k_off, size_t(T * kv_width) / 100 + 4) << "K codes a step off should be rare";
    // FlashInfer over the reference's own cache (only the attention math differs; the codes are exact
    // in BF16, so the bound is the BF16 cache's: q and P rounded to BF16, ~2^-9 relative).
    test::DeviceBuffer<uint8_t> d_kc2(kc2), d_vc2(vc2);
    std::vector<uint16_t> q_bf16(rq.size());
    for (size_t i = 0; i < rq.size(); ++i) q_bf16[i] = bf16_encode(rq[i]);
    test::DeviceBuffer<uint16_t> d_qr(q_bf16);
    cuda::DeviceArena arena;
    auto fi = cuda::FlashInferAttention::create({c.NH, c.NKV, D, bs, /*kv_fp8=*/true}, T, int64_t(seqs.size()), blocks, arena);
    ASSERT_TRUE(fi.is_ok()) << fi.status().message();
    double max_abs = 0;
    for (float x : want) max_abs = std::max(max_abs, double(std::fabs(x)));
    for (bool graph : {false, true}) {
      if (graph && !decode_only) continue;
      (*fi)->clear();
      for (const auto& sq : seqs) ASSERT_TRUE((*fi)->add(sq.n_tokens, sq.start_position + sq.n_tokens, sq.block_table).is_ok());
      ASSERT_TRUE((*fi)->plan(graph, nullptr).is_ok());
      NIB_CUDA_CHECK(cudaMemset(d_out.get(), 0x7F, q.size() * sizeof(uint16_t)));  // poisoned: every row must be written
      ASSERT_TRUE((*fi)->run(d_qr.get(), d_kc2.get(), d_vc2.get(), d_out.get(), nullptr, k_scale, v_scale).is_ok());
      NIB_CUDA_CHECK(cudaDeviceSynchronize());
      const auto got = decode(d_out.to_host());
      double worst = 0;
      for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
      std::printf("NH %lld NKV %lld, scales %g / %g: FlashInfer over FP8 KV (%s plan) max error %.2e of max|out| %.2f; %zu K "
                  "codes a step off\n", (long long)c.NH, (long long)c.NKV, k_scale, v_scale, graph ? "graph" : "eager", worst,
                  max_abs, k_off);
      // The BF16 cache's bound, widened: q and P rounded to BF16 (~2^-9 relative each) over up to 3,000
      // keys of random-sign V, whose mix cancels to a few % of |V| — so the error relative to max|out|
      // grows with the context (one 3,000-key decode measured 7.5e-3 of a max|out| of 0.0085; 4.3e-3
      // with another draw). The codes themselves are exact in BF16.
      EXPECT_LE(worst, 1.2e-2 * max_abs) << "FP8 KV, NH " << c.NH << (graph ? " (graph plan)" : "");
    }
  }
  cuda::DeviceArena arena;
  EXPECT_FALSE(cuda::FlashInferAttention::create({8, 2, 64, 16, true}, 1, 1, 1, arena).is_ok()) << "FP8 KV at head dim 64";
}

// A decode graph is captured after one FlashInfer plan and replayed after others: the launch shape
// (grid, tile height, workspace offsets) must depend on the request count only, not on the contexts.
TEST(CudaKvCache, FlashInferGraphPlansDependOnTheRequestCountOnly) {
  NIB_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::test_seed("CudaKvCache.FlashInferGraphPlansDependOnTheRequestCountOnly");
  std::mt19937_64 rng(seed);
  cuda::DeviceArena arena;
  const int64_t requests = 24, max_blocks = 300;
  auto fi = cuda::FlashInferAttention::create({32, 4, 128, 16}, requests, requests, requests * max_blocks, arena);
  ASSERT_TRUE(fi.is_ok()) << fi.status().message();
  std::vector<int32_t> table(max_blocks);
  for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t(i);
  std::vector<int64_t> first;
  for (int trial = 0; trial < 6; ++trial) {
    // Between the graph's plans, plans that split the keys (a small graph batch, an eager chunk of few
    // rows over a long prefix) or take the SM90 kernel (a long prefill): they leave no trace in the
    // next graph plan's info (the runner compares it with the capture's before replaying).
    if (trial >= 2) {
      (*fi)->clear();
      if (trial % 3 == 0) {
        ASSERT_TRUE((*fi)->add(1, 1, table.data()).is_ok());
        ASSERT_TRUE((*fi)->plan(true, nullptr).is_ok());
      } else if (trial % 3 == 1) {
        ASSERT_TRUE((*fi)->add(3, max_blocks * 16, table.data()).is_ok());
        ASSERT_TRUE((*fi)->plan(false, nullptr).is_ok());
      } else {
        ASSERT_TRUE((*fi)->add(requests, max_blocks * 16, table.data()).is_ok());
        ASSERT_TRUE((*fi)->plan(false, nullptr).is_ok());
      }
    }
    (*fi)->clear();
    std::uniform_int_distribution<int64_t> keys(1, trial == 0 ? 1 : max_blocks * 16);  // trial 0: capture's all-padding
    for (int64_t r = 0; r < requests; ++r) ASSERT_TRUE((*fi)->add(1, keys(rng), table.data()).is_ok());
    ASSERT_TRUE((*fi)->plan(true, nullptr).is_ok());
    if (trial == 0) first = (*fi)->plan_info();
    EXPECT_EQ((*fi)->plan_info(), first) << "trial " << trial;
  }
  NIB_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace

// The decoder ops of the GPU forward beside their ref:: twins (llama.cpp test-backend-ops style):
// one table of cases on Qwen3-30B-A3B shapes and odd sizes, each with its error measure and the
// tolerance's reason. Embedding is exact; the norms and RoPE differ from the reference only by fp32
// summation order before a BF16 rounding (≤ 1 BF16 ulp); attention reads the same BF16 cache as the
// reference and differs by summation order and the output's BF16 rounding. (The sampler's tests are
// in test_cuda_sampler.cu.)
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cuda/attention/attention.cuh"
#include "cuda/attention/decode_attention.cuh"
#include "cuda/common/device_context.cuh"
#include "cuda/attention/flashinfer_attention.cuh"
#include "cuda/nvfp4/nvfp4_layout.h"
#include "cuda/gemm/nvfp4_wgmma.cuh"
#include "cuda/nvfp4/quantize_nvfp4.cuh"
#include "cuda/ops/transformer_ops.cuh"
#include "cuda_test_util.cuh"
#include "formats/bf16.h"
#include "models/batch.h"
#include "ref/attention.h"
#include "ref/ops.h"
#include "test_seed.h"

using namespace nibble;
using formats::bf16_decode;
using formats::bf16_encode;
using test::decode;
using test::max_rel;
using test::random_bf16;
using test::random_f32;

namespace {

TEST(CudaOps, EmbeddingAndRmsnorm) {
  NIB_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::test_seed("CudaOps.EmbeddingAndRmsnorm");
  std::mt19937_64 rng(seed);
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes = {{151936, 2048, 7}, {1000, 4096, 3}, {1000, 96, 33}, {50, 32, 1}};
  for (const auto& [vocab, hidden, tokens] : shapes) {
    const auto table = random_bf16(size_t(vocab * hidden), rng, 0.0f, 0.05f);
    std::vector<int32_t> ids(static_cast<size_t>(tokens));
    for (auto& id : ids) id = int32_t(rng() % vocab);
    std::vector<float> want(static_cast<size_t>(tokens * hidden));
    ref::embedding(ids.data(), tokens, table.data(), hidden, want.data());
    test::DeviceBuffer<uint16_t> d_table(table);
    test::DeviceBuffer<int32_t> d_ids(ids);
    test::DeviceBuffer<float> d_x(want.size());
    ASSERT_TRUE(cuda::embedding_gather(d_ids.get(), tokens, d_table.get(), hidden, d_x.get(), nullptr).is_ok());
    EXPECT_EQ(d_x.to_host(), want) << "embedding is a copy: exact";
    // The same ids, every other one pending: the token a step before drew for its row j (overlapped steps).
    std::vector<int32_t> pending = ids, drawn(static_cast<size_t>(tokens));
    for (size_t t = 0; t < pending.size(); t += 2) {
      const int64_t j = tokens - 1 - int64_t(t);
      drawn[size_t(j)] = ids[t];
      pending[t] = models::pending_token(j);
    }
    test::DeviceBuffer<int32_t> d_pending(pending), d_drawn(drawn);
    test::DeviceBuffer<float> d_x2(want.size());
    ASSERT_TRUE(cuda::embedding_gather(d_pending.get(), tokens, d_table.get(), hidden, d_x2.get(), nullptr, d_drawn.get()).is_ok());
    EXPECT_EQ(d_x2.to_host(), want) << "pending ids read the drawn tokens";

    // residual += delta, then BF16(rmsnorm · w); and the row-selected form without delta.
    const auto residual = random_f32(want.size(), rng, 1.0f), delta = random_f32(want.size(), rng, 0.3f);
    const auto weight = random_bf16(size_t(hidden), rng, 1.0f, 0.1f);
    std::vector<float> sum = residual, normed(want.size());
    ref::add_inplace(sum.data(), delta.data(), int64_t(sum.size()));
    ref::rmsnorm(sum.data(), tokens, hidden, weight.data(), 1e-6f, normed.data());
    test::DeviceBuffer<float> d_res(residual), d_delta(delta);
    test::DeviceBuffer<uint16_t> d_w(weight), d_out(want.size());
    ASSERT_TRUE(cuda::add_rmsnorm(d_res.get(), d_delta.get(), tokens, hidden, d_w.get(), 1e-6f, d_out.get(), nullptr).is_ok());
    EXPECT_EQ(d_res.to_host(), sum) << "the residual add is one fp32 add per value: exact";
    {  // delta left unscaled by a per-token GEMM: its row scales applied in the add, as a pass over delta would
      std::vector<float> row_scales(static_cast<size_t>(tokens)), scaled = delta, want_res = residual;
      for (float& r : row_scales) r = 0.01f + 0.002f * float(rng() % 1000);
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t i = 0; i < hidden; ++i) scaled[t * hidden + i] *= row_scales[t];
      ref::add_inplace(want_res.data(), scaled.data(), int64_t(want_res.size()));
      test::DeviceBuffer<float> d_res2(residual), d_row_scales(row_scales);
      test::DeviceBuffer<uint16_t> d_out2(want.size());
      ASSERT_TRUE(cuda::add_rmsnorm(d_res2.get(), d_delta.get(), tokens, hidden, d_w.get(), 1e-6f, d_out2.get(), nullptr,
                                    nullptr, {}, d_row_scales.get()).is_ok());
      EXPECT_EQ(d_res2.to_host(), want_res) << "delta · row scale, then the add: each rounded once, hidden " << hidden;
      EXPECT_NE(want_res, sum) << "the row scales change the sum";
    }
    // One BF16 ulp is 2^-8 relative; fp32 summation order moves the scale by ~1e-7.
    EXPECT_LE(max_rel(decode(d_out.to_host()), normed, 1e-3), 1.0 / 128) << "vocab " << vocab << " hidden " << hidden;
    if (hidden % 32 == 0) {  // the wgmma MoE's copy in fragment order: the same values, each row permuted
      test::DeviceBuffer<float> d_res3(residual);
      test::DeviceBuffer<uint16_t> d_out3(want.size()), d_frag(want.size());
      ASSERT_TRUE(cuda::add_rmsnorm(d_res3.get(), d_delta.get(), tokens, hidden, d_w.get(), 1e-6f, d_out3.get(), nullptr,
                                    nullptr, {}, nullptr, d_frag.get()).is_ok());
      const auto out = d_out.to_host(), out3 = d_out3.to_host(), frag = d_frag.to_host();
      EXPECT_EQ(out3, out) << "the natural output is unchanged";
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t i = 0; i < hidden; ++i)
          ASSERT_EQ(frag[size_t(t * hidden + cuda::fragment_order_index(i))], out[size_t(t * hidden + i)])
              << "token " << t << " column " << i << " hidden " << hidden;
      test::DeviceBuffer<uint16_t> d_copy(want.size());  // to_fragment_order agrees
      ASSERT_TRUE(cuda::to_fragment_order(d_out.get(), tokens, hidden, d_copy.get(), nullptr).is_ok());
      EXPECT_EQ(d_copy.to_host(), frag) << "to_fragment_order, hidden " << hidden;
    }
    std::vector<int32_t> rows = {int32_t(tokens - 1), 0};
    test::DeviceBuffer<int32_t> d_rows(rows);
    test::DeviceBuffer<uint16_t> d_sel(static_cast<size_t>(2 * hidden));
    ASSERT_TRUE(cuda::add_rmsnorm(d_res.get(), nullptr, 2, hidden, d_w.get(), 1e-6f, d_sel.get(), nullptr, d_rows.get()).is_ok());
    const auto sel = decode(d_sel.to_host());
    std::vector<float> want_sel(normed.begin() + (tokens - 1) * hidden, normed.begin() + tokens * hidden);
    want_sel.insert(want_sel.end(), normed.begin(), normed.begin() + hidden);
    EXPECT_LE(max_rel(sel, want_sel, 1e-3), 1.0 / 128);
    // With x̂ for the next W4A4 GEMM: bit for bit what the quantize kernel makes of the BF16 output.
    for (const float input_scale : {0.0173f, 0.0f}) {  // static, per-token
      test::DeviceBuffer<uint16_t> d_h(want.size()), d_xq(want.size()), d_xq2(want.size());
      test::DeviceBuffer<float> d_rs(static_cast<size_t>(tokens)), d_rs2(static_cast<size_t>(tokens));
      const cuda::NormActQuant quant{input_scale, d_xq.get(), d_rs.get()};
      ASSERT_TRUE(cuda::add_rmsnorm(d_res.get(), nullptr, tokens, hidden, d_w.get(), 1e-6f, d_h.get(), nullptr, nullptr, quant).is_ok());
      ASSERT_TRUE(cuda::quantize_dequantize_activation_bf16(d_h.get(), tokens, hidden, input_scale, d_xq2.get(), d_rs2.get(),
                                                            nullptr).is_ok());
      NIB_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(d_h.to_host(), d_out.to_host()) << "the norm's own output is unchanged by x̂";
      EXPECT_EQ(d_xq.to_host(), d_xq2.to_host()) << "x̂, hidden " << hidden << " input_scale " << input_scale;
      EXPECT_EQ(d_rs.to_host(), d_rs2.to_host()) << "row scales, hidden " << hidden;
      if (hidden % 32 == 0) {  // x̂ in fragment order (the wgmma MoE's input): the same values, each row permuted
        test::DeviceBuffer<uint16_t> d_h3(want.size()), d_xf(want.size());
        test::DeviceBuffer<float> d_rs3(static_cast<size_t>(tokens));
        const cuda::NormActQuant frag_quant{input_scale, d_xf.get(), d_rs3.get(), true};
        ASSERT_TRUE(cuda::add_rmsnorm(d_res.get(), nullptr, tokens, hidden, d_w.get(), 1e-6f, d_h3.get(), nullptr, nullptr,
                                      frag_quant).is_ok());
        const auto xq = d_xq.to_host(), xf = d_xf.to_host();
        EXPECT_EQ(d_rs3.to_host(), d_rs.to_host()) << "row scales, fragment order";
        for (int64_t t = 0; t < tokens; ++t)
          for (int64_t i = 0; i < hidden; ++i)
            ASSERT_EQ(xf[size_t(t * hidden + cuda::fragment_order_index(i))], xq[size_t(t * hidden + i)])
                << "x̂ in fragment order, token " << t << " column " << i;
      }
    }
  }
}

// ERNIE-4.5's form of the op: no q/k norm (null weights) and RoPE on (2i, 2i + 1) pairs, against
// ref::rope_interleaved; each token's K/V land in its own slot of a fresh cache.
TEST(CudaOps, InterleavedRopeWithoutNorm) {
  NIB_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::test_seed("CudaOps.InterleavedRope");
  std::mt19937_64 rng(seed);
  const int64_t T = 37, NH = 10, NKV = 2, D = 64, kv_width = NKV * D;
  const auto q = random_f32(size_t(T * NH * D), rng, 1.0f), k = random_f32(size_t(T * kv_width), rng, 1.0f),
             v = random_f32(size_t(T * kv_width), rng, 1.0f);
  std::vector<int32_t> positions(T);
  std::vector<int64_t> positions64(T), slots(T);
  for (int64_t t = 0; t < T; ++t) positions[t] = int32_t(rng() % 4000), positions64[t] = positions[t], slots[t] = T - 1 - t;
  std::vector<float> rq = q, rk = k;
  const ref::Rope rope{ref::rope_inv_freq(5e5, D), 1.0f};
  ref::rope_interleaved(rq.data(), T, NH, D, positions64.data(), rope);
  ref::rope_interleaved(rk.data(), T, NKV, D, positions64.data(), rope);
  test::DeviceBuffer<float> d_q(q), d_k(k), d_v(v), d_qrot(q.size()), d_freq(ref::rope_inv_freq(5e5, D));
  test::DeviceBuffer<uint16_t> d_kc(size_t(T * kv_width)), d_vc(size_t(T * kv_width));
  test::DeviceBuffer<int32_t> d_pos(positions);
  test::DeviceBuffer<int64_t> d_slots(slots);
  const cuda::QkvLayout layout{T, NH, NKV, D, d_pos.get(), d_slots.get(), d_freq.get(), true};
  ASSERT_TRUE(cuda::qk_norm_rope_store({d_q.get(), d_k.get(), d_v.get()}, layout, nullptr, nullptr, 1e-5f, d_qrot.get(),
                                       d_kc.get(), d_vc.get(), nullptr).is_ok());
  NIB_CUDA_CHECK(cudaDeviceSynchronize());
  // fp32 cos/sin of angles up to 4e3 within a few ulp (as the neox test above).
  EXPECT_LE(max_rel(d_qrot.to_host(), rq, 1e-2), 2e-4);
  std::vector<float> want_k(size_t(T * kv_width)), want_v(want_k.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < kv_width; ++i) {
      want_k[slots[t] * kv_width + i] = bf16_decode(bf16_encode(rk[t * kv_width + i]));
      want_v[slots[t] * kv_width + i] = bf16_decode(bf16_encode(v[t * kv_width + i]));
    }
  EXPECT_LE(max_rel(decode(d_kc.to_host()), want_k, 1e-2), 1.0 / 128);
  EXPECT_EQ(decode(d_vc.to_host()), want_v);
}

// q/k/v as one GEMM's output (QkvInput: [T, NH·D + 2·NKV·D] rows, before the projections' scales
// and per-token row scales) against the same values laid out apart and already scaled: powers of two
// make the division and the kernel's multiplications exact, so q, K and V must match bit for bit.
TEST(CudaOps, QkNormRopeStoreReadsOneGemmsOutput) {
  NIB_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::test_seed("CudaOps.QkNormRopeStoreReadsOneGemmsOutput");
  std::mt19937_64 rng(seed);
  const int64_t T = 19, NH = 32, NKV = 4, D = 128, kv_width = NKV * D, width = NH * D + 2 * kv_width;
  const float scale[3] = {0.25f, 2.0f, 0.5f};
  std::vector<float> row_scales(T);
  for (float& r : row_scales) r = std::ldexp(1.0f, int(rng() % 7) - 3);
  const auto merged = random_f32(size_t(T * width), rng, 1.0f);
  std::vector<float> q(size_t(T * NH * D)), k(size_t(T * kv_width)), v(k.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < width; ++i) {
      const int which = i < NH * D ? 0 : i < NH * D + kv_width ? 1 : 2;
      const float y = merged[t * width + i] * scale[which] * row_scales[t];
      if (which == 0) q[t * NH * D + i] = y;
      else if (which == 1) k[t * kv_width + i - NH * D] = y;
      else v[t * kv_width + i - NH * D - kv_width] = y;
    }
  std::vector<int32_t> positions(T);
  std::vector<int64_t> slots(T);
  for (int64_t t = 0; t < T; ++t) positions[t] = int32_t(rng() % 3000), slots[t] = (t * 7) % T;
  const auto q_norm = random_bf16(size_t(D), rng, 1.0f, 0.1f), k_norm = random_bf16(size_t(D), rng, 1.0f, 0.1f);
  test::DeviceBuffer<float> d_merged(merged), d_q(q), d_k(k), d_v(v), d_rs(row_scales), d_freq(ref::rope_inv_freq(1e6, D));
  test::DeviceBuffer<uint16_t> d_qn(q_norm), d_kn(k_norm);
  test::DeviceBuffer<int32_t> d_pos(positions);
  test::DeviceBuffer<int64_t> d_slots(slots);
  const cuda::QkvLayout layout{T, NH, NKV, D, d_pos.get(), d_slots.get(), d_freq.get()};
  std::vector<uint16_t> outputs[2][3];  // [apart, merged][q (BF16), K, V]
  for (int merged_form = 0; merged_form < 2; ++merged_form) {
    test::DeviceBuffer<uint16_t> d_qout(q.size()), d_kc(size_t(T * kv_width)), d_vc(size_t(T * kv_width));
    cuda::QkvInput in{d_q.get(), d_k.get(), d_v.get()};
    if (merged_form) {
      in = {d_merged.get(), d_merged.get() + NH * D, d_merged.get() + NH * D + kv_width, width,
            {scale[0], scale[1], scale[2]}, d_rs.get()};
    }
    ASSERT_TRUE(cuda::qk_norm_rope_store(in, layout, d_qn.get(), d_kn.get(), 1e-6f, nullptr, d_kc.get(), d_vc.get(), nullptr,
                                         d_qout.get()).is_ok());
    NIB_CUDA_CHECK(cudaDeviceSynchronize());
    outputs[merged_form][0] = d_qout.to_host(), outputs[merged_form][1] = d_kc.to_host(), outputs[merged_form][2] = d_vc.to_host();
  }
  EXPECT_EQ(outputs[1][0], outputs[0][0]) << "q";
  EXPECT_EQ(outputs[1][1], outputs[0][1]) << "K";
  EXPECT_EQ(outputs[1][2], outputs[0][2]) << "V";
}

TEST(CudaOps, QkNormRopeStoreAndPagedAttention) {
  NIB_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::test_seed("CudaOps.QkNormRopeStoreAndPagedAttention");
  std::mt19937_64 rng(seed);
  struct Case {
    int64_t NH, NKV, D, block_size;
    std::vector<std::pair<int64_t, int64_t>> seqs;  // (cached tokens, new tokens)
  };
  const Case cases[] = {
      {32, 4, 128, 16, {{0, 37}, {100, 1}, {5, 1}, {33, 20}, {1023, 1}}},  // Qwen3-30B-A3B: prefill, decodes, a chunk
      {32, 4, 128, 16, {{3000, 1}}},                                         // one long decode: split over CTAs
      {8, 2, 64, 16, {{0, 1}, {15, 3}, {300, 1}}},                         // small-moe
      {4, 2, 16, 4, {{0, 9}, {6, 1}}},                                      // tiny-moe, odd sizes
      {6, 6, 32, 8, {{3, 5}}},                                              // MHA
      {32, 4, 128, 16, {{0, 100}, {200, 70}}},                              // prefill chunks only: FlashInfer's SM90 kernel
      {32, 4, 128, 16, {{0, 600}, {1000, 129}}},                            // the same, longer
      {20, 4, 128, 16, {{0, 61}, {40, 13}, {7, 1}}},                        // ERNIE-4.5-21B-A3B: groups of 5
      {20, 4, 128, 16, {{0, 200}, {64, 64}}},                               // the same, prefill chunks only (SM90)
      {32, 4, 128, 16, {{999, 1}, {0, 1}, {15, 1}, {16, 1}, {1500, 1}, {63, 1}, {7, 1}, {300, 1}, {2047, 1}}},  // decodes
      {20, 4, 128, 16, {{100, 1}, {5, 1}, {700, 1}, {0, 1}, {64, 1}}},       // ERNIE decodes
      // Mixed steps: the trailing chunks of 64+ rows on the SM90 kernel, the requests before on FA2.
      {32, 4, 128, 16, {{999, 1}, {0, 1}, {300, 1}, {17, 5}, {0, 700}, {64, 200}}},  // decodes, then prompts
      {32, 4, 128, 16, {{0, 100}, {50, 1}, {0, 90}}},                         // a prompt before a decode: on FA2
      {32, 4, 128, 16, {{3000, 1}, {0, 128}}},                                // FA2's part split over CTAs
      {20, 4, 128, 16, {{100, 1}, {7, 1}, {0, 200}}},                         // ERNIE, mixed
  };
  for (const Case& c : cases) {
    int64_t T = 0, blocks = 0;
    for (auto [cached, fresh] : c.seqs) T += fresh, blocks += (cached + fresh + c.block_size - 1) / c.block_size;
    const int64_t kv_width = c.NKV * c.D;
    // A random cache (also the reference's, decoded), random block tables over a shuffled pool.
    const auto k_cache = random_bf16(size_t(blocks * c.block_size * kv_width), rng, 0.0f, 1.0f);
    const auto v_cache = random_bf16(k_cache.size(), rng, 0.0f, 1.0f);
    std::vector<int32_t> pool(static_cast<size_t>(blocks));
    for (size_t i = 0; i < pool.size(); ++i) pool[i] = int32_t(i);
    std::shuffle(pool.begin(), pool.end(), rng);
    const auto q = random_f32(size_t(T * c.NH * c.D), rng, 1.0f), k = random_f32(size_t(T * kv_width), rng, 1.0f),
               v = random_f32(size_t(T * kv_width), rng, 1.0f);
    const auto q_norm = random_bf16(size_t(c.D), rng, 1.0f, 0.1f), k_norm = random_bf16(size_t(c.D), rng, 1.0f, 0.1f);

    std::vector<float> ref_k = decode(k_cache), ref_v = decode(v_cache);
    ref::PagedKvLayer kv{ref_k.data(), ref_v.data(), blocks, c.block_size, c.NKV, c.D, ref::KvRounding::BF16};
    std::vector<std::vector<int32_t>> tables;
    std::vector<ref::AttentionSequence> seqs;
    std::vector<int32_t> positions, token_seq;
    std::vector<int64_t> slots, positions64;
    const int64_t max_blocks = 256;
    std::vector<int32_t> flat_tables(c.seqs.size() * max_blocks, 0);
    int64_t next_block = 0, offset = 0;
    for (size_t s = 0; s < c.seqs.size(); ++s) {
      const auto [cached, fresh] = c.seqs[s];
      const int64_t n = (cached + fresh + c.block_size - 1) / c.block_size;
      tables.emplace_back(pool.begin() + next_block, pool.begin() + next_block + n);
      next_block += n;
      std::copy(tables.back().begin(), tables.back().end(), flat_tables.begin() + s * max_blocks);
      seqs.push_back({tables.back().data(), n, cached, fresh, offset});
      for (int64_t i = 0; i < fresh; ++i) {
        const int64_t p = cached + i;
        positions.push_back(int32_t(p));
        positions64.push_back(p);
        token_seq.push_back(int32_t(s));
        slots.push_back(int64_t{tables.back()[p / c.block_size]} * c.block_size + p % c.block_size);
      }
      offset += fresh;
    }
    // Reference: per-head norm, RoPE, store, attention.
    std::vector<float> rq = q, rk = k;
    ref::rmsnorm(rq.data(), T * c.NH, c.D, q_norm.data(), 1e-6f, rq.data());
    ref::rmsnorm(rk.data(), T * c.NKV, c.D, k_norm.data(), 1e-6f, rk.data());
    // A YaRN-shaped table: the slow half of the pairs interpolated (÷ 4), cos and sin × 0.1 ln 4 + 1.
    ref::Rope rope{ref::rope_inv_freq(1e6, c.D), 1.1386294f};
    for (size_t i = rope.inv_freq.size() / 2; i < rope.inv_freq.size(); ++i) rope.inv_freq[i] /= 4.0f;
    ref::rope_neox(rq.data(), T, c.NH, c.D, positions64.data(), rope);
    ref::rope_neox(rk.data(), T, c.NKV, c.D, positions64.data(), rope);
    for (const auto& s : seqs) ref::kv_store(kv, s, rk.data() + s.token_offset * kv_width, v.data() + s.token_offset * kv_width);
    std::vector<float> want(q.size());
    ref::paged_attention(rq.data(), c.NH, kv, seqs.data(), int64_t(seqs.size()), want.data());

    test::DeviceBuffer<float> d_q(q), d_k(k), d_v(v), d_qrot(q.size());
    test::DeviceBuffer<uint16_t> d_kc(k_cache), d_vc(v_cache), d_qn(q_norm), d_kn(k_norm), d_out(q.size());
    test::DeviceBuffer<int32_t> d_pos(positions), d_seq(token_seq), d_tables(flat_tables);
    test::DeviceBuffer<int64_t> d_slots(slots);
    test::DeviceBuffer<float> d_freq(rope.inv_freq);
    const cuda::QkvLayout layout{T, c.NH, c.NKV, c.D, d_pos.get(), d_slots.get(), d_freq.get(), false,
                                 rope.attention_scaling};
    ASSERT_TRUE(cuda::qk_norm_rope_store({d_q.get(), d_k.get(), d_v.get()}, layout, d_qn.get(), d_kn.get(), 1e-6f,
                                         d_qrot.get(), d_kc.get(), d_vc.get(), nullptr).is_ok());
    // q after norm and RoPE: fp32, summation order and cos/sin within a few ulp at angles up to 1e3.
    EXPECT_LE(max_rel(d_qrot.to_host(), rq, 1e-2), 2e-4) << "NH " << c.NH << " D " << c.D;
    // The cache: BF16 of the same fp32 values: equal, or one ulp apart where rounding sat on an edge.
    const auto got_k = decode(d_kc.to_host()), got_v = decode(d_vc.to_host());
    EXPECT_LE(max_rel(got_k, ref_k, 1e-2), 1.0 / 128);
    EXPECT_EQ(got_v, ref_v) << "v is stored without math: exact";
    // Attention over the reference's own cache (so only the attention math differs).
    test::DeviceBuffer<uint16_t> d_kref(std::vector<uint16_t>(k_cache.size())), d_vref(std::vector<uint16_t>(v_cache.size()));
    std::vector<uint16_t> kb(ref_k.size()), vb(ref_v.size());
    for (size_t i = 0; i < kb.size(); ++i) kb[i] = bf16_encode(ref_k[i]), vb[i] = bf16_encode(ref_v[i]);
    test::DeviceBuffer<uint16_t> d_kc2(kb), d_vc2(vb);
    test::DeviceBuffer<float> d_rq(rq);
    int64_t max_keys = 0;
    for (auto [cached, fresh] : c.seqs) max_keys = std::max(max_keys, cached + fresh);
    const int64_t splits = cuda::attention_splits(T, c.NKV, max_keys);
    const cuda::AttentionBatch att{T, c.NH, c.NKV, c.D, c.block_size, d_seq.get(), d_pos.get(), d_tables.get(), max_blocks, splits};
    test::DeviceBuffer<float> d_ws(static_cast<size_t>(cuda::attention_workspace_floats(T, c.NH, c.D, splits)));
    ASSERT_TRUE(cuda::paged_attention(d_rq.get(), d_kc2.get(), d_vc2.get(), att, d_out.get(), nullptr, d_ws.get()).is_ok());
    NIB_CUDA_CHECK(cudaDeviceSynchronize());
    const auto got = decode(d_out.to_host());
    double max_abs = 0, worst = 0;
    for (float x : want) max_abs = std::max(max_abs, double(std::fabs(x)));
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
    // Outputs are convex mixes of V (|v| ≲ 4): BF16 rounding of the output (2^-9 relative) and
    // fp32 softmax-order differences (~1e-6) bound the error by ~1e-2 of max|out|.
    EXPECT_LE(worst, 8e-3 * max_abs) << "NH " << c.NH << " NKV " << c.NKV << " D " << c.D << " splits " << splits;
    // As a captured graph runs it: 32 splits whatever the context (short ones leave splits empty).
    test::DeviceBuffer<float> d_ws32(static_cast<size_t>(cuda::attention_workspace_floats(T, c.NH, c.D, 32)));
    cuda::AttentionBatch att32 = att;
    att32.splits = 32;
    ASSERT_TRUE(cuda::paged_attention(d_rq.get(), d_kc2.get(), d_vc2.get(), att32, d_out.get(), nullptr, d_ws32.get()).is_ok());
    const auto got32 = decode(d_out.to_host());
    double worst32 = 0;
    for (size_t i = 0; i < got32.size(); ++i) worst32 = std::max(worst32, std::fabs(double(got32[i]) - want[i]));
    EXPECT_LE(worst32, 8e-3 * max_abs) << "32 splits, NH " << c.NH << " D " << c.D;
    // As eager steps run it: prefill chunks on the tensor-core kernel (Q and P rounded to BF16 for
    // the MMA: ~2^-9 relative, inside the same bound), decode tokens on the per-token one.
    const int64_t G = c.NH / c.NKV;
    if (cuda::prefill_attention_supported(c.D, G)) {
      std::vector<int4> items;
      std::vector<int32_t> decode_rows;
      for (size_t si = 0; si < seqs.size(); ++si) {
        const auto& sq = seqs[si];
        if (sq.n_tokens == 1) decode_rows.push_back(int32_t(sq.token_offset));
        else
          for (int64_t i = 0; i < sq.n_tokens; i += cuda::prefill_item_tokens(G))
            items.push_back(make_int4(int(si), int(sq.token_offset + i), int(std::min(cuda::prefill_item_tokens(G), sq.n_tokens - i)),
                                      int(sq.start_position + i)));
      }
      test::DeviceBuffer<int4> d_items(items.empty() ? std::vector<int4>{make_int4(0, 0, 0, 0)} : items);
      test::DeviceBuffer<int32_t> d_decode(decode_rows.empty() ? std::vector<int32_t>{0} : decode_rows);
      cuda::AttentionBatch split = att;
      split.splits = cuda::attention_splits(int64_t(decode_rows.size()), c.NKV, max_keys);
      split.prefill_items = d_items.get(), split.n_items = int64_t(items.size());
      split.decode_tokens = d_decode.get(), split.n_decode = int64_t(decode_rows.size());
      test::DeviceBuffer<uint16_t> d_out2(q.size());
      ASSERT_TRUE(cuda::paged_attention(d_rq.get(), d_kc2.get(), d_vc2.get(), split, d_out2.get(), nullptr, d_ws32.get()).is_ok());
      NIB_CUDA_CHECK(cudaDeviceSynchronize());
      const auto got2 = decode(d_out2.to_host());
      double worst2 = 0;
      for (size_t i = 0; i < got2.size(); ++i) worst2 = std::max(worst2, std::fabs(double(got2[i]) - want[i]));
      std::printf("NH %lld NKV %lld D %lld: %zu tensor-core items, %zu decode rows, max error %.2e of max|out| %.2f\n",
                  (long long)c.NH, (long long)c.NKV, (long long)c.D, items.size(), decode_rows.size(), worst2, max_abs);
      EXPECT_LE(worst2, 8e-3 * max_abs) << "tensor-core prefill, NH " << c.NH << " D " << c.D;
    }
    // FlashInfer's FA2 paged kernels over the same cache (q rounded to BF16, its input: ~2^-9
    // relative, inside the same bound), planned as an eager step and, for decode-only steps, as a
    // CUDA-graph step (split over the KV length, partial softmaxes merged).
    if (cuda::flashinfer_attention_supported(c.D)) {
      bool decode_only = true;
      for (auto [cached, fresh] : c.seqs) decode_only &= fresh == 1;
      std::vector<uint16_t> q_bf16(rq.size());
      for (size_t i = 0; i < rq.size(); ++i) q_bf16[i] = bf16_encode(rq[i]);
      test::DeviceBuffer<uint16_t> d_qb(q_bf16), d_out3(q.size());
      cuda::DeviceArena arena;
      auto fi = cuda::FlashInferAttention::create({c.NH, c.NKV, c.D, c.block_size}, T, int64_t(seqs.size()), blocks, arena);
      ASSERT_TRUE(fi.is_ok()) << fi.status().message();
      for (bool graph : {false, true}) {
        if (graph && !decode_only) continue;
        (*fi)->clear();
        for (const auto& sq : seqs) ASSERT_TRUE((*fi)->add(sq.n_tokens, sq.start_position + sq.n_tokens, sq.block_table).is_ok());
        ASSERT_TRUE((*fi)->plan(graph, nullptr).is_ok());
        // Every row poisoned (BF16 0x7F7F, ~3.4e38) first: a row that no part of a mixed step writes fails.
        NIB_CUDA_CHECK(cudaMemset(d_out3.get(), 0x7F, q.size() * sizeof(uint16_t)));
        ASSERT_TRUE((*fi)->run(d_qb.get(), d_kc2.get(), d_vc2.get(), d_out3.get(), nullptr).is_ok());
        NIB_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got3 = decode(d_out3.to_host());
        double worst3 = 0, sum3 = 0;
        for (size_t i = 0; i < got3.size(); ++i) {
          worst3 = std::max(worst3, std::fabs(double(got3[i]) - want[i]));
          sum3 += std::fabs(double(got3[i]) - want[i]);
        }
        // The mean error too: two kernels within the same bound can still differ in how often they round.
        std::printf("NH %lld NKV %lld D %lld: FlashInfer (%s plan) max error %.2e, mean %.2e, of max|out| %.2f\n",
                    (long long)c.NH, (long long)c.NKV, (long long)c.D, graph ? "graph" : "eager", worst3,
                    sum3 / double(got3.size()), max_abs);
        EXPECT_LE(worst3, 8e-3 * max_abs) << "FlashInfer, NH " << c.NH << " D " << c.D << (graph ? " (graph plan)" : "");
      }
      EXPECT_FALSE((*fi)->add(1, 1, seqs[0].block_table).is_ok()) << "past the requests it was sized for";
      // The one-launch decode kernel on decode-only steps (q in BF16 as for FlashInfer: the same
      // bound), with the split counts of a small graph (a cluster of 8), of one split and of 3.
      if (decode_only && cuda::decode_attention_supported(c.NH, c.NKV, c.D, c.block_size)) {
        for (int64_t splits : {cuda::decode_attention_splits(T, c.NKV, 132), int64_t{1}, int64_t{3}}) {
          const cuda::DecodeAttentionBatch db{T, c.NH, c.NKV, c.D, c.block_size, d_seq.get(), d_pos.get(), d_tables.get(),
                                              max_blocks, splits};
          test::DeviceBuffer<uint16_t> d_out4(q.size());
          ASSERT_TRUE(cuda::decode_attention(d_qb.get(), d_kc2.get(), d_vc2.get(), db, d_out4.get(), nullptr).is_ok());
          NIB_CUDA_CHECK(cudaDeviceSynchronize());
          const auto got4 = decode(d_out4.to_host());
          double worst4 = 0;
          for (size_t i = 0; i < got4.size(); ++i) worst4 = std::max(worst4, std::fabs(double(got4[i]) - want[i]));
          std::printf("NH %lld NKV %lld D %lld: one-launch decode, %lld splits, max error %.2e of max|out| %.2f\n",
                      (long long)c.NH, (long long)c.NKV, (long long)c.D, (long long)splits, worst4, max_abs);
          EXPECT_LE(worst4, 8e-3 * max_abs) << "one-launch decode, NH " << c.NH << " splits " << splits;
          // Static W4A4's x̂ of the output, bit for bit what the quantize kernel makes of it.
          test::DeviceBuffer<uint16_t> d_out5(q.size()), d_xhat(q.size()), d_xhat_want(q.size());
          test::DeviceBuffer<float> d_row_scales{static_cast<size_t>(T)};
          cuda::DecodeAttentionBatch dq = db;
          const float input_scale = 0.0371f;
          dq.x_hat = d_xhat.get(), dq.x_hat_global = 1.0f / input_scale;
          ASSERT_TRUE(cuda::decode_attention(d_qb.get(), d_kc2.get(), d_vc2.get(), dq, d_out5.get(), nullptr).is_ok());
          ASSERT_TRUE(cuda::quantize_dequantize_activation_bf16(d_out5.get(), T, c.NH * c.D, input_scale, d_xhat_want.get(),
                                                                d_row_scales.get(), nullptr).is_ok());
          NIB_CUDA_CHECK(cudaDeviceSynchronize());
          EXPECT_EQ(d_xhat.to_host(), d_xhat_want.to_host()) << "x̂, splits " << splits;
        }
      }
    }
  }
  // Bad shapes are errors.
  cuda::AttentionBatch bad{1, 3, 2, 64, 16, nullptr, nullptr, nullptr, 1, 1};
  EXPECT_FALSE(cuda::paged_attention(nullptr, nullptr, nullptr, bad, nullptr, nullptr).is_ok());
}

}  // namespace

// cuda::moe_forward (router → grouping → gate_up+SwiGLU → down → combine) against ref::moe, both
// backends and all three activation modes, on Qwen3-30B-A3B's MoE (E = 128, k = 8, H = 2048,
// I = 768) at T = 1, 3, 17, 255, 1000, 4099 (every wgmma tile height), with every token identical (8
// experts get every token, 120 get none), and on a small odd config. Weights are random NVFP4 codes
// with random E4M3 block scales and a different weight_scale_2 for gate, up and down of every expert
// (each half keeps its own).
// Tolerances, relative to max|ref|: W4A16 max 8e-3, mean 1.5e-3 — the GPU keeps the SwiGLU output
// and each expert's down output in BF16 (two roundings of ≤ 2⁻⁹ relative each that the fp32
// reference does not have); the GEMMs themselves are exact up to fp32 summation order. W4A4: the
// GPU quantizes with rcp.approx as Blackwell does and the CPU divides exactly, so a BF16 input on a
// rounding boundary (common, see test_cuda_linear) may land one E2M1 step apart and move its whole
// token; the reference experts therefore run on the GPU's x̂ (with the reference routing), and what
// is left is the BF16 down output and the re-quantized SwiGLU output, whose fp32 values differ in the
// last bits: mean 1.5e-3, 99.9th percentile 5e-3 (measured ≤ 2.7e-3), max 2e-2 (measured ≤ 3.8e-3;
// the margin is for a rare value re-quantized one step apart, which moves its row by up to ~1%). The two backends share the quantizer and are also checked against each other (mean
// 1e-3, 99.9th percentile 1e-2: where each rounds to BF16, and rare re-quantization steps).
// At T = 1 AUTO runs the one-launch block (moe_decode.cuh) in every mode, checked against the
// reference with the same bounds, and against the kernel chain in DecodeBlockMatchesTheKernelChain.
// Tokens whose expert choice differs (a near-tie in the router, see test_cuda_router) are skipped
// and counted; there must be few.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/moe/moe.cuh"
#include "cuda/moe/moe_decode.cuh"
#include "cuda/nvfp4/quantize_nvfp4.cuh"
#include "cuda/nvfp4/nvfp4_layout.h"
#include "cuda/gemm/nvfp4_wgmma.cuh"
#include "cuda/gemm/skinny_gemm.cuh"
#include "cuda_test_util.cuh"
#include "moe_problem.cuh"
#include "formats/bf16.h"
#include "ref/moe.h"
#include "test_seed.h"

using namespace nibble;

namespace {

using test::Config;
using test::DeviceProblem;
using test::make_problem;
using test::Problem;
using test::QWEN3_30B;

// Runs every backend × mode on one batch and compares with the reference.
void check(const Problem& p, int64_t tokens, bool identical_tokens, uint64_t seed) {
  const Config& c = p.c;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> x_bits(size_t(tokens * c.hidden));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < c.hidden; ++h)
      x_bits[t * c.hidden + h] = identical_tokens && t > 0
                                     ? x_bits[h]
                                     : formats::bf16_encode(normal(rng) * (rng() % 97 == 0 ? 20.0f : 1.0f));
  std::vector<float> x(x_bits.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = formats::bf16_decode(x_bits[i]);

  // Static input scales calibrated on this batch: amax / (6 · 448) of the gate_up and down inputs.
  ref::MoeWeights w = p.ref;
  float x_amax = 0.0f, act_amax = 0.0f;
  for (float v : x) x_amax = std::max(x_amax, std::fabs(v));
  std::vector<float> expected_none(x.size());
  ASSERT_TRUE(ref::moe(x.data(), tokens, w, formats::ActQuant::NONE, expected_none.data(),
                       [&](int64_t, const char* stage, const float* in, int64_t rows, int64_t width) {
                         if (std::string(stage) != "down") return;
                         for (int64_t i = 0; i < rows * width; ++i) act_amax = std::max(act_amax, std::fabs(in[i]));
                       }).is_ok());
  w.gate_up_input_scale = x_amax / 2688.0f;
  w.down_input_scale = act_amax / 2688.0f;
  std::vector<int32_t> ref_ids(size_t(tokens * c.top_k));
  std::vector<float> ref_weights(ref_ids.size());
  ref::route(x.data(), tokens, w, ref_ids.data(), ref_weights.data());

  DeviceProblem device(p);
  cuda::DeviceMoeWeights& dw = device.w;
  test::DeviceBuffer<uint16_t> d_x(x_bits);
  test::DeviceBuffer<float> d_out(x.size());
  dw.gate_up_input_scale = w.gate_up_input_scale, dw.down_input_scale = w.down_input_scale;
  auto ws = cuda::MoeWorkspace::create(dw, tokens, true);
  ASSERT_TRUE(ws.is_ok()) << ws.status().message();
  cublasHandle_t handle;
  ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);

  for (formats::ActQuant mode : {formats::ActQuant::NONE, formats::ActQuant::STATIC, formats::ActQuant::PER_TOKEN}) {
    std::vector<float> expected = expected_none;
    std::vector<std::vector<float>> outputs;  // per backend
    std::vector<MoeKernel> backends = {MoeKernel::GROUPED_MMA, MoeKernel::CUBLAS,
                                               MoeKernel::SKINNY, MoeKernel::WGMMA};
    if (tokens == 1) backends.push_back(MoeKernel::AUTO);  // the one-launch block where it fits
    for (MoeKernel backend : backends) {
      // The one-launch block routes into ws.expert_ids but writes no grouping.
      const bool block = backend == MoeKernel::AUTO &&
                         cuda::moe_decode_block_supported(tokens, dw, mode, nullptr, nullptr, nullptr);
      NIB_CUDA_CHECK(cudaMemset(d_out.get(), 0xFF, x.size() * sizeof(float)));  // NaN: nothing left unwritten
      const Status s = cuda::moe_forward(dw, **ws, {.x = d_x.get(), .tokens = tokens, .mode = mode, .kernel = backend, .out = d_out.get(), .cublas = handle});
      ASSERT_TRUE(s.is_ok()) << s.message();
      NIB_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> got = d_out.to_host();
      outputs.push_back(got);
      // The fused norms, run after the checks below (they reuse the workspace those read).
      auto fused_norm_checks = [&] {
        if (mode != formats::ActQuant::NONE && backend == MoeKernel::SKINNY) {
          // The combine's fused next norm, also writing x̂ for the next W4A4 GEMM: bit for bit what the
          // quantize kernel makes of the norm's BF16 output (static with an arbitrary scale, per-token).
          std::vector<float> residual(x.size());
          for (float& v : residual) v = normal(rng);
          std::vector<uint16_t> norm_w(static_cast<size_t>(c.hidden));
          for (auto& v : norm_w) v = formats::bf16_encode(1.0f + 0.1f * normal(rng));
          test::DeviceBuffer<float> d_res(residual), d_rows(static_cast<size_t>(tokens)), d_rows2(static_cast<size_t>(tokens));
          test::DeviceBuffer<uint16_t> d_nw(norm_w), d_h(x.size()), d_xq(x.size()), d_xq2(x.size());
          const float scale = mode == formats::ActQuant::STATIC ? 0.0173f : 0.0f;
          const cuda::ResidualNorm norm{d_res.get(), d_nw.get(), 1e-6f, d_h.get(), {scale, d_xq.get(), d_rows.get()}};
          ASSERT_TRUE(cuda::moe_forward(dw, **ws, {.x = d_x.get(), .tokens = tokens, .mode = mode, .kernel = backend, .cublas = handle, .norm = &norm}).is_ok());
          ASSERT_TRUE(cuda::quantize_dequantize_activation_bf16(d_h.get(), tokens, c.hidden, scale, d_xq2.get(), d_rows2.get(),
                                                                nullptr).is_ok());
          NIB_CUDA_CHECK(cudaDeviceSynchronize());
          EXPECT_EQ(d_xq.to_host(), d_xq2.to_host()) << "x̂ of the fused norm, hidden " << c.hidden;
          EXPECT_EQ(d_rows.to_host(), d_rows2.to_host()) << "row scales of the fused norm";
        }
        if (backend == MoeKernel::SKINNY) {
          // The block's own input norm (InputNorm; inside the router's launch up to 4 tokens, where the
          // combine adds the post-attention output) against add_rmsnorm before the block: the same bits
          // in h, x̂ and its row scales, the residual and the next norm's output.
          std::vector<float> residual(x.size()), delta(x.size());
          for (float& v : residual) v = normal(rng);
          for (float& v : delta) v = 0.5f * normal(rng);
          std::vector<uint16_t> post_w(static_cast<size_t>(c.hidden)), next_w(post_w.size());
          for (auto& v : post_w) v = formats::bf16_encode(1.0f + 0.1f * normal(rng));
          for (auto& v : next_w) v = formats::bf16_encode(1.0f + 0.1f * normal(rng));
          test::DeviceBuffer<float> d_delta(delta);
          test::DeviceBuffer<uint16_t> d_pw(post_w), d_nw(next_w);
          const cuda::NormActQuant quant{mode == formats::ActQuant::STATIC ? w.gate_up_input_scale : 0.0f,
                                         mode == formats::ActQuant::NONE ? nullptr : (*ws)->x_hat, (*ws)->x_row_scales};
          struct Result {
            std::vector<float> residual, row_scales;
            std::vector<uint16_t> h, x_hat, next;
          } results[2];
          for (int fused = 0; fused < 2; ++fused) {
            test::DeviceBuffer<float> d_res(residual);
            test::DeviceBuffer<uint16_t> d_h(x.size()), d_next(x.size());
            const cuda::ResidualNorm next{d_res.get(), d_nw.get(), 1e-6f, d_next.get(), {}};
            const cuda::InputNorm input{d_res.get(), d_delta.get(), d_pw.get(), 1e-6f, d_h.get(), quant};
            if (!fused)
              ASSERT_TRUE(cuda::add_rmsnorm(d_res.get(), d_delta.get(), tokens, c.hidden, d_pw.get(), 1e-6f, d_h.get(), nullptr,
                                            nullptr, quant).is_ok());
            ASSERT_TRUE(cuda::moe_forward(dw, **ws, {.x = d_h.get(), .tokens = tokens, .mode = mode, .kernel = backend, .cublas = handle, .norm = &next, .x_quantized = quant.x_hat != nullptr, .input_norm = fused ? &input : nullptr}).is_ok());
            NIB_CUDA_CHECK(cudaDeviceSynchronize());
            Result& r = results[fused];
            r.residual = d_res.to_host(), r.h = d_h.to_host(), r.next = d_next.to_host();
            r.x_hat.resize(x.size()), r.row_scales.resize(static_cast<size_t>(tokens));
            NIB_CUDA_CHECK(cudaMemcpy(r.x_hat.data(), (*ws)->x_hat, x.size() * 2, cudaMemcpyDeviceToHost));
            NIB_CUDA_CHECK(cudaMemcpy(r.row_scales.data(), (*ws)->x_row_scales, tokens * 4, cudaMemcpyDeviceToHost));
          }
          EXPECT_EQ(results[1].h, results[0].h) << "h of the block's own norm, T " << tokens;
          EXPECT_EQ(results[1].residual, results[0].residual) << "residual after the block, T " << tokens;
          EXPECT_EQ(results[1].next, results[0].next) << "the next norm, T " << tokens;
          if (quant.x_hat) {
            EXPECT_EQ(results[1].x_hat, results[0].x_hat) << "x̂ of the block's own norm, T " << tokens;
            EXPECT_EQ(results[1].row_scales, results[0].row_scales) << "row scales of the block's own norm, T " << tokens;
          }
        }
      };
      if (mode != formats::ActQuant::NONE && backend == MoeKernel::GROUPED_MMA) {
        // The reference experts on the GPU's x̂ · row scale, with the reference routing of x: re-quantizing
        // x̂ · s reproduces x̂ exactly (each block's maximum is 6 · its scale), so what remains is the
        // down input's re-quantization. (x̂ itself is checked against the CPU quantizer in test_cuda_linear.)
        std::vector<uint16_t> x_hat(x.size());
        std::vector<float> row_scales(static_cast<size_t>(tokens));
        NIB_CUDA_CHECK(cudaMemcpy(x_hat.data(), (*ws)->x_hat, x_hat.size() * 2, cudaMemcpyDeviceToHost));
        NIB_CUDA_CHECK(cudaMemcpy(row_scales.data(), (*ws)->x_row_scales, tokens * 4, cudaMemcpyDeviceToHost));
        std::vector<float> x_gpu(x.size());
        for (size_t i = 0; i < x.size(); ++i) x_gpu[i] = formats::bf16_decode(x_hat[i]) * row_scales[i / c.hidden];
        ASSERT_TRUE(ref::moe_experts(x_gpu.data(), tokens, w, mode, ref_ids.data(), ref_weights.data(), expected.data())
                        .is_ok());
      }

      // The grouping: counts match the routing used, rows of expert e are its pairs, pair_rows inverts.
      const int64_t pairs = tokens * c.top_k;
      const size_t n_pairs = static_cast<size_t>(pairs);
      std::vector<int32_t> ids(n_pairs), sorted(n_pairs), rows(n_pairs), offsets(static_cast<size_t>(c.experts + 1));
      NIB_CUDA_CHECK(cudaMemcpy(ids.data(), (*ws)->expert_ids, pairs * 4, cudaMemcpyDeviceToHost));
      NIB_CUDA_CHECK(cudaMemcpy(offsets.data(), (*ws)->groups.expert_offsets, (c.experts + 1) * 4, cudaMemcpyDeviceToHost));
      NIB_CUDA_CHECK(cudaMemcpy(sorted.data(), (*ws)->groups.sorted_pairs, pairs * 4, cudaMemcpyDeviceToHost));
      NIB_CUDA_CHECK(cudaMemcpy(rows.data(), (*ws)->groups.pair_rows, pairs * 4, cudaMemcpyDeviceToHost));
      if (!block) {  // the grouping (not written by the one-launch block)
        ASSERT_EQ(offsets[0], 0);
        ASSERT_EQ(offsets[c.experts], pairs);
        for (int64_t e = 0; e < c.experts; ++e)
          for (int32_t r = offsets[e]; r < offsets[e + 1]; ++r) {
            ASSERT_EQ(ids[sorted[r]], e) << "sorted row " << r;
            ASSERT_EQ(rows[sorted[r]], r);
          }
        // The tile list the GEMMs walk: each expert's rows in tiles of the backend's height, in order.
        const MoeKernel kernels = cuda::resolve_moe_kernel(backend, tokens, dw);
        const int tile_rows = cuda::moe_grouping_tile_rows(kernels, pairs, dw);
        std::vector<int32_t> tile_offsets(static_cast<size_t>(c.experts + 1));
        NIB_CUDA_CHECK(cudaMemcpy(tile_offsets.data(), (*ws)->groups.tile_offsets, (c.experts + 1) * 4, cudaMemcpyDeviceToHost));
        std::vector<int4> tiles(static_cast<size_t>(tile_offsets[c.experts]));
        NIB_CUDA_CHECK(cudaMemcpy(tiles.data(), (*ws)->groups.tiles, tiles.size() * sizeof(int4), cudaMemcpyDeviceToHost));
        size_t next = 0;
        for (int64_t e = 0; e < c.experts; ++e)
          for (int32_t r = offsets[e]; r < offsets[e + 1]; r += tile_rows, ++next) {
            ASSERT_LT(next, tiles.size()) << "expert " << e;
            EXPECT_EQ(tiles[next].x, e);
            EXPECT_EQ(tiles[next].y, r);
            EXPECT_EQ(tiles[next].z, std::min(tile_rows, offsets[e + 1] - r));
          }
        EXPECT_EQ(next, tiles.size());
      }

      int64_t skipped = 0;
      double max_ref = 0, max_err = 0, sum_err = 0;
      int64_t compared = 0;
      std::vector<double> errors;
      for (int64_t t = 0; t < tokens; ++t) {
        if (!std::equal(ids.begin() + t * c.top_k, ids.begin() + (t + 1) * c.top_k, ref_ids.begin() + t * c.top_k)) {
          if (++skipped <= 2) {
            std::printf("  token %lld routed apart (GPU / reference experts):", (long long)t);
            for (int64_t j = 0; j < c.top_k; ++j)
              std::printf(" %d/%d", ids[size_t(t * c.top_k + j)], ref_ids[size_t(t * c.top_k + j)]);
            std::printf("\n");
          }
          continue;
        }
        for (int64_t h = 0; h < c.hidden; ++h) {
          const size_t i = size_t(t * c.hidden + h);
          max_ref = std::max(max_ref, double(std::fabs(expected[i])));
          const double err = std::fabs(double(got[i]) - expected[i]);
          ASSERT_FALSE(std::isnan(got[i])) << "token " << t << " h " << h;
          max_err = std::max(max_err, err);
          sum_err += err;
          errors.push_back(err);
          ++compared;
        }
      }
      EXPECT_LE(skipped, 1 + tokens / 500);
      if (errors.empty()) {  // the one token routed apart (a near-tie): nothing to compare
        fused_norm_checks();
        continue;
      }
      const double max_rel = max_err / max_ref, mean_rel = sum_err / std::max<int64_t>(compared, 1) / max_ref;
      const size_t p999 = errors.size() * 999 / 1000;
      std::nth_element(errors.begin(), errors.begin() + p999, errors.end());
      const double p999_rel = errors[p999] / max_ref;
      std::printf("moe %-9s %-15s E=%-3lld k=%lld H=%-4lld I=%-4lld T=%-5lld%s max rel err %.2e p99.9 %.2e mean %.2e (%lld tokens "
                  "skipped: router near-tie)\n",
                  formats::act_quant_name(mode), kernel_name(backend), (long long)c.experts, (long long)c.top_k,
                  (long long)c.hidden, (long long)c.intermediate, (long long)tokens, identical_tokens ? " same" : "     ",
                  max_rel, p999_rel, mean_rel, (long long)skipped);
      const bool w4a4 = mode != formats::ActQuant::NONE;
      const std::string what = std::string(formats::act_quant_name(mode)) + " " + kernel_name(backend);
      // W4A16's bound on a small model (hidden < 1,024) is 1.5× wider: each output sums few SwiGLU
      // values, so its maximum rests on a few BF16 roundings (dequant-cublas rounds gate and up to BF16
      // before the SwiGLU; a T = 1 seed measured 9.2e-3 there, a seed of the H = 128 config at every T
      // 8.06e-3).
      EXPECT_LT(max_rel, w4a4 ? 2e-2 : c.hidden >= 1024 ? 8e-3 : 1.2e-2) << what;
      // The mean over fewer than 1,024 outputs (one token of a small model) rests on a handful of BF16
      // roundings of the output: twice the bound there (a T = 1 seed measured 1.52e-3 on dequant-cublas).
      EXPECT_LT(mean_rel, compared >= 1024 ? 1.5e-3 : 3e-3) << what;
      // The 99.9th percentile is a tail only over more than one token's outputs: a code at a rounding
      // edge of one token's static x̂ (the GPU's rcp.approx against the CPU's division) moves all that
      // token's outputs together, every backend alike (H = 128, T = 33, one seed: p99.9 6.9e-3 on all four
      // backends, which agreed with each other within 1.9e-3). Below 1,000 tokens the max bound holds.
      if (w4a4 && compared >= 1000 * c.hidden) EXPECT_LT(p999_rel, 5e-3) << what;
      fused_norm_checks();
    }
    if (mode == formats::ActQuant::NONE) continue;
    // W4A4: fused, skinny and wgmma against dequant-cublas (same quantizer, same routing), relative to max|ref|.
    for (size_t b : {size_t{0}, size_t{2}, size_t{3}}) {
      double max_ref = 0, sum_diff = 0;
      std::vector<double> diffs;
      for (size_t i = 0; i < expected.size(); ++i) {
        max_ref = std::max(max_ref, double(std::fabs(expected[i])));
        diffs.push_back(std::fabs(double(outputs[b][i]) - outputs[1][i]));
        sum_diff += diffs.back();
      }
      const size_t p999 = diffs.size() * 999 / 1000;
      std::nth_element(diffs.begin(), diffs.begin() + p999, diffs.end());
      std::printf("    %s vs dequant-cublas: p99.9 %.2e mean %.2e\n", kernel_name(backends[b]), diffs[p999] / max_ref,
                  sum_diff / diffs.size() / max_ref);
      EXPECT_LT(diffs[p999] / max_ref, 1e-2) << formats::act_quant_name(mode);
      EXPECT_LT(sum_diff / diffs.size() / max_ref, 1e-3) << formats::act_quant_name(mode);
    }
  }
  cublasDestroy(handle);
}

TEST(CudaMoe, MatchesReferenceOnQwen3Shapes) {
  NIB_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::test_seed("CudaMoe.Qwen3");
  const Problem p = make_problem(QWEN3_30B, seed);
  for (int64_t tokens : {1, 3, 4, 17, 64, 255, 1000, 4099}) check(p, tokens, false, seed + tokens);  // every tiling
}

TEST(CudaMoe, AllTokensOnTheSameExperts) {
  NIB_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::test_seed("CudaMoe.SameExperts");
  const Problem p = make_problem(QWEN3_30B, seed);
  check(p, 300, true, seed);  // 8 experts with 300 rows (3 tiles of 128), 120 with none
  const Problem one = make_problem({8, 1, 256, 128}, seed + 1);
  check(one, 77, true, seed + 2);  // top-1: one expert has every token
}

TEST(CudaMoe, SmallOddConfig) {
  NIB_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::test_seed("CudaMoe.Small");
  const Problem p = make_problem({16, 2, 128, 192}, seed);  // I = 192: uneven gate_up tiles, k-step 64 only
  for (int64_t tokens : {1, 33, 1000}) check(p, tokens, false, seed + tokens);
  // hidden > 2,048 (the small router's 16-chunk rows) and a cluster of two: its second CTA writes every x̂ row
  const Problem wide = make_problem({32, 4, 2560, 256}, seed + 7);
  check(wide, 4, false, seed + 8);
}

// The one-launch block (moe_decode.cuh) against the kernel chain (SKINNY) at T = 1 on Qwen3-30B-A3B
// shapes, in all three modes: the same routing bit for bit (the logits are computed alike), the same
// input norm h — and in W4A4 its x̂ and row scale — bit for bit, and outputs within roundings. W4A16:
// both round the SwiGLU and down outputs to BF16 after fp32 sums in different orders, so a value near
// a rounding boundary may land one BF16 step (2⁻⁸ relative) apart and carry that into the combine: max
// 4e-3, mean 2e-4 of max|out|. W4A4 re-quantizes the fp32 SwiGLU rows, so a value at an E2M1 rounding
// edge (or a per-token row amax one bit apart) may land a step apart in x̂ and move its output by up to
// ~1%: max 2e-2, mean 1e-3 (test check()'s bounds for the same effect). With the norms fused: the
// residual within 1e-3 of its max (W4A4: 5e-3), the next norm's BF16 output within 1e-2 of its max and
// a mean of 1e-3 (its sum of squares is also taken in another order), and its x̂ and row scale (asked
// in every mode: a W4A16 MoE may sit between W4A4 dense layers) bit for bit what the quantize kernel
// makes of the block's own next-norm output.
TEST(CudaMoe, DecodeBlockMatchesTheKernelChain) {
  NIB_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::test_seed("CudaMoe.DecodeBlock");
  const Problem p = make_problem(QWEN3_30B, seed);
  const Config& c = p.c;
  DeviceProblem device(p);
  cuda::DeviceMoeWeights& dw = device.w;
  if (!cuda::moe_decode_block_supported(1, dw, formats::ActQuant::NONE, nullptr, nullptr, nullptr))
    GTEST_SKIP() << "the one-launch MoE block does not fit this GPU";
  auto ws = cuda::MoeWorkspace::create(dw, 1, false);
  ASSERT_TRUE(ws.is_ok()) << ws.status().message();
  cublasHandle_t handle;
  ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
  std::mt19937_64 rng(seed + 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t H = static_cast<size_t>(c.hidden), k = static_cast<size_t>(c.top_k);
  auto max_abs = [](const std::vector<float>& v) {
    double m = 0;
    for (float x : v) m = std::max(m, double(std::fabs(x)));
    return m;
  };
  auto bf16_values = [](const std::vector<uint16_t>& bits) {
    std::vector<float> v(bits.size());
    for (size_t i = 0; i < v.size(); ++i) v[i] = formats::bf16_decode(bits[i]);
    return v;
  };
  auto random_x = [&] {
    std::vector<uint16_t> x_bits(H);
    for (auto& v : x_bits) v = formats::bf16_encode(normal(rng) * (rng() % 97 == 0 ? 20.0f : 1.0f));
    return x_bits;
  };
  {  // static input scales calibrated on one such input (amax / (6 · 448)), as check() does
    const std::vector<float> x = bf16_values(random_x());
    float x_amax = 0.0f, act_amax = 0.0f;
    for (float v : x) x_amax = std::max(x_amax, std::fabs(v));
    std::vector<float> out(H);
    ASSERT_TRUE(ref::moe(x.data(), 1, p.ref, formats::ActQuant::NONE, out.data(),
                         [&](int64_t, const char* stage, const float* in, int64_t rows, int64_t width) {
                           if (std::string(stage) != "down") return;
                           for (int64_t i = 0; i < rows * width; ++i) act_amax = std::max(act_amax, std::fabs(in[i]));
                         }).is_ok());
    dw.gate_up_input_scale = x_amax / 2688.0f, dw.down_input_scale = act_amax / 2688.0f;
  }
  // The last trial routes on a router whose rows come in equal pairs (2j + 1 a copy of 2j): every logit
  // ties with its pair's, so the choice's order on ties (the lower expert first, torch.topk's) is
  // checked between the block's top-k by rank and the chain's by rounds.
  std::vector<uint16_t> paired_rows(p.router);
  for (size_t e = 1; e < size_t(c.experts); e += 2)
    std::copy_n(p.router.begin() + (e - 1) * H, H, paired_rows.begin() + e * H);
  test::DeviceBuffer<uint16_t> d_paired(paired_rows);
  const uint16_t* const own_router = dw.router;
  constexpr int TRIALS = 5;
  for (formats::ActQuant mode : {formats::ActQuant::NONE, formats::ActQuant::STATIC, formats::ActQuant::PER_TOKEN}) {
    const bool w4a4 = mode != formats::ActQuant::NONE;
    const char* mode_name = formats::act_quant_name(mode);
    for (int trial = 0; trial < TRIALS; ++trial) {
      const bool ties = trial == TRIALS - 1;
      dw.router = ties ? d_paired.get() : own_router;
      const std::vector<uint16_t> x_bits = random_x();
      std::vector<uint16_t> post_w(H), next_w(H);
      std::vector<float> residual(H), delta(H);
      for (float& v : residual) v = normal(rng);
      for (float& v : delta) v = 0.5f * normal(rng);
      for (auto& v : post_w) v = formats::bf16_encode(1.0f + 0.1f * normal(rng));
      for (auto& v : next_w) v = formats::bf16_encode(1.0f + 0.1f * normal(rng));
      test::DeviceBuffer<uint16_t> d_x(x_bits), d_pw(post_w), d_nw(next_w);
      test::DeviceBuffer<float> d_delta(delta);
      // The next norm's x̂ as the runner asks it for the next layer's q/k/v (an arbitrary static scale),
      // in W4A16 too (W4A4 dense layers beside a W4A16 MoE: static and per-token on alternate trials).
      const bool next_static = mode == formats::ActQuant::STATIC || (mode == formats::ActQuant::NONE && trial % 2 == 0);
      const float next_scale = next_static ? 0.0173f : 0.0f;
      struct Run {
        std::vector<float> out, weights, residual, x_scale, next_scale;
        std::vector<int32_t> ids;
        std::vector<uint16_t> h, x_hat, next, next_hat;
      } runs[2];
      for (int chain = 0; chain < 2; ++chain) {
        const MoeKernel backend = chain ? MoeKernel::SKINNY : MoeKernel::AUTO;
        Run& r = runs[chain];
        test::DeviceBuffer<float> d_out(H);
        NIB_CUDA_CHECK(cudaMemset(d_out.get(), 0xFF, H * sizeof(float)));  // NaN: nothing left unwritten
        ASSERT_TRUE(cuda::moe_forward(dw, **ws, {.x = d_x.get(), .tokens = 1, .mode = mode, .kernel = backend, .out = d_out.get(), .cublas = handle}).is_ok());
        NIB_CUDA_CHECK(cudaDeviceSynchronize());
        r.out = d_out.to_host();
        r.ids.resize(k), r.weights.resize(k);
        NIB_CUDA_CHECK(cudaMemcpy(r.ids.data(), (*ws)->expert_ids, k * 4, cudaMemcpyDeviceToHost));
        NIB_CUDA_CHECK(cudaMemcpy(r.weights.data(), (*ws)->route_weights, k * 4, cudaMemcpyDeviceToHost));
        // The block's own input norm and the next norm fused, as a decode step of the model runs it.
        // The input norm's x̂ where the runner has it written: the workspace's, which the chain's GEMMs read.
        test::DeviceBuffer<float> d_res(residual), d_next_scale(1);
        test::DeviceBuffer<uint16_t> d_h(H), d_next(H), d_next_hat(H);
        NIB_CUDA_CHECK(cudaMemset((*ws)->x_hat, 0xFF, H * 2));
        NIB_CUDA_CHECK(cudaMemset(d_next_hat.get(), 0xFF, H * 2));
        const cuda::NormActQuant x_quant{mode == formats::ActQuant::STATIC ? dw.gate_up_input_scale : 0.0f,
                                         w4a4 ? (*ws)->x_hat : nullptr, (*ws)->x_row_scales};
        const cuda::ResidualNorm next{d_res.get(), d_nw.get(), 1e-6f, d_next.get(),
                                      {next_scale, d_next_hat.get(), d_next_scale.get()}};
        const cuda::InputNorm input{d_res.get(), d_delta.get(), d_pw.get(), 1e-6f, d_h.get(), x_quant};
        const bool block = !chain && cuda::moe_decode_block_supported(1, dw, mode, &next, nullptr, &input);
        ASSERT_EQ(block, !chain) << "the block takes T = 1 with both norms in " << mode_name;
        ASSERT_TRUE(cuda::moe_forward(dw, **ws, {.x = d_h.get(), .tokens = 1, .mode = mode, .kernel = backend, .cublas = handle, .norm = &next, .x_quantized = w4a4, .input_norm = &input}).is_ok());
        NIB_CUDA_CHECK(cudaDeviceSynchronize());
        r.residual = d_res.to_host(), r.h = d_h.to_host(), r.next = d_next.to_host();
        if (w4a4) {
          r.x_hat.resize(H), r.x_scale.resize(1);
          NIB_CUDA_CHECK(cudaMemcpy(r.x_hat.data(), (*ws)->x_hat, H * 2, cudaMemcpyDeviceToHost));
          NIB_CUDA_CHECK(cudaMemcpy(r.x_scale.data(), (*ws)->x_row_scales, 4, cudaMemcpyDeviceToHost));
        }
        if (block && mode == formats::ActQuant::PER_TOKEN) {
          // The block's per-token SwiGLU row amaxes: the set this launch used holds each row's amax of
          // the fp32 rows it left in ws.act, bit for bit, and the other set is cleared for the next
          // launch (a stale maximum there would coarsen a later token's x̂).
          const size_t I = static_cast<size_t>(c.intermediate);
          std::vector<float> act(k * I);
          std::vector<uint32_t> sets(2 * cuda::DECODE_BLOCK_MAX_TOP_K);
          NIB_CUDA_CHECK(cudaMemcpy(act.data(), (*ws)->act, act.size() * 4, cudaMemcpyDeviceToHost));
          NIB_CUDA_CHECK(cudaMemcpy(sets.data(), (*ws)->block_slot_amax, sets.size() * 4, cudaMemcpyDeviceToHost));
          std::vector<uint32_t> want(k);
          for (size_t s = 0; s < k; ++s) {
            float m = 0.0f;
            for (size_t i = 0; i < I; ++i) m = std::max(m, std::fabs(act[s * I + i]));
            std::memcpy(&want[s], &m, 4);
          }
          const auto set = [&](int i) {
            return std::vector<uint32_t>(sets.begin() + i * cuda::DECODE_BLOCK_MAX_TOP_K,
                                         sets.begin() + i * cuda::DECODE_BLOCK_MAX_TOP_K + k);
          };
          const std::vector<uint32_t> zeros(k, 0u);
          EXPECT_TRUE((set(0) == want && set(1) == zeros) || (set(1) == want && set(0) == zeros))
              << "slot amaxes, trial " << trial;
        }
        // The next x̂ against the quantize kernel on this run's own next-norm output.
        r.next_hat = d_next_hat.to_host(), r.next_scale = d_next_scale.to_host();
        test::DeviceBuffer<uint16_t> d_want(H);
        test::DeviceBuffer<float> d_want_scale(1);
        ASSERT_TRUE(cuda::quantize_dequantize_activation_bf16(d_next.get(), 1, c.hidden, next_scale, d_want.get(),
                                                              d_want_scale.get(), nullptr).is_ok());
        NIB_CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_EQ(r.next_hat, d_want.to_host()) << "x̂ of the next norm, " << (chain ? "chain" : "block") << ", " << mode_name;
        EXPECT_EQ(r.next_scale, d_want_scale.to_host()) << "its row scale, " << mode_name;
      }
      const Run &block = runs[0], &chain = runs[1];
      if (ties)  // the pairs were chosen together, the lower expert first
        for (size_t s = 0; s + 1 < k; s += 2)
          EXPECT_TRUE(block.ids[s] % 2 == 0 && block.ids[s + 1] == block.ids[s] + 1) << "slot " << s << ", " << mode_name;
      EXPECT_EQ(block.ids, chain.ids) << mode_name << " trial " << trial;
      EXPECT_EQ(block.weights, chain.weights) << mode_name << " trial " << trial;
      EXPECT_EQ(block.h, chain.h) << "h of the input norm, " << mode_name << " trial " << trial;
      EXPECT_EQ(block.x_hat, chain.x_hat) << "x̂ of the input norm, " << mode_name << " trial " << trial;
      EXPECT_EQ(block.x_scale, chain.x_scale) << "its row scale, " << mode_name << " trial " << trial;
      auto compare = [&](const std::vector<float>& got, const std::vector<float>& want, double max_bound, double mean_bound,
                         const char* what) {
        const double scale = max_abs(want);
        double max_diff = 0, sum_diff = 0;
        for (size_t i = 0; i < want.size(); ++i) {
          ASSERT_FALSE(std::isnan(got[i])) << what << " " << i;
          const double d = std::fabs(double(got[i]) - want[i]);
          max_diff = std::max(max_diff, d), sum_diff += d;
        }
        std::printf("decode block vs chain, %-9s trial %d: %-9s max %.2e mean %.2e of max|chain| %.3g\n", mode_name, trial,
                    what, max_diff / scale, sum_diff / want.size() / scale, scale);
        EXPECT_LE(max_diff / scale, max_bound) << what << ", " << mode_name << " trial " << trial;
        EXPECT_LE(sum_diff / want.size() / scale, mean_bound) << what << ", " << mode_name << " trial " << trial;
      };
      // Both round the SwiGLU rows and the expert outputs to BF16 after summing in different orders, so
      // a value near the largest may round the other way (one BF16 step is up to 2^-7 of it, weighted
      // by its routing weight): 4e-3 failed once at 4.67e-3 (seed 62227023197) with a mean of 5.6e-5.
      compare(block.out, chain.out, w4a4 ? 2e-2 : 8e-3, w4a4 ? 1e-3 : 2e-4, "output");
      compare(block.residual, chain.residual, w4a4 ? 5e-3 : 1e-3, 1e-4, "residual");
      compare(bf16_values(block.next), bf16_values(chain.next), 1e-2, 1e-3, "next norm");
    }
  }
  dw.router = own_router;
  cublasDestroy(handle);
}

// Expert parallelism: two ranks each holding half the experts (expert_begin, gate.experts = E / 2) route
// over all of them, keep their own pairs and combine only those; their outputs sum to the whole
// block's on every backend and mode, up to the fp32 order of the combine's sums (tolerance 1e-5 of
// max|out|: each expert's rows are the same BF16 values either way).
TEST(CudaMoe, ExpertParallelHalvesSumToTheWholeBlock) {
  NIB_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::test_seed("CudaMoe.ExpertParallelHalvesSumToTheWholeBlock");
  const Config c{32, 4, 256, 128};
  const Problem p = make_problem(c, seed);
  DeviceProblem device(p);
  cuda::DeviceMoeWeights& whole = device.w;
  whole.gate_up_input_scale = 0.01f, whole.down_input_scale = 0.01f;
  auto half = [&](int64_t r) {  // rank r's view: experts [r · E/2, (r + 1) · E/2)
    cuda::DeviceMoeWeights w = whole;
    const int64_t n = c.experts / 2, b = r * n;
    auto part = [&](const cuda::DeviceNvfp4Experts& x) {
      return cuda::DeviceNvfp4Experts{x.packed + b * x.rows * x.cols / 2, x.block_scales + b * x.rows * x.cols / 16,
                                      x.global_scales + b, n, x.rows, x.cols};
    };
    w.gate = part(whole.gate), w.up = part(whole.up), w.down = part(whole.down), w.expert_begin = b;
    return w;
  };
  const cuda::DeviceMoeWeights ranks[2] = {half(0), half(1)};
  cublasHandle_t handle;
  ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t tokens : {1, 5, 64, 300}) {
    std::vector<uint16_t> x(size_t(tokens * c.hidden));
    for (uint16_t& v : x) v = formats::bf16_encode(normal(rng));
    test::DeviceBuffer<uint16_t> d_x(x);
    test::DeviceBuffer<float> d_out(x.size());
    auto ws = cuda::MoeWorkspace::create(whole, tokens, false);
    ASSERT_TRUE(ws.is_ok()) << ws.status().message();
    for (formats::ActQuant mode : {formats::ActQuant::NONE, formats::ActQuant::STATIC, formats::ActQuant::PER_TOKEN})
      for (MoeKernel backend : {MoeKernel::AUTO, MoeKernel::GROUPED_MMA, MoeKernel::SKINNY, MoeKernel::WGMMA}) {
        auto run = [&](const cuda::DeviceMoeWeights& w) {
          NIB_CUDA_CHECK(cudaMemset(d_out.get(), 0xFF, x.size() * sizeof(float)));  // NaN: nothing left unwritten
          const Status s = cuda::moe_forward(
              w, **ws, {.x = d_x.get(), .tokens = tokens, .mode = mode, .kernel = backend, .out = d_out.get(),
                        .cublas = handle});
          EXPECT_TRUE(s.is_ok()) << s.message();
          NIB_CUDA_CHECK(cudaDeviceSynchronize());
          return d_out.to_host();
        };
        const std::vector<float> all = run(whole), a = run(ranks[0]), b = run(ranks[1]);
        double scale = 0, worst = 0;
        for (float v : all) scale = std::max(scale, std::fabs(double(v)));
        for (size_t i = 0; i < all.size(); ++i) worst = std::max(worst, std::fabs(double(a[i]) + b[i] - all[i]));
        EXPECT_LE(worst, 1e-5 * scale) << tokens << " tokens, " << formats::act_quant_name(mode) << ", backend "
                                       << int(backend);
      }
  }
  cublasDestroy(handle);
}

TEST(CudaMoe, BadInputsAreErrors) {
  NIB_SKIP_WITHOUT_GPU();
  cuda::DeviceMoeWeights w;
  w.router = reinterpret_cast<const uint16_t*>(16);
  w.experts = 4, w.top_k = 2, w.hidden = 64, w.intermediate = 128;
  const cuda::DeviceNvfp4Experts fake{reinterpret_cast<const uint8_t*>(256), reinterpret_cast<const uint8_t*>(256),
                                      reinterpret_cast<const float*>(256), 4, 128, 64};
  w.gate = w.up = fake;
  w.down = {fake.packed, fake.block_scales, fake.global_scales, 4, 64, 128};
  auto ws = cuda::MoeWorkspace::create(w, 8, false);
  ASSERT_TRUE(ws.is_ok());
  float* out = reinterpret_cast<float*>(256);
  const Status too_many = cuda::moe_forward(w, **ws, {.x = reinterpret_cast<const uint16_t*>(256), .tokens = 9, .mode = formats::ActQuant::NONE, .kernel = MoeKernel::GROUPED_MMA, .out = out});
  EXPECT_NE(too_many.message().find("workspace holds 8"), std::string::npos) << too_many.message();
  const Status no_cublas_ws = cuda::moe_forward(w, **ws, {.x = reinterpret_cast<const uint16_t*>(256), .tokens = 1, .mode = formats::ActQuant::STATIC, .kernel = MoeKernel::CUBLAS, .out = out});
  EXPECT_NE(no_cublas_ws.message().find("input scales"), std::string::npos) << no_cublas_ws.message();
  cuda::DeviceMoeWeights odd_w = w;
  odd_w.intermediate = 96, odd_w.gate.rows = odd_w.up.rows = 96, odd_w.down.cols = 96;
  const Status odd_layer = cuda::moe_forward(odd_w, **ws, {.x = reinterpret_cast<const uint16_t*>(256), .tokens = 1, .mode = formats::ActQuant::NONE, .kernel = MoeKernel::GROUPED_MMA, .out = out});
  EXPECT_NE(odd_layer.message().find("multiples of 64"), std::string::npos) << odd_layer.message();
  // The grouped GEMM checks on its own too: in_features 96 is not a multiple of 64.
  cuda::GroupedGemmArgs args;
  args.act = reinterpret_cast<const uint16_t*>(256), args.expert_offsets = args.tile_offsets = (const int32_t*)256;
  args.out = out, args.pairs = 2, args.tile_rows = 16;
  const Status odd = cuda::moe_gemm_down(args, odd_w.down, nullptr);
  EXPECT_NE(odd.message().find("multiple of 64"), std::string::npos) << odd.message();
}

}  // namespace

// Host-side logic of the CUDA layer, which runs without a GPU: backend names and AUTO's choices, the MoE tiling choice
// (every choice must have a k-step dividing both in_features, or the GEMM launch refuses), and the
// grid bound max_expert_tiles against the tiles random routings actually need (a low bound would
// leave tiles without a CTA, i.e. rows never computed), and the GPU layout of the NVFP4 codes and scales.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/attention/attention.cuh"
#include "cuda/gemm/linear_nvfp4.cuh"
#include "cuda/moe/moe_gemm.cuh"
#include "cuda/moe/moe.cuh"
#include "cuda/moe/moe_grouping.cuh"
#include "cuda/moe/moe_router.cuh"
#include "cuda/nvfp4/nvfp4_layout.h"
#include "cuda/gemm/nvfp4_wgmma.cuh"
#include "cuda/gemm/skinny_gemm.cuh"
#include "formats/e2m1.h"
#include "formats/e4m3.h"
#include "test_seed.h"

using namespace nibble;

TEST(CudaHost, KernelNamesRoundTrip) {
  for (DenseKernel k : {DenseKernel::AUTO, DenseKernel::GEMV, DenseKernel::CUBLAS, DenseKernel::SKINNY,
                        DenseKernel::WGMMA, DenseKernel::SKINNY_SPLIT})
    EXPECT_EQ(parse_dense_kernel(kernel_name(k)), k);
  for (MoeKernel k : {MoeKernel::AUTO, MoeKernel::GROUPED_MMA, MoeKernel::CUBLAS, MoeKernel::SKINNY, MoeKernel::WGMMA})
    EXPECT_EQ(parse_moe_kernel(kernel_name(k)), k);
  EXPECT_EQ(dense_kernel_names().size(), 6u);
  EXPECT_EQ(moe_kernel_names().front(), "auto");
  // The names of before the kernels were named by role are not taken: each flag has its own list.
  EXPECT_FALSE(parse_dense_kernel("fused").has_value() || parse_dense_kernel("dequant-cublas").has_value());
  EXPECT_FALSE(parse_moe_kernel("skinny-split").has_value() || parse_moe_kernel("gemv").has_value());
  EXPECT_FALSE(parse_dense_kernel("").has_value());
}

// Which kernels AUTO picks: skinny for few rows where in_features allows it (multiples of 128; the
// MoE kernels up to 8192), the earlier rules elsewhere; an explicit SKINNY or GEMV that cannot run falls back rather
// than fail.
TEST(CudaHost, AutoPicksTheSkinnyKernelsForFewRows) {
  EXPECT_TRUE(cuda::skinny_supported(2048) && cuda::skinny_supported(768) && cuda::skinny_supported(8192));
  EXPECT_FALSE(cuda::skinny_supported(96) || cuda::skinny_supported(8320) || cuda::skinny_supported(0));
  EXPECT_TRUE(cuda::skinny_linear_supported(8320) && cuda::skinny_linear_supported(12288));  // k ranges
  EXPECT_FALSE(cuda::skinny_linear_supported(96) || cuda::skinny_linear_supported(0));
  EXPECT_EQ(cuda::resolve_dense_kernel(DenseKernel::AUTO, 1, 2048), DenseKernel::SKINNY);
  EXPECT_EQ(cuda::resolve_dense_kernel(DenseKernel::AUTO, cuda::AUTO_SKINNY_SPLIT_MIN_M - 1, 4096),
            DenseKernel::SKINNY);
  // The split-K kernel from AUTO_SKINNY_SPLIT_MIN_M to AUTO_SKINNY_SPLIT_MAX_M rows, then dequant-cublas;
  // an explicit skinny-split takes up to 64 rows, and beyond them or on K it cannot take is AUTO's choice.
  EXPECT_EQ(cuda::resolve_dense_kernel(DenseKernel::AUTO, cuda::AUTO_SKINNY_SPLIT_MIN_M, 4096),
            DenseKernel::SKINNY_SPLIT);
  EXPECT_EQ(cuda::resolve_dense_kernel(DenseKernel::AUTO, cuda::AUTO_SKINNY_SPLIT_MAX_M, 2048),
            DenseKernel::SKINNY_SPLIT);
  EXPECT_EQ(cuda::resolve_dense_kernel(DenseKernel::AUTO, cuda::AUTO_SKINNY_SPLIT_MAX_M + 1, 4096),
            DenseKernel::CUBLAS);
  EXPECT_EQ(cuda::resolve_dense_kernel(DenseKernel::SKINNY_SPLIT, cuda::SKINNY_SPLIT_MAX_M, 4096),
            DenseKernel::SKINNY_SPLIT);
  EXPECT_EQ(cuda::resolve_dense_kernel(DenseKernel::SKINNY_SPLIT, 1, 2048), DenseKernel::SKINNY_SPLIT);
  EXPECT_EQ(cuda::resolve_dense_kernel(DenseKernel::SKINNY_SPLIT, 65, 2048), DenseKernel::CUBLAS);
  EXPECT_EQ(cuda::resolve_dense_kernel(DenseKernel::SKINNY_SPLIT, 40, 192), DenseKernel::CUBLAS);
  EXPECT_EQ(cuda::resolve_dense_kernel(DenseKernel::AUTO, 1, 192), DenseKernel::GEMV);  // K not a multiple of 128
  EXPECT_EQ(cuda::resolve_dense_kernel(DenseKernel::SKINNY, 1, 192), DenseKernel::GEMV);
  EXPECT_EQ(cuda::resolve_dense_kernel(DenseKernel::GEMV, 1, 2048), DenseKernel::GEMV);
  // ERNIE-4.5's dense down_proj (K = 12,288): beyond the fused GEMV, skinny in two k ranges.
  EXPECT_EQ(cuda::resolve_dense_kernel(DenseKernel::AUTO, 1, 12288), DenseKernel::SKINNY);
  EXPECT_EQ(cuda::resolve_dense_kernel(DenseKernel::GEMV, 1, 12288), DenseKernel::SKINNY);
  EXPECT_EQ(cuda::resolve_dense_kernel(DenseKernel::GEMV, 1, 12288 + 64), DenseKernel::CUBLAS);  // neither

  cuda::DeviceMoeWeights qwen3;
  qwen3.hidden = 2048, qwen3.intermediate = 768, qwen3.experts = 128, qwen3.top_k = 8;
  EXPECT_EQ(cuda::resolve_moe_kernel(MoeKernel::AUTO, 1, qwen3), MoeKernel::SKINNY);
  // Skinny while experts average fewer than 24 rows (383 tokens · top-8 over 128 experts, not 384),
  // wgmma from there: no fused band on Qwen3's shapes.
  static_assert(cuda::AUTO_SKINNY_MOE_MAX_ROWS_PER_EXPERT == 24 && cuda::AUTO_WGMMA_MOE_MIN_ROWS_PER_EXPERT == 24);
  EXPECT_EQ(cuda::resolve_moe_kernel(MoeKernel::AUTO, 383, qwen3), MoeKernel::SKINNY);
  EXPECT_EQ(cuda::resolve_moe_kernel(MoeKernel::AUTO, 384, qwen3), MoeKernel::WGMMA);
  // Skinny tiles grow with the rows per expert: 8 below 3 on average, 16 below 16, else 32.
  EXPECT_EQ(cuda::skinny_moe_tile_rows(8, 128), 8);
  EXPECT_EQ(cuda::skinny_moe_tile_rows(383, 128), 8);
  EXPECT_EQ(cuda::skinny_moe_tile_rows(48 * 8, 128), 16);
  EXPECT_EQ(cuda::skinny_moe_tile_rows(64 * 8, 128), 16);
  EXPECT_EQ(cuda::skinny_moe_tile_rows(255 * 8, 128), 16);
  EXPECT_EQ(cuda::skinny_moe_tile_rows(256 * 8, 128), 32);
  EXPECT_EQ(cuda::moe_grouping_tile_rows(MoeKernel::SKINNY, 128 * 8, qwen3), 16);
  EXPECT_EQ(cuda::resolve_moe_kernel(MoeKernel::AUTO, 511, qwen3), MoeKernel::WGMMA);
  EXPECT_EQ(cuda::resolve_moe_kernel(MoeKernel::WGMMA, 1, qwen3), MoeKernel::WGMMA);
  EXPECT_TRUE(cuda::wgmma_supported(768, 2048) && cuda::wgmma_supported(2048, 768));
  EXPECT_TRUE(cuda::wgmma_supported(41, 128));
  EXPECT_FALSE(cuda::wgmma_supported(768, 96) || cuda::wgmma_supported(2, 0));
  EXPECT_EQ(cuda::resolve_dense_kernel(DenseKernel::WGMMA, 4096, 2048), DenseKernel::WGMMA);
  EXPECT_EQ(cuda::resolve_dense_kernel(DenseKernel::WGMMA, 4096, 96), DenseKernel::CUBLAS);  // K not a multiple of 64
  cuda::DeviceMoeWeights odd = qwen3;
  odd.intermediate = 192;
  EXPECT_EQ(cuda::resolve_moe_kernel(MoeKernel::SKINNY, 1, odd), MoeKernel::GROUPED_MMA);
  odd.intermediate = 96;  // not a multiple of 64: no wgmma
  EXPECT_EQ(cuda::resolve_moe_kernel(MoeKernel::WGMMA, 4096, odd), MoeKernel::GROUPED_MMA);
  EXPECT_EQ(cuda::resolve_moe_kernel(MoeKernel::AUTO, 4096, odd), MoeKernel::GROUPED_MMA);
  EXPECT_EQ(cuda::resolve_moe_kernel(MoeKernel::CUBLAS, 1, qwen3), MoeKernel::CUBLAS);

  // The one-launch router: a few tokens, experts within one CTA's grouping, hidden in 256-wide chunks.
  EXPECT_TRUE(cuda::route_small_supported(1, 128, 2048, 8));
  EXPECT_TRUE(cuda::route_small_supported(cuda::ROUTER_SMALL_MAX_TOKENS, 64, 2560, 6));
  EXPECT_FALSE(cuda::route_small_supported(cuda::ROUTER_SMALL_MAX_TOKENS + 1, 128, 2048, 8));
  EXPECT_FALSE(cuda::route_small_supported(1, 512, 2048, 8));
  EXPECT_FALSE(cuda::route_small_supported(1, 128, 2000, 8));
  EXPECT_FALSE(cuda::route_small_supported(1, 128, 8192, 8));
  // The cluster router: up to 64 tokens, a BF16 router of ≤ 128 experts (a warp's m16 tile each of 8),
  // hidden in 128-wide k-blocks, two a CTA over at most 8 CTAs (≤ 2,048); ERNIE's fp32 router keeps
  // cuBLAS + top-k + grouping.
  EXPECT_TRUE(cuda::route_cluster_supported(5, 128, 2048, 8, false));
  EXPECT_TRUE(cuda::route_cluster_supported(cuda::ROUTER_CLUSTER_MAX_TOKENS, 100, 384, 6, false));
  EXPECT_FALSE(cuda::route_cluster_supported(cuda::ROUTER_CLUSTER_MAX_TOKENS + 1, 128, 2048, 8, false));
  EXPECT_FALSE(cuda::route_cluster_supported(16, 64, 2560, 6, true));
  EXPECT_FALSE(cuda::route_cluster_supported(16, 129, 2048, 8, false));
  EXPECT_FALSE(cuda::route_cluster_supported(16, 128, 2048 + 64, 8, false));
  EXPECT_FALSE(cuda::route_cluster_supported(16, 128, 2048 + 128, 8, false));
}

TEST(CudaHost, MoeTilingFitsEveryShape) {
  // Tile heights the grouped GEMM has configs for, with the k-steps they need (moe_gemm.cu).
  for (int64_t hidden : {64, 128, 192, 256, 768, 2048, 4096})
    for (int64_t inter : {64, 128, 192, 256, 768, 1536})
      for (int64_t pairs : {1, 8, 1024, 2048, 6144, 65536}) {
        const int rows = cuda::moe_tile_rows(pairs, 128, hidden, inter);
        ASSERT_TRUE(rows == 16 || rows == 32 || rows == 128) << rows;
        const int k_step = rows == 16 ? 256 : rows == 32 ? 128 : 64;
        EXPECT_EQ(hidden % k_step, 0) << "H=" << hidden << " I=" << inter << " pairs=" << pairs;
        EXPECT_EQ(inter % k_step, 0) << "H=" << hidden << " I=" << inter << " pairs=" << pairs;
      }
  // Qwen3-30B-A3B: decode and small batches take the 16-row tiles, prefill the 128-row ones.
  EXPECT_EQ(cuda::moe_tile_rows(8, 128, 2048, 768), 16);
  EXPECT_EQ(cuda::moe_tile_rows(1024, 128, 2048, 768), 16);
  EXPECT_EQ(cuda::moe_tile_rows(4800, 128, 2048, 768), 32);
  EXPECT_EQ(cuda::moe_tile_rows(65536, 128, 2048, 768), 128);
}

TEST(CudaHost, MaxExpertTilesBoundsRandomRoutings) {
  const uint64_t seed = test::test_seed("CudaHost.MaxExpertTiles");
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 2000; ++trial) {
    const int64_t experts = 1 + rng() % 256, tokens = 1 + rng() % 3000;
    const int64_t top_k = 1 + rng() % std::min<int64_t>(experts, 8);
    const int64_t tile_rows = std::vector<int64_t>{16, 32, 128}[rng() % 3];
    std::vector<int64_t> count(static_cast<size_t>(experts), 0);
    const bool skewed = trial % 2 == 0;  // half the trials pile tokens onto a few experts
    for (int64_t i = 0; i < tokens * top_k; ++i)
      ++count[static_cast<size_t>(skewed ? (rng() % 4 == 0 ? rng() % experts : rng() % std::min<int64_t>(experts, 3))
                                         : rng() % experts)];
    int64_t tiles = 0;
    for (int64_t c : count) tiles += (c + tile_rows - 1) / tile_rows;
    ASSERT_LE(tiles, cuda::max_expert_tiles(tokens * top_k, experts, tile_rows))
        << "experts " << experts << " pairs " << tokens * top_k << " tile " << tile_rows;
  }
}

// The split-KV choice: 1 without per-token work or with short contexts, never more than 32, and
// enough CTAs (tokens · KV heads · splits) for four waves of 132 SMs where the contexts allow.
TEST(CudaHost, AttentionSplitsStayInBounds) {
  EXPECT_EQ(cuda::attention_splits(0, 4, 5000), 1);  // a prefill-only step (this once divided by zero)
  EXPECT_EQ(cuda::attention_splits(1, 4, 64), 1);
  EXPECT_EQ(cuda::attention_splits(600, 4, 5000), 1);
  for (int64_t tokens = 1; tokens <= 600; tokens += 7)
    for (int64_t keys : {int64_t{0}, int64_t{65}, int64_t{1000}, int64_t{40960}}) {
      const int64_t s = cuda::attention_splits(tokens, 4, keys);
      ASSERT_GE(s, 1);
      ASSERT_LE(s, 32);
      if (keys > 0) ASSERT_LE(s, (keys + 63) / 64);
    }
  EXPECT_EQ(cuda::attention_splits(1, 4, 0), 32);  // a captured decode graph for one sequence
}

// The value of BF16 bits (the low 16 of bits16).
static float bf16_value(uint32_t bits16) {
  const uint32_t f = bits16 << 16;
  float v;
  std::memcpy(&v, &f, 4);
  return v;
}

// The GPU layout of NVFP4 codes (nvfp4_layout.h) against the E2M1 codec: every pair of codes in every
// position of a word, repacked and decoded, gives BF16 bits whose value × 2¹²⁶ is the code's value
// (so × the 2¹¹⁸-scaled block scale it is the weight × 2⁻⁸, undone by WEIGHT_DECODE_EPILOGUE); the
// one-pair decode the wgmma lanes use agrees with the whole-word decode; random words survive.

TEST(CudaHost, RepackedCodesDecodeToTheE2m1Values) {
  for (int p = 0; p < 4; ++p)
    for (uint32_t lo = 0; lo < 16; ++lo)
      for (uint32_t hi = 0; hi < 16; ++hi) {
        // The other pairs hold the complement codes, so stray bits would show.
        uint32_t word = 0;
        for (int q = 0; q < 4; ++q) word |= (q == p ? (lo | hi << 4) : (~(lo | hi << 4) & 0xFFu)) << (8 * q);
        const uint32_t w = cuda::repack_code_word(word);
        uint32_t pair[4];
        cuda::decode_code_word(w, pair);
        for (int q = 0; q < 4; ++q) {
          const uint32_t code_lo = (word >> (8 * q)) & 0xF, code_hi = (word >> (8 * q + 4)) & 0xF;
          ASSERT_EQ(bf16_value(pair[q] & 0xFFFF) * 0x1p126f, formats::e2m1_decode(uint8_t(code_lo))) << p << " " << q;
          ASSERT_EQ(bf16_value(pair[q] >> 16) * 0x1p126f, formats::e2m1_decode(uint8_t(code_hi))) << p << " " << q;
          ASSERT_EQ(std::signbit(bf16_value(pair[q] & 0xFFFF)), (code_lo & 8) != 0);  // -0 keeps its sign
          ASSERT_EQ(cuda::decode_code_pair(w, cuda::pair_magnitude_rotation(q), cuda::pair_sign_rotation(q)), pair[q]);
        }
      }
  std::mt19937_64 rng(test::test_seed("RepackedCodesDecodeToTheE2m1Values"));
  for (int i = 0; i < 100000; ++i) {
    const uint32_t word = uint32_t(rng());
    uint32_t pair[4];
    cuda::decode_code_word(cuda::repack_code_word(word), pair);
    for (int q = 0; q < 8; ++q)
      ASSERT_EQ(bf16_value((pair[q / 2] >> (16 * (q % 2))) & 0xFFFF) * 0x1p126f,
                formats::e2m1_decode(uint8_t((word >> (4 * q)) & 0xF)));
  }
}

// Every E4M3 block scale, with random codes: the repacked block's decoded pairs × its scale operand
// are the checkpoint's weights × 2⁻⁸ exactly (NaN for a NaN scale), the operand a normal BF16.
TEST(CudaHost, RepackedBlocksDecodeToTheirWeights) {
  const uint64_t seed = test::test_seed("RepackedBlocksDecodeToTheirWeights");
  std::mt19937_64 rng(seed);
  for (int s = 0; s < 256; ++s)
    for (int trial = 0; trial < 64; ++trial) {
      const uint32_t words[2] = {uint32_t(rng()), uint32_t(rng())};
      uint32_t w0 = words[0], w1 = words[1];
      uint8_t code = uint8_t(s);
      cuda::repack_block(w0, w1, code);
      const float operand = bf16_value(cuda::scale_operand_bits(code));
      const float scale = formats::e4m3_decode(uint8_t(s));
      if (!std::isnan(scale)) ASSERT_TRUE(std::isnormal(operand)) << s;
      for (int h = 0; h < 2; ++h) {
        uint32_t pair[4];
        cuda::decode_code_word(h ? w1 : w0, pair);
        for (int q = 0; q < 8; ++q) {
          const float decoded = bf16_value((pair[q / 2] >> (16 * (q % 2))) & 0xFFFF);
          const float expected = formats::e2m1_decode(uint8_t((words[h] >> (4 * q)) & 0xF)) * scale;
          const float got = decoded * operand * 0x1p8f;  // exact in fp32: ≤ 6 significant bits
          if (std::isnan(scale))
            ASSERT_TRUE(std::isnan(got)) << s;
          else
            ASSERT_EQ(got, expected) << "scale 0x" << std::hex << s << " seed " << std::dec << seed;
        }
      }
    }
}

// Line order (expert weights): the stored words of a 128-block are a permutation of its k-chunks
// (its own inverse), lane c's word q is chunk 4q + c (the skinny kernels' whole-line x loads), and
// bytes 8h … 8h + 7 of every lane's 16 (stored words with (s % 4) / 2 = h) are exactly the chunks of
// the 64-wide half h (what a wgmma stage copies).
TEST(CudaHost, LineOrderPlacesEveryChunk) {
  std::array<int, 16> seen{};
  for (int s = 0; s < 16; ++s) {
    const int chunk = cuda::line_order_chunk(s);
    ASSERT_GE(chunk, 0);
    ASSERT_LT(chunk, 16);
    ++seen[size_t(chunk)];
    EXPECT_EQ(cuda::line_order_chunk(chunk), s) << "not its own inverse at " << s;
    EXPECT_EQ(chunk, 4 * (s % 4) + s / 4) << "lane " << s / 4 << " word " << s % 4;
    EXPECT_EQ(chunk / 8, (s % 4) / 2) << "stored word " << s << " leaves its half-block";
  }
  for (int chunk = 0; chunk < 16; ++chunk) EXPECT_EQ(seen[size_t(chunk)], 1) << "chunk " << chunk;
  EXPECT_TRUE(cuda::expert_line_order(2048) && cuda::expert_line_order(768) && !cuda::expert_line_order(64 * 5));
}

// Fragment order (the wgmma MoE's activations): a permutation of each 32-element group, its own inverse,
// keeping BF16 pairs together; and what the FRAG consumers rely on — in a 64-wide stage, the A
// fragment of thread q in B's k16 block β (k 16β + 2q, +1 in registers a0/a1, 16β + 8 + 2q, +1 in
// a2/a3, hh = 0 / 1) holds natural k of chunk q (β < 2) or 4 + q (β ≥ 2), pair 2(β % 2) + hh: pairs of
// the two words a lane's 8 bytes of line-order codes hold.
TEST(CudaHost, FragmentOrderGivesEachLaneWholeWords) {
  std::array<int, 128> seen{};
  for (int k = 0; k < 128; ++k) {
    const int64_t at = cuda::fragment_order_index(k);
    ASSERT_GE(at, k / 32 * 32);
    ASSERT_LT(at, k / 32 * 32 + 32) << "element " << k << " leaves its group";
    ++seen[size_t(at)];
    EXPECT_EQ(cuda::fragment_order_index(at), k) << "not its own inverse at " << k;
    EXPECT_EQ(at % 2, k % 2) << "pairs split at " << k;
  }
  for (int k = 0; k < 128; ++k) EXPECT_EQ(seen[size_t(k)], 1) << "position " << k;
  for (int q = 0; q < 4; ++q)
    for (int block = 0; block < 4; ++block)
      for (int hh = 0; hh < 2; ++hh)
        for (int e = 0; e < 2; ++e) {
          const int64_t natural = cuda::fragment_order_index(16 * block + 8 * hh + 2 * q + e);  // self-inverse
          EXPECT_EQ(natural / 8, block < 2 ? q : 4 + q) << "thread " << q << " block " << block;
          EXPECT_EQ(natural % 8, 2 * (2 * (block % 2) + hh) + e) << "thread " << q << " block " << block;
        }
  std::mt19937_64 rng(test::test_seed("FragmentOrderGivesEachLaneWholeWords"));
  for (int i = 0; i < 1000; ++i) {
    const uint32_t w = uint32_t(rng());
    uint32_t pair[4];
    cuda::decode_code_word(w, pair);
    for (int p = 0; p < 4; ++p) ASSERT_EQ(cuda::decode_code_pair_unrolled(w, p), pair[p]);
    ASSERT_EQ(cuda::decode_code_pair(w, cuda::pair_magnitude_rotation(3), cuda::pair_sign_rotation(3)), pair[3]);
  }
}

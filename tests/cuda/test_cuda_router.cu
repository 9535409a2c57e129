// cuda::route (router GEMM + softmax/top-k/renormalize) against ref::route on Qwen3-30B-A3B's router
// (E = 128, k = 8, H = 2048) and the tiny model's (E = 8, k = 2), T = 1 to 4099, and with every token
// identical (all tokens on the same experts); up to 4 tokens also the one-launch router and grouping,
// from 5 to 64 the one-launch cluster router (logits on tensor cores) and its grouping.
// The logit GEMMs sum 2048 fp32 products in different orders, so logits differ by up to ~1e-5 and
// the renormalized weights (0.05–0.5) by a few 1e-6: weights must agree within 2e-5 absolute, and
// expert ids must match except where the two candidates' weights are within that tolerance (a
// near-tie may break either way).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "cuda/moe/moe_router.cuh"
#include "cuda_test_util.cuh"
#include "formats/bf16.h"
#include "ref/moe.h"
#include "test_seed.h"

using namespace nibble;

namespace {

// The one-launch router's grouping outputs, and the checks that they group `ids`: the offsets count
// each expert's pairs, every pair sits at the row pair_rows names (and sorted_pairs inverts it)
// inside its expert's range, and the tile list covers each expert's rows in tiles of tile_rows.
struct SmallGrouping {
  int64_t pairs, experts;
  test::DeviceBuffer<int32_t> expert_offsets, tile_offsets, sorted, rows;
  test::DeviceBuffer<int4> tiles;
  cuda::ExpertGroups groups;

  SmallGrouping(int64_t pairs_, int64_t experts_)
      : pairs(pairs_), experts(experts_), expert_offsets(static_cast<size_t>(experts_ + 1)),
        tile_offsets(static_cast<size_t>(experts_ + 1)), sorted(static_cast<size_t>(pairs_)), rows(static_cast<size_t>(pairs_)),
        tiles(static_cast<size_t>(cuda::max_expert_tiles(pairs_, experts_, 8))),
        groups{expert_offsets.get(), tile_offsets.get(), sorted.get(), rows.get(), tiles.get()} {}

  void expect_consistent(const std::vector<int32_t>& ids, int tile_rows) {
    const auto offsets = expert_offsets.to_host(), tile_off = tile_offsets.to_host(), sorted_h = sorted.to_host(),
               rows_h = rows.to_host();
    const auto tiles_h = tiles.to_host();
    ASSERT_EQ(offsets[experts], pairs);
    for (int64_t e = 0; e < experts; ++e) {
      const int64_t count = std::count(ids.begin(), ids.end(), int32_t(e));
      ASSERT_EQ(offsets[e + 1] - offsets[e], count) << "expert " << e;
      ASSERT_EQ(tile_off[e + 1] - tile_off[e], (count + tile_rows - 1) / tile_rows) << "expert " << e;
      for (int32_t j = tile_off[e]; j < tile_off[e + 1]; ++j) {
        const int4 t = tiles_h[j];
        EXPECT_EQ(t.x, e);
        EXPECT_EQ(t.y, offsets[e] + (j - tile_off[e]) * tile_rows);
        EXPECT_EQ(t.z, std::min<int64_t>(tile_rows, offsets[e + 1] - t.y));
      }
    }
    for (int64_t i = 0; i < pairs; ++i) {
      const int32_t row = rows_h[i], e = ids[i];
      ASSERT_TRUE(row >= offsets[e] && row < offsets[e + 1]) << "pair " << i;
      EXPECT_EQ(sorted_h[row], i);
    }
  }
};

void check(int64_t tokens, int64_t experts, int64_t top_k, int64_t hidden, bool identical_tokens, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> router(static_cast<size_t>(experts * hidden)), x_bits(static_cast<size_t>(tokens * hidden));
  for (int64_t e = 0; e < experts; ++e) {
    const float row_scale = 0.02f * std::exp(0.5f * normal(rng));  // uneven routing, as synth makes it
    for (int64_t h = 0; h < hidden; ++h) router[e * hidden + h] = formats::bf16_encode(row_scale * normal(rng));
  }
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < hidden; ++h)
      x_bits[t * hidden + h] = identical_tokens && t > 0 ? x_bits[h] : formats::bf16_encode(normal(rng));
  std::vector<float> x(x_bits.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = formats::bf16_decode(x_bits[i]);

  ref::MoeWeights w;
  w.router = router.data();
  w.n_experts = experts;
  w.top_k = top_k;
  w.hidden = hidden;
  std::vector<int32_t> want_ids(static_cast<size_t>(tokens * top_k));
  std::vector<float> want_w(want_ids.size());
  ref::route(x.data(), tokens, w, want_ids.data(), want_w.data());

  test::DeviceBuffer<uint16_t> d_x(x_bits), d_router(router);
  test::DeviceBuffer<float> d_logits(static_cast<size_t>(tokens * experts)), d_w(want_w.size());
  test::DeviceBuffer<int32_t> d_ids(want_ids.size());
  cublasHandle_t handle;
  ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
  const cuda::RouterArgs args{d_x.get(), d_router.get(), tokens, hidden, experts, top_k, true,
                              d_logits.get(), d_ids.get(), d_w.get()};
  // Both paths where a one-launch router takes the batch (the small one up to 4 tokens, the cluster
  // one on tensor cores up to 64): their logit sums are a third and a fourth order.
  const bool small = cuda::route_small_supported(tokens, experts, hidden, top_k);
  const bool mid = !small && cuda::route_cluster_supported(tokens, experts, hidden, top_k, false);
  for (int path = 0; path < (small || mid ? 2 : 1); ++path) {
    NIB_CUDA_CHECK(cudaMemset(d_ids.get(), 0xFF, want_ids.size() * sizeof(int32_t)));
    NIB_CUDA_CHECK(cudaMemset(d_w.get(), 0xFF, want_w.size() * sizeof(float)));  // NaN: a weight not written fails
    SmallGrouping grouping(tokens * top_k, experts);
    const Status s = path == 0 ? cuda::route(args, handle, nullptr)
                     : small   ? cuda::route_and_group_small(args, 8, grouping.groups, nullptr)
                               : cuda::route_and_group_cluster(args, 8, grouping.groups, nullptr);
    ASSERT_TRUE(s.is_ok()) << s.message();
    NIB_CUDA_CHECK(cudaDeviceSynchronize());
    const auto got_ids = d_ids.to_host();
    const auto got_w = d_w.to_host();
    int64_t near_ties = 0;
    double max_w_err = 0;
    for (size_t i = 0; i < got_ids.size(); ++i) {
      max_w_err = std::max(max_w_err, double(std::fabs(got_w[i] - want_w[i])));
      if (got_ids[i] == want_ids[i]) continue;
      ++near_ties;
      EXPECT_LT(std::fabs(got_w[i] - want_w[i]), 2e-5) << "token " << i / top_k << " slot " << i % top_k
                                                       << ": expert " << got_ids[i] << " vs " << want_ids[i];
    }
    const char* path_name = path == 0 ? "" : small ? " (one launch)" : " (cluster)";
    std::printf("route%s E=%lld k=%lld T=%lld%s: %lld near-tie swaps, max weight err %.2e\n", path_name,
                static_cast<long long>(experts), static_cast<long long>(top_k), static_cast<long long>(tokens),
                identical_tokens ? " (identical)" : "", static_cast<long long>(near_ties), max_w_err);
    EXPECT_LT(max_w_err, 2e-5);
    if (identical_tokens)
      for (int64_t t = 1; t < tokens; ++t)
        for (int64_t k = 0; k < top_k; ++k) EXPECT_EQ(got_ids[t * top_k + k], got_ids[k]);
    if (path == 1) grouping.expect_consistent(got_ids, 8);
  }
  cublasDestroy(handle);
}

TEST(CudaRouter, MatchesReference) {
  NIB_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::test_seed("CudaRouter.MatchesReference");
  for (int64_t t : {1, 3, 4, 5, 8, 9, 17, 33, 64, 255, 4099}) check(t, 128, 8, 2048, false, seed + t);
  check(255, 8, 2, 32, false, seed);
  check(64, 128, 8, 2048, true, seed);
  check(40, 100, 6, 384, false, seed);  // the cluster router: 3 ranks of one k-block, experts past the last m16 tile
  check(12, 64, 4, 1920, false, seed);  // 8 ranks of two k-blocks, the last with one
}

// The top-k alone on given logits with many exact ties (values on a 0.25 grid, so distinct logits
// keep distinct probabilities): ids must be torch.topk's — larger logit first, the lower expert
// among equal ones — exactly, for experts on both sides of 128 (a lane's four or eight experts) and
// k up to 32; weights within 1e-6 of the softmax in double (their sums are in another order).
TEST(CudaRouter, TopKBreaksTiesToTheLowerExpert) {
  NIB_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::test_seed("CudaRouter.TopKBreaksTiesToTheLowerExpert");
  std::mt19937_64 rng(seed);
  const int64_t tokens = 64;
  for (const int64_t experts : {8, 64, 100, 128, 129, 160, 256})
    for (const int64_t top_k : {1, 2, 8, 32}) {
      if (top_k > experts) continue;
      for (const bool renormalize : {false, true}) {
        const int levels = rng() % 2 ? 4 : 33;  // 4: nearly every pick breaks a tie
        std::vector<float> logits(static_cast<size_t>(tokens * experts));
        for (float& v : logits) v = -4.0f + 0.25f * float(rng() % levels);
        test::DeviceBuffer<float> d_logits(logits), d_w(static_cast<size_t>(tokens * top_k));
        test::DeviceBuffer<int32_t> d_ids(static_cast<size_t>(tokens * top_k));
        ASSERT_TRUE(cuda::route_topk(d_logits.get(), tokens, experts, top_k, renormalize, d_ids.get(), d_w.get(),
                                     nullptr)
                        .is_ok());
        NIB_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got_ids = d_ids.to_host();
        const auto got_w = d_w.to_host();
        for (int64_t t = 0; t < tokens; ++t) {
          const float* row = logits.data() + t * experts;
          std::vector<int32_t> order(static_cast<size_t>(experts));
          for (int32_t e = 0; e < experts; ++e) order[e] = e;
          std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
          double z = 0, chosen = 0;
          for (int64_t e = 0; e < experts; ++e) z += std::exp(double(row[e]) - 4.0);
          for (int64_t k = 0; k < top_k; ++k) chosen += std::exp(double(row[order[k]]) - 4.0) / z;
          for (int64_t k = 0; k < top_k; ++k) {
            ASSERT_EQ(got_ids[t * top_k + k], order[k]) << "E=" << experts << " k=" << top_k << " token " << t
                                                        << " slot " << k << " (seed " << seed << ")";
            const double p = std::exp(double(row[order[k]]) - 4.0) / z;
            EXPECT_NEAR(got_w[t * top_k + k], renormalize ? p / chosen : p, 1e-6) << "E=" << experts << " slot " << k;
          }
        }
      }
    }
}

// ERNIE-4.5's router (E = 64, k = 6, H = 2560; fp32 weights, a correction bias that chooses, the
// renormalization floor) through both GPU paths: route() (fp32 cuBLAS GEMM + top-k) and the one-launch
// route_and_group_small, against ref::route, weights within check()'s 2e-5 (a near-tie swap of ids
// stays inside it); the one-launch grouping must group the chosen experts (SmallGrouping).
TEST(CudaRouter, Fp32RouterWithBiasBothPaths) {
  NIB_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::test_seed("CudaRouter.Fp32RouterWithBiasBothPaths");
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t E = 64, K = 6, H = 2560;
  std::vector<float> router(static_cast<size_t>(E * H)), bias(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    const float row_scale = 0.02f * std::exp(0.5f * normal(rng));
    for (int64_t h = 0; h < H; ++h) router[e * H + h] = row_scale * normal(rng);
    bias[e] = 0.01f * normal(rng);  // the size of ERNIE's e_score_correction_bias spread
  }
  for (int64_t tokens : {1, 3, 4}) {
    std::vector<uint16_t> x_bits(static_cast<size_t>(tokens * H));
    for (auto& b : x_bits) b = formats::bf16_encode(normal(rng));
    std::vector<float> x(x_bits.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = formats::bf16_decode(x_bits[i]);
    ref::MoeWeights w;
    w.router_f32 = router.data();
    w.score_bias = bias.data();
    w.norm_min = 1e-12f;
    w.n_experts = E, w.top_k = K, w.hidden = H;
    std::vector<int32_t> want_ids(static_cast<size_t>(tokens * K));
    std::vector<float> want_w(want_ids.size());
    ref::route(x.data(), tokens, w, want_ids.data(), want_w.data());

    test::DeviceBuffer<uint16_t> d_x(x_bits);
    test::DeviceBuffer<float> d_router(router), d_bias(bias), d_x32(x.size()), d_logits(static_cast<size_t>(tokens * E)),
        d_w(want_w.size());
    test::DeviceBuffer<int32_t> d_ids(want_ids.size());
    SmallGrouping grouping(tokens * K, E);
    cuda::RouterArgs args{d_x.get(), nullptr, tokens, H, E, K, true, d_logits.get(), d_ids.get(), d_w.get()};
    args.router_f32 = d_router.get(), args.x_f32 = d_x32.get(), args.score_bias = d_bias.get(), args.norm_min = w.norm_min;
    cublasHandle_t handle;
    ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
    for (int small = 0; small < 2; ++small) {
      const Status s = small ? cuda::route_and_group_small(args, 8, grouping.groups, nullptr)
                             : cuda::route(args, handle, nullptr);
      ASSERT_TRUE(s.is_ok()) << s.message();
      NIB_CUDA_CHECK(cudaDeviceSynchronize());
      const auto got_ids = d_ids.to_host();
      const auto got_w = d_w.to_host();
      // A swapped id (a near tie) shows as a weight within the tolerance of the reference's.
      for (size_t i = 0; i < got_ids.size(); ++i)
        EXPECT_LT(std::fabs(got_w[i] - want_w[i]), 2e-5) << (small ? "small" : "cuBLAS") << " T " << tokens << " slot " << i;
      if (small) grouping.expect_consistent(got_ids, 8);
    }
    cublasDestroy(handle);
  }
}

// group_by_expert on both sides of its staging (the sorted pairs staged in shared memory up to 48K
// pairs and copied out in order, stored straight to their rows above), on uneven random expert ids
// (expert e drawn with weight e % 16 + 1, as skewed as synth's routing) and on every pair on one expert.
TEST(CudaRouter, GroupByExpertOnBothSidesOfItsStaging) {
  NIB_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::test_seed("CudaRouter.GroupByExpertOnBothSidesOfItsStaging");
  std::mt19937_64 rng(seed);
  const int64_t E = 128, K = 8;
  std::vector<double> weight(E);
  for (int64_t e = 0; e < E; ++e) weight[e] = double(e % 16 + 1);
  for (int64_t tokens : {1, 1000, 6144, 6145, 7000}) {
    for (const bool one_expert : {false, true}) {
      std::discrete_distribution<int32_t> pick(weight.begin(), weight.end());
      std::vector<int32_t> ids(static_cast<size_t>(tokens * K));
      for (auto& id : ids) id = one_expert ? 5 : pick(rng);
      test::DeviceBuffer<int32_t> d_ids(ids);
      SmallGrouping grouping(tokens * K, E);
      NIB_CUDA_CHECK(cudaMemset(grouping.sorted.get(), 0xFF, ids.size() * sizeof(int32_t)));
      const Status s = cuda::group_by_expert(d_ids.get(), tokens, K, E, 8, grouping.groups, nullptr);
      ASSERT_TRUE(s.is_ok()) << s.message();
      NIB_CUDA_CHECK(cudaDeviceSynchronize());
      SCOPED_TRACE(::testing::Message() << "T " << tokens << (one_expert ? ", one expert" : ""));
      grouping.expect_consistent(ids, 8);
    }
  }
}

TEST(CudaRouter, BadArgumentsAreErrors) {
  NIB_SKIP_WITHOUT_GPU();
  EXPECT_FALSE(cuda::route_topk(nullptr, 4, 512, 8, true, nullptr, nullptr, nullptr).is_ok());
  EXPECT_FALSE(cuda::route_topk(nullptr, 4, 8, 9, true, nullptr, nullptr, nullptr).is_ok());
}

}  // namespace

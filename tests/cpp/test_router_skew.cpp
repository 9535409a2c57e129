// Zipf-skewed routers (tools/router_skew.h, `nibble synth --router-skew`): the shares asked for, the
// statistics of a routing, the placement against inputs with a common direction, and the placed
// routers as a written checkpoint routes with them.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <unistd.h>

#include "io/binding.h"
#include "models/model.h"
#include "test_seed.h"
#include "tools/router_skew.h"
#include "tools/synth.h"

using namespace nibble;
namespace fs = std::filesystem;

namespace {

// Two draws (fit, check) of n rows of normals plus one common vector, `common_scale` of a normal
// vector (hidden states share a direction): H = 256, 2,048 rows each.
struct CommonDirectionInputs {
  static constexpr int64_t H = 256, N = 2048;
  std::vector<float> fit, check;
  CommonDirectionInputs(float common_scale, std::mt19937_64& rng) {
    std::normal_distribution<float> normal;
    std::vector<float> common(H);
    for (float& v : common) v = normal(rng);
    for (std::vector<float>* x : {&fit, &check}) {
      x->resize(static_cast<size_t>(N * H));
      for (size_t i = 0; i < x->size(); ++i) (*x)[i] = normal(rng) + common_scale * common[i % static_cast<size_t>(H)];
    }
  }
};

}  // namespace

TEST(ZipfShares, SumToOneFollowTheLawAndRespectTheTopKCap) {
  for (double s : {0.0, 0.5, 0.6, 2.0}) {
    const std::vector<double> shares = tools::zipf_shares(128, 8, s, 3);
    double sum = 0, top = 0;
    for (double v : shares) sum += v, top = std::max(top, v);
    EXPECT_NEAR(sum, 1.0, 1e-9) << "s = " << s;
    EXPECT_LE(top, 1.0 / 8 + 1e-12) << "s = " << s;
    if (s == 0.0) EXPECT_NEAR(top, 1.0 / 128, 1e-12);
    if (s == 0.5) {  // under the cap: exactly 1 / Σ k^-s
      double h = 0;
      for (int k = 1; k <= 128; ++k) h += std::pow(k, -0.5);
      EXPECT_NEAR(top, 1.0 / h, 1e-12);
    }
  }
  // The ranking is random per seed: another seed makes another expert the most popular.
  const auto a = tools::zipf_shares(128, 8, 0.6, 1), b = tools::zipf_shares(128, 8, 0.6, 2);
  EXPECT_NE(std::max_element(a.begin(), a.end()) - a.begin(), std::max_element(b.begin(), b.end()) - b.begin());
}

TEST(RoutingStats, OfAKnownRouting) {
  // 4 experts, top-2: shares 3/8, 3/8, 1/8, 1/8.
  const std::vector<int32_t> ids = {0, 1, 0, 2, 0, 1, 3, 1};
  const tools::RoutingStats s = tools::routing_stats(ids, 2, 4, 0);
  EXPECT_DOUBLE_EQ(s.top_share, 3.0 / 8);
  EXPECT_DOUBLE_EQ(s.coverage_90, 1.0);  // 3/8 + 3/8 + 1/8 = 7/8 < 0.9: all four
  const double entropy = -(2 * 0.375 * std::log(0.375) + 2 * 0.125 * std::log(0.125));
  EXPECT_NEAR(s.concentration, 1 - entropy / std::log(4.0), 1e-12);
  EXPECT_DOUBLE_EQ(s.adjacent_overlap, 0.5);  // each token shares one of its two picks with the one before
  // Runs of two tokens: only pairs (0,1) and (2,3) are adjacent.
  EXPECT_DOUBLE_EQ(tools::routing_stats(ids, 2, 4, 2).adjacent_overlap, 0.5);
  EXPECT_DOUBLE_EQ(tools::routing_stats(std::vector<int32_t>{0, 1, 2, 3}, 2, 4, 0).adjacent_overlap, 0.0);
}

// Placed on one draw of inputs, measured on another: the shares generalize because the fit has one
// offset an expert, not a free row.
TEST(PlaceRouter, ReachesZipfLoadsOnHeldOutInputs) {
  std::mt19937_64 rng(test::test_seed("PlaceRouter.Zipf"));
  const CommonDirectionInputs inputs(0.5f, rng);
  const std::vector<float>&fit = inputs.fit, &check = inputs.check;
  const int64_t H = inputs.H, N = inputs.N, E = 64, K = 4;
  const std::vector<double> shares = tools::zipf_shares(E, K, 0.6, 7);
  const tools::PlacedRouter placed = tools::place_router(fit.data(), N, H, shares, K, 7);
  const tools::RoutingStats target = tools::share_stats(shares);
  const tools::RoutingStats got =
      tools::routing_stats(tools::top_k_experts(check.data(), N, H, placed.rows.data(), E, K), K, E, 0);
  std::printf("target top %.4f conc %.4f cov %.3f; fit error %.4f; held out top %.4f conc %.4f cov %.3f\n",
              target.top_share, target.concentration, target.coverage_90, placed.fit_error, got.top_share,
              got.concentration, got.coverage_90);
  // 8,192 picks over 64 experts (~128 each): a share's sampling error is ~9% of it; the top share is a
  // maximum, so allow 25%; the concentration averages over all experts.
  EXPECT_LT(placed.fit_error, 0.05);
  EXPECT_NEAR(got.top_share, target.top_share, 0.25 * target.top_share);
  EXPECT_NEAR(got.concentration, target.concentration, 0.02);
  EXPECT_NEAR(got.coverage_90, target.coverage_90, 0.08);
}

// Uniform (s = 0) flattens a router that the common direction skews: random rows over such inputs
// send a few experts most of the tokens.
TEST(PlaceRouter, UniformFlattensTheCommonDirectionsSkew) {
  std::mt19937_64 rng(test::test_seed("PlaceRouter.Uniform"));
  const CommonDirectionInputs inputs(2.0f, rng);
  const std::vector<float>&fit = inputs.fit, &check = inputs.check;
  const int64_t H = inputs.H, N = inputs.N, E = 64, K = 4;
  std::normal_distribution<float> normal;
  std::vector<float> random_rows(static_cast<size_t>(E * H));
  for (float& v : random_rows) v = 0.02f * normal(rng);
  const tools::RoutingStats before =
      tools::routing_stats(tools::top_k_experts(check.data(), N, H, random_rows.data(), E, K), K, E, 0);
  const tools::PlacedRouter placed = tools::place_router(fit.data(), N, H, tools::zipf_shares(E, K, 0.0, 1), K, 1);
  const tools::RoutingStats after =
      tools::routing_stats(tools::top_k_experts(check.data(), N, H, placed.rows.data(), E, K), K, E, 0);
  std::printf("random rows: top %.4f conc %.4f; placed uniform: top %.4f conc %.4f\n", before.top_share,
              before.concentration, after.top_share, after.concentration);
  EXPECT_GT(before.concentration, 0.1);
  // Multinomial noise alone over 8,192 picks gives a concentration of ~(E-1)/(2·picks·ln E) ≈ 0.001.
  EXPECT_LT(after.concentration, 0.01);
  EXPECT_LT(after.top_share, 2.0 / E);
}

// The whole path: synth places each layer during a CPU forward and writes the rows into the files; a
// fresh load routes new tokens with the written rows at the asked-for skew.
TEST(SynthRouterSkew, WrittenRoutersRouteNewTokensAtTheAskedSkew) {
  const fs::path dir = fs::temp_directory_path() / ("nibble_router_skew_" + std::to_string(getpid()));
  tools::SynthOptions o;
  o.preset = "small-moe";
  o.out_dir = dir.string();
  o.seed = 11;
  o.layers = 3;
  o.experts = 64;  // top-4 of 64: enough experts for a Zipf law to mean something
  o.router_skew = 0.6;
  o.router_tokens = 1024;
  Result<tools::SynthReport> report = tools::synth_checkpoint(o);
  ASSERT_TRUE(report.is_ok()) << report.status().message();
  const io::ModelConfig& config = report->config;
  const int64_t E = config.num_experts, SEQUENCE = 128;
  ASSERT_EQ(report->routing.size(), static_cast<size_t>(config.num_hidden_layers));
  const tools::RoutingStats target = report->routing[0].target;

  auto loaded = io::load_checkpoint(dir.string());
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  std::shared_ptr<const io::LoadedCheckpoint> checkpoint = std::move(loaded.value());
  std::vector<tools::RoutingStats> measured(static_cast<size_t>(config.num_hidden_layers));
  models::ModelOptions options;
  options.routing_observer = [&](int64_t layer, const int32_t* ids, int64_t rows, int64_t top_k) {
    measured[layer] =
        tools::routing_stats(std::span<const int32_t>(ids, static_cast<size_t>(rows * top_k)), top_k, E, SEQUENCE);
  };
  auto model = models::create_model(checkpoint, options);
  ASSERT_TRUE(model.is_ok()) << model.status().message();
  tools::FastRandom rng(test::test_seed("SynthRouterSkew"), "new tokens");
  // 1,024 new tokens in sequences as long as the calibration's.
  ASSERT_TRUE(tools::forward_random_tokens(**model, config, 1024 / SEQUENCE, SEQUENCE, rng).is_ok());
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    const tools::RoutingStats& got = measured[l];
    std::printf(
        "layer %lld: target top %.4f conc %.4f; synth held-out top %.4f conc %.4f; new tokens top %.4f "
        "conc %.4f adjacent %.3f fit %.3f\n",
        (long long)l, target.top_share, target.concentration, report->routing[l].held_out.top_share,
        report->routing[l].held_out.concentration, got.top_share, got.concentration, got.adjacent_overlap,
        report->routing[l].fit_error);
    // 1,024 new tokens (4,096 picks, ~64 an expert, a share's sampling error ~13%) on
    // a fit of 512 tokens (~32 picks an expert): the top share within 35%, the concentration within 0.03.
    EXPECT_NEAR(got.top_share, target.top_share, 0.35 * target.top_share) << "layer " << l;
    EXPECT_NEAR(got.concentration, target.concentration, 0.03) << "layer " << l;
  }
  fs::remove_all(dir);
}

TEST(SynthRouterSkew, RefusesRoutersThatChooseWithABias) {
  const fs::path dir = fs::temp_directory_path() / ("nibble_router_skew_ernie_" + std::to_string(getpid()));
  tools::SynthOptions o;
  o.preset = "tiny-ernie";
  o.out_dir = dir.string();
  o.router_skew = 0.5;
  Result<tools::SynthReport> report = tools::synth_checkpoint(o);
  ASSERT_FALSE(report.is_ok());
  EXPECT_NE(report.status().message().find("correction bias"), std::string::npos) << report.status().message();
  fs::remove_all(dir);
}

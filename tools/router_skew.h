// Routers with a controlled skew for random-weight MoEs (issue 69 §3): expert popularity drawn from a
// Zipf law and placed against the hidden states the router actually sees; and the routing statistics
// that compare a model's loads with published ones (top expert's share, 90% coverage, concentration).
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace nibble::tools {

// Each expert's share of the top-k picks: share ∝ rank^-s over a random ranking (seeded), capped at
// 1 / top_k (a token picks an expert once). s = 0 is uniform.
std::vector<double> zipf_shares(int64_t experts, int64_t top_k, double s, uint64_t seed);

// Router rows [experts, hidden] (fp32) for inputs x [n, hidden] whose top-k picks reach `shares`:
// random rows (normal 0, row_stddev) with their component along the inputs' mean direction u replaced
// by a fitted per-expert offset b_e, so logit_e(x) = r_e·x⊥ + b_e (x·u). Trained routers' popularity
// lives the same way in the common direction of the residual stream; random models' hidden states
// have a strong one too (lab/2026-12-06-router-skew.md), which is why row scales alone cannot do it.
struct PlacedRouter {
  std::vector<float> rows;  // [experts, hidden]
  double fit_error = 0;     // Σ|observed − target| / 2 over the experts on the fitted inputs (0..1)
};
PlacedRouter place_router(const float* x, int64_t n, int64_t hidden, std::span<const double> shares, int64_t top_k,
                          uint64_t seed, float row_stddev = 0.02f);

// Expert ids [tokens, top_k] of the largest logits of x @ rows^T (ties: the lower expert, as torch.topk),
// a token's in any order: what routing_stats needs.
std::vector<int32_t> top_k_experts(const float* x, int64_t n, int64_t hidden, const float* rows, int64_t experts,
                                   int64_t top_k);

struct RoutingStats {
  double top_share = 0;         // the most picked expert's share of all picks
  double coverage_90 = 0;       // the fewest experts holding 90% of the picks, as a fraction of the experts
  double concentration = 0;     // 1 − entropy of the pick shares / log(experts)
  double adjacent_overlap = 0;  // share of a token's picks the token before it also picked (within `run` tokens)
};
// Statistics of pick shares (one per expert, summing to 1); adjacent_overlap stays 0.
RoutingStats share_stats(std::span<const double> shares);
// Statistics of ids [tokens, top_k]; adjacent tokens are those within a run of `run` tokens (a sequence).
RoutingStats routing_stats(std::span<const int32_t> ids, int64_t top_k, int64_t experts, int64_t run);

// Each statistic's (min, max) over several routings (a model's layers).
struct RoutingRanges {
  std::pair<double, double> top_share, coverage_90, concentration, adjacent_overlap;
};
RoutingRanges routing_ranges(std::span<const RoutingStats> stats);

}  // namespace nibble::tools

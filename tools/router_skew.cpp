// Zipf-skewed routers placed against observed router inputs (a per-expert offset along the inputs'
// mean direction, fitted by fixed-point steps on log shares), and routing statistics.
#include "tools/router_skew.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/parallel.h"
#include "tools/fast_random.h"

namespace nibble::tools {

std::vector<double> zipf_shares(int64_t experts, int64_t top_k, double s, uint64_t seed) {
  std::vector<double> by_rank(static_cast<size_t>(experts));
  for (int64_t r = 0; r < experts; ++r) by_rank[r] = std::pow(static_cast<double>(r + 1), -s);
  // Cap at 1 / top_k and spread the excess over the rest, until nothing exceeds the cap.
  const double cap = 1.0 / static_cast<double>(top_k);
  for (int round = 0; round < 64; ++round) {
    const double total = std::accumulate(by_rank.begin(), by_rank.end(), 0.0);
    for (double& v : by_rank) v /= total;
    double excess = 0, free = 0;
    for (double& v : by_rank) {
      if (v > cap)
        excess += v - cap, v = cap;
      else if (v < cap)
        free += v;
    }
    if (excess <= 1e-12 || free <= 0) break;
    for (double& v : by_rank)
      if (v < cap) v += excess * v / free;
  }
  // A random ranking: which expert is popular is not its index.
  std::vector<int64_t> order(static_cast<size_t>(experts));
  std::iota(order.begin(), order.end(), 0);
  FastRandom rng(seed, "zipf ranking");
  for (int64_t i = experts - 1; i > 0; --i) std::swap(order[i], order[rng.next() % static_cast<uint64_t>(i + 1)]);
  std::vector<double> shares(by_rank.size());
  for (int64_t r = 0; r < experts; ++r) shares[order[r]] = by_rank[r];
  return shares;
}

namespace {

double dot(const float* a, const float* b, int64_t n) {
  double d = 0;
  for (int64_t i = 0; i < n; ++i) d += static_cast<double>(a[i]) * b[i];
  return d;
}

// The inputs' mean direction: the offsets act along it, where every input has a share (a random
// model's inputs have one: synth's skewed embeddings add a common vector, as trained ones have).
std::vector<float> mean_direction(const float* x, int64_t n, int64_t H) {
  std::vector<double> mean(static_cast<size_t>(H), 0.0);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < H; ++h) mean[h] += x[t * H + h];
  double norm = 0;
  for (double v : mean) norm += v * v;
  norm = std::sqrt(norm);
  std::vector<float> u(static_cast<size_t>(H), 0.0f);
  if (norm > 0)
    for (int64_t h = 0; h < H; ++h) u[h] = static_cast<float>(mean[h] / norm);
  else
    u[0] = 1.0f;
  return u;
}

// x [n, H] @ rows [E, H]^T: [n, E].
std::vector<float> logits(const float* x, int64_t n, int64_t H, const float* rows, int64_t E) {
  std::vector<float> out(static_cast<size_t>(n * E));
  parallel_for(static_cast<size_t>(n), [&](size_t t) {
    for (int64_t e = 0; e < E; ++e) out[t * E + e] = static_cast<float>(dot(x + t * H, rows + e * H, H));
  });
  return out;
}

// The top_k largest of one token's scores (ties: the lower expert, as torch.topk), into ids in any
// order; `order` is scratch of one entry an expert.
void pick(const float* scores, int64_t top_k, std::vector<int32_t>& order, int32_t* ids) {
  std::iota(order.begin(), order.end(), 0);
  std::nth_element(order.begin(), order.begin() + top_k - 1, order.end(),
                   [&](int32_t a, int32_t b) { return scores[a] > scores[b] || (scores[a] == scores[b] && a < b); });
  std::copy_n(order.begin(), top_k, ids);
}

}  // namespace

PlacedRouter place_router(const float* x, int64_t n, int64_t hidden, std::span<const double> shares, int64_t top_k,
                          uint64_t seed, float row_stddev) {
  const int64_t E = static_cast<int64_t>(shares.size()), H = hidden;
  const std::vector<float> u = mean_direction(x, n, H);
  std::vector<float> along(static_cast<size_t>(n));
  double along_mean = 0;
  for (int64_t t = 0; t < n; ++t) {
    along[t] = static_cast<float>(dot(x + t * H, u.data(), H));
    along_mean += along[t] / static_cast<double>(n);
  }

  // Random rows with no component along u; their logits are the part the offsets move.
  PlacedRouter placed;
  placed.rows.resize(static_cast<size_t>(E * H));
  FastRandom rng(seed, "router rows");
  for (int64_t e = 0; e < E; ++e) {
    float* r = placed.rows.data() + e * H;
    double d = 0;
    for (int64_t h = 0; h < H; ++h) d += static_cast<double>(r[h] = row_stddev * rng.normal()) * u[h];
    for (int64_t h = 0; h < H; ++h) r[h] -= static_cast<float>(d) * u[h];
  }
  const std::vector<float> base = logits(x, n, H, placed.rows.data(), E);
  double sum = 0, sum_sq = 0;
  for (float v : base) sum += v, sum_sq += static_cast<double>(v) * v;
  const double count = static_cast<double>(base.size());
  const double spread = std::sqrt(std::max(sum_sq / count - (sum / count) * (sum / count), 1e-30));

  // Fixed-point steps: raise an expert's offset while it is picked less than its share, lower it while
  // more; a step of log(target / observed) logit spreads, halved when the error stops falling.
  const double picks = static_cast<double>(n * top_k), floor_share = 0.5 / picks;
  const double unit = spread / std::max(std::fabs(along_mean), 1e-30);
  std::vector<double> offset(static_cast<size_t>(E), 0.0), best_offset = offset;
  std::vector<int32_t> ids(static_cast<size_t>(n * top_k));
  std::vector<int64_t> counts(static_cast<size_t>(E));
  const size_t chunks = std::min<size_t>(static_cast<size_t>(n), 4 * worker_count());
  double best = 2.0, rate = 0.5;
  int since_best = 0;
  for (int it = 0; it < 600 && best > 0; ++it) {
    parallel_for(chunks, [&](size_t c) {
      std::vector<float> scores(static_cast<size_t>(E));
      std::vector<int32_t> order(static_cast<size_t>(E));
      for (int64_t t = static_cast<int64_t>(c * n / chunks); t < static_cast<int64_t>((c + 1) * n / chunks); ++t) {
        for (int64_t e = 0; e < E; ++e) scores[e] = base[t * E + e] + static_cast<float>(offset[e] * along[t]);
        pick(scores.data(), top_k, order, ids.data() + t * top_k);
      }
    });
    std::fill(counts.begin(), counts.end(), 0);
    for (int32_t id : ids) ++counts[id];
    double error = 0;
    for (int64_t e = 0; e < E; ++e) error += std::fabs(counts[e] / picks - shares[e]);
    error /= 2;
    if (error < best) {
      best = error, best_offset = offset, since_best = 0;
    } else if (++since_best >= 20) {
      rate /= 2, offset = best_offset, since_best = 0;
      if (rate < 1e-3) break;
    }
    for (int64_t e = 0; e < E; ++e)
      offset[e] += rate * unit * std::log((shares[e] + floor_share) / (counts[e] / picks + floor_share));
  }
  for (int64_t e = 0; e < E; ++e)
    for (int64_t h = 0; h < H; ++h) placed.rows[e * H + h] += static_cast<float>(best_offset[e]) * u[h];
  placed.fit_error = best;
  return placed;
}

std::vector<int32_t> top_k_experts(const float* x, int64_t n, int64_t hidden, const float* rows, int64_t experts,
                                   int64_t top_k) {
  const std::vector<float> scores = logits(x, n, hidden, rows, experts);
  std::vector<int32_t> ids(static_cast<size_t>(n * top_k));
  parallel_for(static_cast<size_t>(n), [&](size_t t) {
    std::vector<int32_t> order(static_cast<size_t>(experts));
    pick(scores.data() + t * experts, top_k, order, ids.data() + t * top_k);
  });
  return ids;
}

RoutingStats share_stats(std::span<const double> share) {
  RoutingStats s;
  const int64_t experts = static_cast<int64_t>(share.size());
  std::vector<double> sorted(share.begin(), share.end());
  std::sort(sorted.rbegin(), sorted.rend());
  s.top_share = sorted[0];
  double cumulative = 0;
  int64_t needed = 0;
  while (needed < experts && cumulative < 0.9 - 1e-12) cumulative += sorted[needed++];
  s.coverage_90 = static_cast<double>(needed) / static_cast<double>(experts);
  double entropy = 0;
  for (double p : share)
    if (p > 0) entropy -= p * std::log(p);
  s.concentration = 1.0 - entropy / std::log(static_cast<double>(experts));
  return s;
}

RoutingStats routing_stats(std::span<const int32_t> ids, int64_t top_k, int64_t experts, int64_t run) {
  const int64_t tokens = static_cast<int64_t>(ids.size()) / top_k;
  if (tokens == 0) return {};
  std::vector<double> share(static_cast<size_t>(experts), 0.0);
  for (int32_t id : ids) share[id] += 1.0 / static_cast<double>(ids.size());
  RoutingStats s = share_stats(share);
  int64_t shared = 0, pairs = 0;
  for (int64_t t = 1; t < tokens; ++t) {
    if (run > 0 && t % run == 0) continue;
    for (int64_t k = 0; k < top_k; ++k) {
      const int32_t id = ids[t * top_k + k];
      shared += std::count(ids.begin() + (t - 1) * top_k, ids.begin() + t * top_k, id);
    }
    ++pairs;
  }
  if (pairs > 0) s.adjacent_overlap = static_cast<double>(shared) / static_cast<double>(pairs * top_k);
  return s;
}

RoutingRanges routing_ranges(std::span<const RoutingStats> stats) {
  auto range = [&](double RoutingStats::*field) {
    std::pair<double, double> r{1e30, -1e30};
    for (const RoutingStats& s : stats) r = {std::min(r.first, s.*field), std::max(r.second, s.*field)};
    return r;
  };
  return {range(&RoutingStats::top_share), range(&RoutingStats::coverage_90), range(&RoutingStats::concentration),
          range(&RoutingStats::adjacent_overlap)};
}

}  // namespace nibble::tools

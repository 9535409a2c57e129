// `nibble bench routing`: one CPU forward whose routing observer (ModelOptions::routing_observer) counts
// each MoE layer's picks; a table by layer and a min–max summary.
#include "tools/bench/bench_routing.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "io/binding.h"
#include "models/model.h"
#include "tools/fast_random.h"
#include "tools/router_skew.h"
#include "tools/synth_routers.h"

namespace nibble::tools {
namespace {

struct LayerLoad {
  RoutingStats stats;
  std::vector<int64_t> rows;  // picks of each expert, most first
};

}  // namespace

int run_bench_routing(const BenchRoutingOptions& o) {
  auto fail = [](const std::string& message) {
    std::fprintf(stderr, "nibble bench routing: %s\n", message.c_str());
    return 1;
  };
  if (o.tokens < 1 || o.sequences < 1) return fail("--tokens and --sequences must be positive");
  Result<std::unique_ptr<io::LoadedCheckpoint>> loaded = io::load_checkpoint(o.model);
  if (!loaded) return fail(loaded.status().message());
  std::shared_ptr<const io::LoadedCheckpoint> checkpoint = std::move(loaded.value());
  const io::ModelConfig& config = checkpoint->bound.config;
  if (config.num_experts == 0) return fail(config.architecture + " has no experts");
  const int64_t E = config.num_experts, K = config.num_experts_per_tok;
  if (o.tokens > config.max_position_embeddings)
    return fail("--tokens " + std::to_string(o.tokens) + " exceeds max_position_embeddings (" +
                std::to_string(config.max_position_embeddings) + ")");

  std::map<int64_t, LayerLoad> loads;
  models::ModelOptions options;
  options.routing_observer = [&](int64_t layer, const int32_t* ids, int64_t rows, int64_t top_k) {
    const std::span<const int32_t> picks(ids, static_cast<size_t>(rows * top_k));
    LayerLoad& load = loads[layer];
    load.stats = routing_stats(picks, top_k, E, o.tokens);
    load.rows.assign(static_cast<size_t>(E), 0);
    for (int32_t id : picks) ++load.rows[id];
    std::sort(load.rows.rbegin(), load.rows.rend());
  };
  Result<std::unique_ptr<models::Model>> model = models::create_model(checkpoint, options);
  if (!model) return fail(model.status().message());
  FastRandom rng(o.seed, "bench routing tokens");
  if (Status s = forward_random_tokens(**model, config, o.sequences, o.tokens, rng); !s.is_ok())
    return fail(s.message());

  const double mean_rows = static_cast<double>(o.tokens * o.sequences * K) / static_cast<double>(E);
  std::printf(
      "# %s: %lld sequence(s) of %lld random tokens (seed %llu), %lld experts, top-%lld: %.1f rows an expert "
      "on average\n",
      o.model.c_str(), (long long)o.sequences, (long long)o.tokens, (unsigned long long)o.seed, (long long)E,
      (long long)K, mean_rows);
  std::printf("%5s %8s %9s %8s %9s %10s %20s %8s\n", "layer", "top", "for 90%", "conc", "adjacent", "max/mean",
              "busiest rows", "idle");
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& [layer, load] : loads) {
    const int64_t idle = std::count(load.rows.begin(), load.rows.end(), 0);
    std::printf("%5lld %7.1f%% %8.1f%% %8.3f %8.1f%% %10.2f %6lld %6lld %6lld %8lld\n", (long long)layer,
                100 * load.stats.top_share, 100 * load.stats.coverage_90, load.stats.concentration,
                100 * load.stats.adjacent_overlap, static_cast<double>(load.rows[0]) / mean_rows,
                (long long)load.rows[0], (long long)load.rows[std::min<int64_t>(1, E - 1)],
                (long long)load.rows[std::min<int64_t>(2, E - 1)], (long long)idle);
    rows.push_back({{"layer", layer},
                    {"top_share", load.stats.top_share},
                    {"coverage_90", load.stats.coverage_90},
                    {"concentration", load.stats.concentration},
                    {"adjacent_overlap", load.stats.adjacent_overlap},
                    {"rows", load.rows}});
  }
  std::vector<RoutingStats> stats;
  for (const auto& [layer, load] : loads) stats.push_back(load.stats);
  const RoutingRanges m = routing_ranges(stats);
  std::printf(
      "min-max over %zu layers: top expert %.1f-%.1f%%, experts for 90%% %.1f-%.1f%%, concentration "
      "%.3f-%.3f, adjacent %.1f-%.1f%% (independent: %.1f%%)\n",
      loads.size(), 100 * m.top_share.first, 100 * m.top_share.second, 100 * m.coverage_90.first,
      100 * m.coverage_90.second, m.concentration.first, m.concentration.second, 100 * m.adjacent_overlap.first,
      100 * m.adjacent_overlap.second, 100.0 * K / E);
  if (!o.json_out.empty()) std::ofstream(o.json_out) << rows.dump(1) << "\n";
  return 0;
}

}  // namespace nibble::tools

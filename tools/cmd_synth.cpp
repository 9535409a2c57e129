// `nibble synth`: writes a random-weight checkpoint in the exact ModelOpt NVFP4 layout.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "tools/command.h"
#include "tools/progress.h"
#include "tools/synth.h"

namespace nibble::tools {
namespace {

// The placed routers against their target: the range over the MoE layers of each statistic, on the
// held-out calibration tokens.
void print_routing(const SynthReport& report, double s) {
  std::vector<RoutingStats> held_out;
  std::pair<double, double> fit{1e30, -1e30};
  for (const LayerRouting& r : report.routing) {
    held_out.push_back(r.held_out);
    fit = {std::min(fit.first, r.fit_error), std::max(fit.second, r.fit_error)};
  }
  const RoutingRanges m = routing_ranges(held_out);
  const RoutingStats& t = report.routing.front().target;
  std::printf("routers placed for Zipf s = %.2f in %.1f s (%zu MoE layers; held-out tokens, min-max over layers):\n", s,
              report.routing_seconds, report.routing.size());
  std::printf("  top expert's share   %5.1f%% target, %5.1f-%5.1f%% measured\n", 100 * t.top_share,
              100 * m.top_share.first, 100 * m.top_share.second);
  std::printf("  experts for 90%%      %5.1f%% target, %5.1f-%5.1f%% measured\n", 100 * t.coverage_90,
              100 * m.coverage_90.first, 100 * m.coverage_90.second);
  std::printf("  concentration        %6.3f target, %6.3f-%6.3f measured\n", t.concentration, m.concentration.first,
              m.concentration.second);
  std::printf("  adjacent tokens share %5.1f-%5.1f%% of their picks (independent: %.1f%%)\n",
              100 * m.adjacent_overlap.first, 100 * m.adjacent_overlap.second,
              100.0 * report.config.num_experts_per_tok / report.config.num_experts);
  std::printf("  fit error            %5.3f-%5.3f (half the L1 distance of the shares, fitted tokens)\n", fit.first,
              fit.second);
}

}  // namespace

CommandRunner register_synth(CLI::App& root) {
  auto* cmd =
      root.add_subcommand("synth", "Write a random-weight ModelOpt NVFP4 checkpoint (for tests and benchmarks)");
  auto options = std::make_shared<SynthOptions>();
  auto quantize_attention = std::make_shared<std::string>("yes");
  cmd->add_option("--preset", options->preset, "Model shape")->required()->check(CLI::IsMember(synth_presets()));
  cmd->add_option("--out", options->out_dir, "Output folder")->required();
  cmd->add_option("--seed", options->seed, "Random seed (same seed, same checkpoint)")->default_val(0);
  cmd->add_option("--layers", options->layers, "Override the number of decoder layers")->check(CLI::PositiveNumber);
  cmd->add_option("--experts", options->experts, "Override the number of experts")->check(CLI::PositiveNumber);
  cmd->add_option("--quantize-attention", *quantize_attention, "Quantize q/k/v/o to NVFP4")
      ->check(CLI::IsMember({"yes", "no"}))
      ->default_val("yes");
  cmd->add_option("--shard-size", options->shard_bytes, "Bytes per safetensors shard (default: preset's)");
  cmd->add_flag("--kv-cache-fp8", options->kv_cache_fp8,
                "Declare kv_cache_quant_algo FP8 and write each layer's k_proj.k_scale / v_proj.v_scale (ModelOpt)");
  cmd->add_option("--router-skew", options->router_skew,
                  "Place each MoE router (CPU forward over random tokens) so expert popularity follows a Zipf law "
                  "of this exponent (0: uniform; trained Qwen3-30B-A3B: ~0.5-0.6); default: random rows")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--router-tokens", options->router_tokens, "Calibration tokens of --router-skew")
      ->check(CLI::Range(int64_t{256}, int64_t{1} << 20))
      ->capture_default_str();
  return [options, quantize_attention] {
    options->quantize_attention = *quantize_attention == "yes";
    Result<uint64_t> total = synth_total_bytes(*options);
    if (!total) {
      std::fprintf(stderr, "nibble synth: %s\n", total.status().message().c_str());
      return 1;
    }
    std::atomic<uint64_t> done{0};
    options->bytes_done = &done;
    const auto start = std::chrono::steady_clock::now();
    Result<SynthReport> report = [&] {
      ProgressBar bar("synth " + options->preset, *total, done);
      return synth_checkpoint(*options);
    }();
    if (!report) {
      std::fprintf(stderr, "nibble synth: %s\n", report.status().message().c_str());
      return 1;
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf(
        "wrote %s: %s, %.3f GB in %zu shard(s), %.1f s (%.2f GB/s; generating %.1f s, flushing to disk %.1f s)\n",
        options->out_dir.c_str(), report->config.architecture.c_str(), report->total_bytes / 1e9, report->n_shards,
        seconds, report->total_bytes / 1e9 / seconds, report->generate_seconds, report->flush_seconds);
    if (!report->routing.empty()) print_routing(*report, options->router_skew);
    return 0;
  };
}

}  // namespace nibble::tools

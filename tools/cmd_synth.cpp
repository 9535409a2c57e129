// `nibble synth`: writes a random-weight checkpoint in the exact ModelOpt NVFP4 layout.
#include <chrono>
#include <cstdio>

#include "tools/command.h"
#include "tools/progress.h"
#include "tools/synth.h"

namespace nibble::tools {

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
    return 0;
  };
}

}  // namespace nibble::tools

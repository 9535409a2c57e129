// `nibble quantize`: BF16 Hugging Face checkpoint → ModelOpt NVFP4 checkpoint.
#include <chrono>
#include <cstdio>

#include "tools/command.h"
#include "tools/quantize.h"

namespace nibble::tools {

CommandRunner register_quantize(CLI::App& root) {
  auto* cmd = root.add_subcommand("quantize", "Quantize a BF16 Hugging Face checkpoint to ModelOpt NVFP4");
  auto o = std::make_shared<QuantizeOptions>();
  cmd->add_option("--in", o->in_dir, "BF16 model folder")->required();
  cmd->add_option("--out", o->out_dir, "Output folder")->required();
  auto* calib = cmd->add_option("--calib", o->calib_file, "Calibration text file (default: built-in text)");
  cmd->add_option("--calib-ids", o->calib_ids_file, "Calibration token ids instead: a JSON list of lists")
      ->excludes(calib);
  cmd->add_option("--calib-sequences", o->calib_sequences, "At most this many calibration sequences")
      ->default_val(32)
      ->check(CLI::PositiveNumber);
  cmd->add_option("--calib-length", o->calib_length, "At most this many tokens per sequence")
      ->default_val(256)
      ->check(CLI::PositiveNumber);
  cmd->add_option("--calib-seed", o->calib_seed, "Seed of random calibration ids (folders without a tokenizer)")
      ->default_val(0);
  cmd->add_option(
      "--exclude", o->exclude,
      "Module patterns to keep in BF16 (fnmatch; default: lm_head and embeddings); MoE routers always stay BF16");
  return [o] {
    const auto start = std::chrono::steady_clock::now();
    Result<QuantizeReport> r = quantize_checkpoint(*o);
    if (!r) {
      std::fprintf(stderr, "nibble quantize: %s\n", r.status().message().c_str());
      return 1;
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("wrote %s: %zu NVFP4 modules, %zu left in BF16, calibrated on %lld tokens of %s, %.3f GB, %.1f s\n",
                o->out_dir.c_str(), r->quantized_modules, r->excluded_modules,
                static_cast<long long>(r->calibration_tokens), r->calibration_source.c_str(), r->total_bytes / 1e9,
                seconds);
    return 0;
  };
}

}  // namespace nibble::tools

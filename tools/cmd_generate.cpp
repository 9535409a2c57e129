// `nibble generate`: runs a checkpoint on a prompt (text or token ids) through a model runner (CPU
// reference or CUDA) and prints the generated text or ids (greedy at temperature 0). --dump-logits
// writes the logits of every generated position (.npy), for differential tests.
#include <chrono>
#include <cstdio>
#include <set>

#include "engine/model_runner.h"
#include "formats/nvfp4.h"
#include "sampling/sampler.h"
#include "text/tokenizer.h"
#include "tools/command.h"
#include "tools/npy.h"
#include "tools/token_ids.h"

namespace nibble::tools {
namespace {

struct GenerateOptions {
  std::string model_dir;
  std::string prompt_ids;
  std::string prompt;
  int64_t max_tokens = 16;
  float temperature = 0.0f;
  uint64_t seed = 0;
  std::string backend = "auto";
  std::string gemm_backend = "auto";
  std::string moe_backend = "auto";
  std::string attention_backend = "auto";
  std::string decode_attention = "auto";
  std::string kv_cache_dtype = "auto";
  std::string act_quant_moe = "none";
  std::string act_quant_dense = "none";
  std::string dump_logits;
  int64_t prefill_chunk = 0;
  int64_t block_size = 16;
  bool ignore_eos = false;
  bool enforce_eager = false;
  std::string hf_overrides, rope_scaling;  // as nibble serve's
};

int run_generate(const GenerateOptions& o) {
  auto fail = [](const std::string& message) {
    std::fprintf(stderr, "nibble generate: %s\n", message.c_str());
    return 1;
  };
  if (o.prompt.empty() && o.prompt_ids.empty()) return fail("give --prompt TEXT or --prompt-ids 1,2,3");
  // The prompt: ids as given, or text encoded with the model's tokenizer.
  std::unique_ptr<text::Tokenizer> tokenizer;
  if (!o.prompt.empty()) {
    auto loaded_tokenizer = text::Tokenizer::load(o.model_dir);
    if (!loaded_tokenizer) return fail(loaded_tokenizer.status().message());
    tokenizer = std::move(loaded_tokenizer.value());
  }
  Result<std::vector<int32_t>> prompt = o.prompt_ids.empty() ? Result<std::vector<int32_t>>(tokenizer->encode(o.prompt))
                                                             : parse_token_ids(o.prompt_ids, "--prompt-ids");
  if (!prompt) return fail(prompt.status().message());
  if (prompt->empty()) return fail("the prompt encodes to no tokens");

  // CLI11 has checked every name. One sequence: exactly the KV blocks it needs; the CPU reference
  // keeps an fp32 KV cache (the differential tests' oracle) and the GPU a BF16 one unless --kv-cache-dtype says
  // otherwise.
  engine::RunnerOptions options;
  options.backend = *engine::parse_backend(o.backend);
  options.gemm = *parse_dense_kernel(o.gemm_backend);
  options.moe = *parse_moe_kernel(o.moe_backend);
  options.attention = *engine::parse_attention_backend(o.attention_backend);
  options.decode_attention = *engine::parse_decode_attention(o.decode_attention);
  options.kv_dtype = *engine::parse_kv_cache_dtype(o.kv_cache_dtype);
  options.act_quant_moe = formats::parse_act_quant(o.act_quant_moe).value();
  options.act_quant_dense = formats::parse_act_quant(o.act_quant_dense).value();
  const int64_t total = static_cast<int64_t>(prompt->size()) + o.max_tokens;
  options.block_size = o.block_size;
  options.num_kv_blocks = (total + o.block_size - 1) / o.block_size;
  options.max_num_seqs = 1;
  options.enforce_eager = o.enforce_eager;
  options.max_num_batched_tokens = o.prefill_chunk > 0 ? o.prefill_chunk : static_cast<int64_t>(prompt->size());
  options.cpu_kv_fp32 = true;
  options.config_overrides = {o.hf_overrides, o.rope_scaling};
  auto runner = engine::create_runner(o.model_dir, options);
  if (!runner) return fail(runner.status().message());
  const io::ModelConfig& config = (*runner)->config();
  if (total > config.max_position_embeddings)
    return fail("prompt + max tokens (" + std::to_string(total) + ") exceed max_position_embeddings (" +
                std::to_string(config.max_position_embeddings) + ")");
  models::BatchSequence seq;
  for (int32_t b = 0; b < options.num_kv_blocks; ++b) seq.block_table.push_back(b);

  std::set<int32_t> eos(config.eos_token_ids.begin(), config.eos_token_ids.end());
  sampling::SamplingParams params;
  params.temperature = o.temperature;
  std::vector<int32_t> pending = *prompt, generated, all = *prompt;
  std::vector<float> logits, dumped;
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  Clock::time_point first_token;
  while (static_cast<int64_t>(generated.size()) < o.max_tokens) {
    // Prefill in chunks of prefill_chunk tokens (all at once when 0), then one token per step.
    const int64_t chunk =
        o.prefill_chunk > 0 ? std::min<int64_t>(o.prefill_chunk, pending.size()) : static_cast<int64_t>(pending.size());
    models::Batch batch;
    batch.token_ids.assign(pending.begin(), pending.begin() + chunk);
    seq.n_tokens = chunk;
    batch.sequences = {seq};
    const bool last_chunk = chunk == static_cast<int64_t>(pending.size());
    if (last_chunk) batch.logits_rows = {chunk - 1};
    const engine::SampleRow row{&params,
                                {std::span<const int32_t>(all.data(), prompt->size()),
                                 std::span<const int32_t>(all.data() + prompt->size(), generated.size()),
                                 {},
                                 {}},
                                {o.seed, static_cast<uint64_t>(all.size())}};
    int32_t next = -1;
    if (!last_chunk) {
      Status s = (*runner)->forward_logits(batch, logits);
      if (!s) return fail(s.message());
    } else if (!o.dump_logits.empty()) {  // the logits themselves, sampled here by the same sampler
      Status s = (*runner)->forward_logits(batch, logits);
      if (!s) return fail(s.message());
      next = sampling::sample_next(logits, params, row.context, row.key).token;
      dumped.insert(dumped.end(), logits.begin(), logits.end());
    } else {
      std::vector<sampling::SampledToken> drawn;
      Status s = (*runner)->step(batch, std::span<const engine::SampleRow>(&row, 1), drawn);
      if (!s) return fail(s.message());
      next = drawn[0].token;
    }
    seq.start_position += chunk;
    pending.erase(pending.begin(), pending.begin() + chunk);
    if (!last_chunk) continue;
    generated.push_back(next);
    all.push_back(next);
    if (generated.size() == 1) first_token = Clock::now();
    if (!o.ignore_eos && eos.count(next)) break;
    pending = {next};
  }
  const double prefill_s = std::chrono::duration<double>(first_token - start).count();
  const double decode_s = std::chrono::duration<double>(Clock::now() - first_token).count();
  std::fprintf(
      stderr,
      "nibble generate: %s: prefill %zu tokens in %.1f ms (%.0f tok/s); decode %zu tokens in %.1f ms (%.1f tok/s)\n",
      (*runner)->describe().c_str(), prompt->size(), prefill_s * 1e3, prompt->size() / prefill_s, generated.size() - 1,
      decode_s * 1e3, decode_s > 0 ? (generated.size() - 1) / decode_s : 0.0);
  if (!o.dump_logits.empty()) {
    Status s = write_npy_f32(o.dump_logits, dumped, static_cast<int64_t>(generated.size()), config.vocab_size);
    if (!s) return fail(s.message());
  }
  if (tokenizer) {  // text in, text out
    const std::string text = tokenizer->decode(generated, /*skip_special_tokens=*/true);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::printf("\n");
    return 0;
  }
  std::printf("[");
  for (size_t i = 0; i < generated.size(); ++i) std::printf("%s%d", i ? ", " : "", generated[i]);
  std::printf("]\n");
  return 0;
}

}  // namespace

CommandRunner register_generate(CLI::App& root) {
  auto* cmd = root.add_subcommand("generate", "Generate from a prompt (text or token ids) on one sequence");
  auto o = std::make_shared<GenerateOptions>();
  const std::vector<std::string> modes = {"none", "static", "per-token"};
  cmd->add_option("--model", o->model_dir, "Model folder")->required();
  auto* text_prompt =
      cmd->add_option("--prompt", o->prompt, "Prompt text (encoded with the model's tokenizer; prints text)");
  auto* id_prompt = cmd->add_option("--prompt-ids", o->prompt_ids, "Prompt as comma-separated token ids (prints ids)");
  text_prompt->excludes(id_prompt);
  cmd->add_option("--max-tokens", o->max_tokens, "Tokens to generate")->default_val(16)->check(CLI::PositiveNumber);
  cmd->add_option("--temperature", o->temperature, "0 = greedy")->default_val(0.0f)->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", o->seed, "Sampling seed")->default_val(0);
  cmd->add_option("--backend", o->backend, "auto (CUDA when a GPU is visible) | cpu (reference, fp32 KV) | cuda")
      ->default_val("auto")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--gemm-backend", o->gemm_backend,
                  "Dense NVFP4 kernels (CUDA): " + choices_help(dense_kernel_names()))
      ->default_val("auto")
      ->check(CLI::IsMember(dense_kernel_names()));
  cmd->add_option("--moe-backend", o->moe_backend, "MoE kernels (CUDA): " + choices_help(moe_kernel_names()))
      ->default_val("auto")
      ->check(CLI::IsMember(moe_kernel_names()));
  cmd->add_option("--attention-backend", o->attention_backend, "Attention kernels (CUDA): auto | flashinfer | native")
      ->default_val("auto")
      ->check(CLI::IsMember({"auto", "flashinfer", "native"}));
  cmd->add_option("--decode-attention", o->decode_attention,
                  "Native attention's decode kernel (CUDA): auto | split-kv | tensor-core")
      ->default_val("auto")
      ->check(CLI::IsMember({"auto", "split-kv", "tensor-core"}));
  cmd->add_option("--hf-overrides", o->hf_overrides, "JSON object merged into config.json (as nibble serve's)");
  cmd->add_option("--rope-scaling", o->rope_scaling,
                  "JSON object merged into the config's RoPE scaling (as nibble serve's): default, linear, yarn");
  cmd->add_option("--kv-cache-dtype", o->kv_cache_dtype,
                  "auto (CPU fp32, GPU BF16) | bf16 | fp8 (E4M3, unit scale) | fp32 (CPU)")
      ->default_val("auto")
      ->check(CLI::IsMember({"auto", "bf16", "fp8", "fp8_e4m3", "fp32"}));
  cmd->add_option("--act-quant-moe", o->act_quant_moe, "MoE activation quantization")
      ->default_val("none")
      ->check(CLI::IsMember(modes));
  cmd->add_option("--act-quant-dense", o->act_quant_dense, "Dense-layer activation quantization")
      ->default_val("none")
      ->check(CLI::IsMember(modes));
  cmd->add_option("--dump-logits", o->dump_logits, "Write the logits of every generated position (.npy)");
  cmd->add_option("--prefill-chunk", o->prefill_chunk, "Prefill the prompt in chunks of this many tokens")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--block-size", o->block_size, "KV cache block size")->default_val(16)->check(CLI::PositiveNumber);
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Keep generating after an end-of-sequence token");
  cmd->add_flag("--enforce-eager", o->enforce_eager, "CUDA backend: no CUDA graph for decode steps");
  return [o] { return run_generate(*o); };
}

}  // namespace nibble::tools

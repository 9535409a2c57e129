// `nibble generate`: runs a checkpoint on a prompt (text or token ids) and prints the generated
// text or ids (greedy at temperature 0). --dump-logits writes the logits of every generated
// position (.npy).
#include <cstdio>
#include <random>
#include <set>

#include "formats/nvfp4.h"
#include "models/model.h"
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
  std::string backend = "cpu";
  std::string act_quant_moe = "none";
  std::string act_quant_dense = "none";
  std::string dump_logits;
  int64_t prefill_chunk = 0;
  int64_t block_size = 16;
  bool ignore_eos = false;
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
  Result<std::unique_ptr<io::LoadedCheckpoint>> loaded = io::load_checkpoint(o.model_dir);
  if (!loaded) return fail(loaded.status().message());
  std::shared_ptr<const io::LoadedCheckpoint> checkpoint = std::move(loaded.value());
  // CLI11 has checked both names.
  models::ModelOptions options{formats::parse_act_quant(o.act_quant_moe).value(),
                               formats::parse_act_quant(o.act_quant_dense).value(), {}};
  Result<std::unique_ptr<models::Model>> model = models::create_model(checkpoint, options);
  if (!model) return fail(model.status().message());
  const io::ModelConfig& config = (*model)->config();

  const int64_t total = static_cast<int64_t>(prompt->size()) + o.max_tokens;
  if (total > config.max_position_embeddings)
    return fail("prompt + max tokens (" + std::to_string(total) + ") exceed max_position_embeddings (" +
                std::to_string(config.max_position_embeddings) + ")");
  const int64_t n_blocks = (total + o.block_size - 1) / o.block_size;
  models::KvCache cache(config, n_blocks, o.block_size);
  models::BatchSequence seq;
  for (int32_t b = 0; b < n_blocks; ++b) seq.block_table.push_back(b);

  std::set<int32_t> eos(config.eos_token_ids.begin(), config.eos_token_ids.end());
  std::mt19937_64 rng(o.seed);
  std::vector<int32_t> pending = *prompt, generated;
  std::vector<float> logits, dumped;
  while (static_cast<int64_t>(generated.size()) < o.max_tokens) {
    // Prefill in chunks of prefill_chunk tokens (all at once when 0), then one token per step.
    const int64_t chunk = o.prefill_chunk > 0 ? std::min<int64_t>(o.prefill_chunk, pending.size())
                                              : static_cast<int64_t>(pending.size());
    models::Batch batch;
    batch.token_ids.assign(pending.begin(), pending.begin() + chunk);
    seq.n_tokens = chunk;
    batch.sequences = {seq};
    const bool last_chunk = chunk == static_cast<int64_t>(pending.size());
    if (last_chunk) batch.logits_rows = {chunk - 1};
    Status s = (*model)->forward(batch, cache, logits);
    if (!s) return fail(s.message());
    seq.start_position += chunk;
    pending.erase(pending.begin(), pending.begin() + chunk);
    if (!last_chunk) continue;
    sampling::SamplingParams params;
    params.temperature = o.temperature;
    const int32_t next = sampling::sample_next(logits, params, {}, rng).token;
    generated.push_back(next);
    if (!o.dump_logits.empty()) dumped.insert(dumped.end(), logits.begin(), logits.end());
    if (!o.ignore_eos && eos.count(next)) break;
    pending = {next};
  }
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
  auto* cmd = root.add_subcommand("generate", "Generate from a prompt (text or token ids) on the CPU reference backend");
  auto o = std::make_shared<GenerateOptions>();
  const std::vector<std::string> modes = {"none", "static", "per-token"};
  cmd->add_option("--model", o->model_dir, "Model folder")->required();
  auto* text_prompt = cmd->add_option("--prompt", o->prompt, "Prompt text (encoded with the model's tokenizer; prints text)");
  auto* id_prompt = cmd->add_option("--prompt-ids", o->prompt_ids, "Prompt as comma-separated token ids (prints ids)");
  text_prompt->excludes(id_prompt);
  cmd->add_option("--max-tokens", o->max_tokens, "Tokens to generate")->default_val(16)->check(CLI::PositiveNumber);
  cmd->add_option("--temperature", o->temperature, "0 = greedy")->default_val(0.0f)->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", o->seed, "Sampling seed")->default_val(0);
  cmd->add_option("--backend", o->backend, "Compute backend")->default_val("cpu")->check(CLI::IsMember({"cpu"}));
  cmd->add_option("--act-quant-moe", o->act_quant_moe, "MoE activation quantization")
      ->default_val("none")->check(CLI::IsMember(modes));
  cmd->add_option("--act-quant-dense", o->act_quant_dense, "Dense-layer activation quantization")
      ->default_val("none")->check(CLI::IsMember(modes));
  cmd->add_option("--dump-logits", o->dump_logits, "Write the logits of every generated position (.npy)");
  cmd->add_option("--prefill-chunk", o->prefill_chunk, "Prefill the prompt in chunks of this many tokens")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--block-size", o->block_size, "KV cache block size")->default_val(16)->check(CLI::PositiveNumber);
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Keep generating after an end-of-sequence token");
  return [o] { return run_generate(*o); };
}

}  // namespace nibble::tools

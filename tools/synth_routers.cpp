// Router placement for synthetic checkpoints: one CPU forward whose router hook (ModelOptions::
// router_placer) fits each layer on half the tokens, measures it on the other half, and keeps the
// rows; then the rows are written into the safetensors files in place (same dtype, same size).
#include "tools/synth_routers.h"

#include <cmath>
#include <fstream>
#include <map>

#include "formats/bf16.h"
#include "io/binding.h"
#include "models/model.h"
#include "tools/fast_random.h"

namespace nibble::tools {
namespace {

constexpr int64_t SEQUENCE = 128;  // calibration tokens per sequence; even sequences fit, odd ones check

// The rows of x [tokens, width] in the fitted (even) or held-out (odd) sequences.
std::vector<float> sequences_of(const float* x, int64_t tokens, int64_t width, int parity) {
  std::vector<float> out;
  for (int64_t t = 0; t < tokens; ++t)
    if ((t / SEQUENCE) % 2 == parity) out.insert(out.end(), x + t * width, x + (t + 1) * width);
  return out;
}

Result<const io::SafetensorsReader::Entry*> bf16_entry(const io::SafetensorsReader& reader, const std::string& name,
                                                       size_t elements) {
  const io::SafetensorsReader::Entry* entry = reader.find(name);
  if (!entry) return Status::error("synth: no tensor " + name);
  if (entry->info->nbytes != elements * 2)
    return Status::error("synth: " + name + " is not " + std::to_string(elements) + " BF16 values");
  return entry;
}

Status write_rows(const io::SafetensorsReader& reader, const std::string& name, const std::vector<uint16_t>& rows) {
  Result<const io::SafetensorsReader::Entry*> found = bf16_entry(reader, name, rows.size());
  if (!found) return found.status();
  const io::SafetensorsReader::Entry* entry = *found;
  std::fstream file(entry->file->path(), std::ios::in | std::ios::out | std::ios::binary);
  file.seekp(static_cast<std::streamoff>(entry->info->data_begin));
  file.write(reinterpret_cast<const char*>(rows.data()), static_cast<std::streamsize>(rows.size() * 2));
  file.flush();
  return file ? Status::ok() : Status::error("synth: cannot write " + name + " into " + entry->file->path());
}

// Adds one common vector to every embedding row, COMMON_SCALE times a row's norm. Trained embeddings
// and residual streams share such a direction (and the router's popularity lives in it); a random
// model's do not, so an offset along the mean direction would move some tokens' logits and not
// others', and the loads placed on one draw of tokens would not hold on the next (measured in
// lab/2026-12-06-router-skew.md). Tied or not, the logits move by one constant a token: sampling is unchanged.
constexpr double COMMON_SCALE = 8.0;
Status add_common_embedding(const std::string& dir, const io::ModelConfig& config, uint64_t seed) {
  Result<io::SafetensorsReader> reader = io::SafetensorsReader::open(dir);
  if (!reader) return reader.status();
  const size_t H = static_cast<size_t>(config.hidden_size), V = static_cast<size_t>(config.vocab_size);
  Result<const io::SafetensorsReader::Entry*> entry = bf16_entry(*reader, "model.embed_tokens.weight", V * H);
  if (!entry) return entry.status();
  std::vector<uint16_t> rows(V * H);
  {
    std::ifstream file((*entry)->file->path(), std::ios::binary);
    file.seekg(static_cast<std::streamoff>((*entry)->info->data_begin));
    file.read(reinterpret_cast<char*>(rows.data()), static_cast<std::streamsize>(rows.size() * 2));
    if (!file) return Status::error("synth: cannot read model.embed_tokens.weight");
  }
  double sum_sq = 0;
  for (uint16_t v : rows) sum_sq += static_cast<double>(formats::bf16_decode(v)) * formats::bf16_decode(v);
  const double element_rms = std::sqrt(sum_sq / static_cast<double>(rows.size()));
  FastRandom rng(seed, "common embedding direction");
  std::vector<float> common(H);
  for (float& c : common) c = static_cast<float>(COMMON_SCALE * element_rms * rng.normal());
  for (size_t i = 0; i < rows.size(); ++i)
    rows[i] = formats::bf16_encode(formats::bf16_decode(rows[i]) + common[i % H]);
  return write_rows(*reader, "model.embed_tokens.weight", rows);
}

}  // namespace

Result<std::vector<LayerRouting>> place_synth_routers(const std::string& dir, double s, uint64_t seed, int64_t tokens) {
  if (s < 0) return Status::error("--router-skew must be ≥ 0 (a Zipf exponent; 0 is uniform)");
  tokens = std::max<int64_t>(2 * SEQUENCE, tokens / SEQUENCE * SEQUENCE);
  std::map<int64_t, std::vector<uint16_t>> placed;  // by layer
  std::vector<LayerRouting> report;
  {
    Result<std::unique_ptr<io::LoadedCheckpoint>> loaded = io::load_checkpoint(dir);
    if (!loaded) return loaded.status();
    const io::ModelConfig& c = (*loaded)->bound.config;
    if (c.num_experts == 0) return Status::error("--router-skew: " + c.architecture + " has no experts");
    if (c.router_fp32 || c.router_score_bias)
      return Status::error("--router-skew: " + c.architecture +
                           "'s router chooses with a correction bias; only BF16 routers (Qwen3-MoE) are placed");
    const io::ModelConfig config_copy = c;
    loaded->reset();  // its mapping goes before the embedding is rewritten
    NIB_RETURN_IF_ERROR(add_common_embedding(dir, config_copy, seed));
    loaded = io::load_checkpoint(dir);
    if (!loaded) return loaded.status();
    std::shared_ptr<const io::LoadedCheckpoint> checkpoint = std::move(loaded.value());
    const io::ModelConfig& config = checkpoint->bound.config;
    const int64_t E = config.num_experts, K = config.num_experts_per_tok;
    models::ModelOptions options;
    options.router_placer = [&](int64_t layer, const float* x, int64_t rows, int64_t width) {
      const std::vector<float> fit = sequences_of(x, rows, width, 0), check = sequences_of(x, rows, width, 1);
      const std::vector<double> shares = zipf_shares(E, K, s, seed * 1'000'003 + static_cast<uint64_t>(layer));
      PlacedRouter router = place_router(fit.data(), static_cast<int64_t>(fit.size()) / width, width, shares, K,
                                         seed * 1'000'003 + static_cast<uint64_t>(layer));
      std::vector<uint16_t>& bf16 = placed[layer];
      bf16.resize(router.rows.size());
      for (size_t i = 0; i < bf16.size(); ++i) {
        bf16[i] = formats::bf16_encode(router.rows[i]);
        router.rows[i] = formats::bf16_decode(bf16[i]);  // measured as the checkpoint will hold them
      }
      const int64_t n_check = static_cast<int64_t>(check.size()) / width;
      const std::vector<int32_t> ids = top_k_experts(check.data(), n_check, width, router.rows.data(), E, K);
      report.push_back({layer, share_stats(shares), routing_stats(ids, K, E, SEQUENCE), router.fit_error});
      return router.rows;
    };
    Result<std::unique_ptr<models::Model>> model = models::create_model(checkpoint, options);
    if (!model) return model.status();
    FastRandom rng(seed, "router calibration tokens");
    NIB_RETURN_IF_ERROR(forward_random_tokens(**model, config, tokens / SEQUENCE, SEQUENCE, rng));
  }
  // The model and its mapping are gone: write the rows into the files.
  Result<io::SafetensorsReader> reader = io::SafetensorsReader::open(dir);
  if (!reader) return reader.status();
  for (const auto& [layer, rows] : placed)
    NIB_RETURN_IF_ERROR(write_rows(*reader, "model.layers." + std::to_string(layer) + ".mlp.gate.weight", rows));
  return report;
}

Status forward_random_tokens(models::Model& model, const io::ModelConfig& config, int64_t sequences,
                             int64_t tokens_each, FastRandom& rng) {
  const int64_t block = 16, blocks_each = (tokens_each + block - 1) / block;
  models::KvCache cache(config, blocks_each * sequences, block);
  models::Batch batch;
  for (int64_t s = 0; s < sequences; ++s) {
    models::BatchSequence seq;
    for (int64_t b = 0; b < blocks_each; ++b) seq.block_table.push_back(static_cast<int32_t>(s * blocks_each + b));
    seq.n_tokens = tokens_each;
    batch.sequences.push_back(seq);
    for (int64_t i = 0; i < tokens_each; ++i)
      batch.token_ids.push_back(static_cast<int32_t>(rng.next() % static_cast<uint64_t>(config.vocab_size)));
  }
  batch.logits_rows = {sequences * tokens_each - 1};
  std::vector<float> logits;
  return model.forward(batch, cache, logits);
}

}  // namespace nibble::tools

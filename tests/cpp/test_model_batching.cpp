// The Model forward over mixed batches: a prompt prefilled in chunks then decoded gives the logits
// of one full prefill; sequences batched together (prefill chunks beside decode tokens) give the
// logits of each run alone; KV blocks scattered in any order change nothing. Exact equality: every
// token's result is computed by the same fp32 operations whatever else is in the batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <random>

#include "models/kv_cache.h"
#include "models/model.h"
#include "ref/attention.h"
#include "test_seed.h"
#include "tools/synth.h"

using namespace nibble;
using namespace nibble::models;
namespace fs = std::filesystem;

namespace {

constexpr int64_t BLOCK = 4;

std::shared_ptr<const io::LoadedCheckpoint> tiny_checkpoint() {
  static std::shared_ptr<const io::LoadedCheckpoint> checkpoint = [] {
    const fs::path dir = fs::temp_directory_path() / ("nibble_batching_" + std::to_string(getpid()));
    tools::SynthOptions o;
    o.preset = "tiny-moe";
    o.out_dir = dir.string();
    o.seed = 5;
    o.layers = 3;
    EXPECT_TRUE(tools::synth_checkpoint(o).is_ok());
    auto loaded = io::load_checkpoint(dir.string());
    EXPECT_TRUE(loaded.is_ok()) << loaded.status().message();
    return std::shared_ptr<const io::LoadedCheckpoint>(std::move(loaded.value()));
  }();
  return checkpoint;
}

std::unique_ptr<Model> make_model(formats::ActQuant mode) {
  auto model = create_model(tiny_checkpoint(), {mode, mode, {}});
  EXPECT_TRUE(model.is_ok());
  return std::move(model.value());
}

std::vector<int32_t> random_tokens(std::mt19937_64& rng, size_t n) {
  std::vector<int32_t> t(n);
  for (auto& v : t) v = static_cast<int32_t>(rng() % 151936);
  return t;
}

// Logits of every position of `tokens` from a single full prefill ([n, vocab]).
std::vector<float> full_prefill(Model& model, const std::vector<int32_t>& tokens) {
  KvCache cache(model.config(), 16, BLOCK);
  Batch batch;
  batch.token_ids = tokens;
  BatchSequence seq;
  for (int32_t b = 0; b < 16; ++b) seq.block_table.push_back(b);
  seq.n_tokens = static_cast<int64_t>(tokens.size());
  batch.sequences = {seq};
  for (size_t i = 0; i < tokens.size(); ++i) batch.logits_rows.push_back(static_cast<int64_t>(i));
  std::vector<float> logits;
  EXPECT_TRUE(model.forward(batch, cache, logits).is_ok());
  return logits;
}

// The logits of each chunk's last position, prefilling `tokens` into `cache` in chunks of the given
// sizes (then single-token decode steps where a chunk is 1) over blocks 0–15.
std::vector<std::vector<float>> chunked_logits(Model& model, KvCache& cache, const std::vector<int32_t>& tokens,
                                               const std::vector<size_t>& chunks) {
  BatchSequence seq;
  for (int32_t b = 0; b < 16; ++b) seq.block_table.push_back(b);
  std::vector<std::vector<float>> out;
  size_t done = 0;
  for (size_t chunk : chunks) {
    Batch batch;
    batch.token_ids.assign(tokens.begin() + done, tokens.begin() + done + chunk);
    seq.start_position = static_cast<int64_t>(done);
    seq.n_tokens = static_cast<int64_t>(chunk);
    batch.sequences = {seq};
    batch.logits_rows = {static_cast<int64_t>(chunk) - 1};
    out.emplace_back();
    EXPECT_TRUE(model.forward(batch, cache, out.back()).is_ok());
    done += chunk;
  }
  return out;
}

class Batching : public ::testing::TestWithParam<formats::ActQuant> {};

}  // namespace

TEST_P(Batching, ChunkedPrefillThenDecodeEqualsFullPrefill) {
  std::mt19937_64 rng(test::test_seed("ChunkedPrefill"));
  auto model = make_model(GetParam());
  const int64_t V = model->config().vocab_size;
  const auto tokens = random_tokens(rng, 19);
  const auto expected = full_prefill(*model, tokens);

  KvCache cache(model->config(), 16, BLOCK);
  const std::vector<size_t> chunks = {5, 3, 7, 1, 1, 1, 1};  // prefill chunks, then single-token decode steps
  const auto logits = chunked_logits(*model, cache, tokens, chunks);
  size_t done = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    done += chunks[i];
    const float* want = expected.data() + (done - 1) * V;
    ASSERT_TRUE(std::equal(logits[i].begin(), logits[i].end(), want)) << "position " << done - 1;
  }
}

TEST_P(Batching, MixedBatchWithScatteredBlocksEqualsEachSequenceAlone) {
  std::mt19937_64 rng(test::test_seed("MixedBatch"));
  auto model = make_model(GetParam());
  const int64_t V = model->config().vocab_size;
  const std::vector<size_t> lengths = {9, 14, 6};
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<float>> expected;
  for (size_t n : lengths) {
    prompts.push_back(random_tokens(rng, n));
    expected.push_back(full_prefill(*model, prompts.back()));
  }
  // Physical blocks handed out in a shuffled order, interleaved between the sequences.
  std::vector<int32_t> blocks(30);
  for (int32_t i = 0; i < 30; ++i) blocks[i] = i;
  std::shuffle(blocks.begin(), blocks.end(), rng);
  KvCache cache(model->config(), 30, BLOCK);
  std::vector<BatchSequence> seqs(3);
  for (size_t b = 0; b < 12; ++b) seqs[b % 3].block_table.push_back(blocks[b]);

  // Step 1: sequence 0 prefills 5, sequence 1 prefills 8, sequence 2 prefills all 6.
  // Step 2: sequence 0 prefills its last 4, sequence 1 prefills 5, sequence 2 "decodes" nothing new.
  // Step 3: sequence 1 takes its last token beside nothing else.
  const std::vector<std::vector<size_t>> plan = {{5, 8, 6}, {4, 5, 0}, {0, 1, 0}};
  std::vector<size_t> done(3, 0);
  for (const auto& step : plan) {
    Batch batch;
    std::vector<std::pair<size_t, size_t>> rows;  // (sequence, position) of each logits row
    for (size_t s = 0; s < 3; ++s) {
      if (step[s] == 0) continue;
      BatchSequence seq = seqs[s];
      seq.start_position = static_cast<int64_t>(done[s]);
      seq.n_tokens = static_cast<int64_t>(step[s]);
      for (size_t i = 0; i < step[s]; ++i) {
        batch.logits_rows.push_back(static_cast<int64_t>(batch.token_ids.size()));
        batch.token_ids.push_back(prompts[s][done[s] + i]);
        rows.emplace_back(s, done[s] + i);
      }
      batch.sequences.push_back(seq);
      done[s] += step[s];
    }
    std::vector<float> logits;
    ASSERT_TRUE(model->forward(batch, cache, logits).is_ok());
    for (size_t r = 0; r < rows.size(); ++r) {
      const auto [s, p] = rows[r];
      const float* want = expected[s].data() + p * V;
      ASSERT_TRUE(std::equal(logits.begin() + r * V, logits.begin() + (r + 1) * V, want))
          << "sequence " << s << " position " << p;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllModes, Batching,
                         ::testing::Values(formats::ActQuant::NONE, formats::ActQuant::STATIC,
                                           formats::ActQuant::PER_TOKEN));

TEST(ModelErrors, BadBatchesAreErrors) {
  auto model = make_model(formats::ActQuant::NONE);
  KvCache cache(model->config(), 4, BLOCK);
  Batch batch;
  batch.token_ids = {1, 2, 151936};
  batch.sequences = {{{0, 1}, 0, 3}};
  std::vector<float> logits;
  Status s = model->forward(batch, cache, logits);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("token id 151936 is outside the vocabulary"), std::string::npos) << s.message();
  batch.token_ids = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  batch.sequences = {{{0, 1}, 0, 9}};  // two blocks of 4 hold only 8 positions
  EXPECT_NE(model->forward(batch, cache, logits).message().find("block table is too short"), std::string::npos);
  batch.sequences = {{{0, 9}, 0, 9}};
  EXPECT_FALSE(model->forward(batch, cache, logits).is_ok());
}

// An FP8 KV cache (--kv-cache-dtype fp8) rounds what it stores to E4M3 of unit scale, round to nearest
// even and saturating (the GPU store's __nv_cvt_float_to_fp8 with __NV_SATFINITE), and a prompt
// prefilled in chunks still gives the logits of one full prefill over that cache: each stored value
// is rounded once, whatever the chunks.
TEST(KvCacheFp8, RoundsToE4m3AndChunkingChangesNothing) {
  using ref::KvRounding;
  EXPECT_EQ(ref::kv_round(1.0625f, KvRounding::FP8), 1.0f);   // a tie: to the even mantissa
  EXPECT_EQ(ref::kv_round(1.1875f, KvRounding::FP8), 1.25f);  // a tie: to the even mantissa
  EXPECT_EQ(ref::kv_round(1.07f, KvRounding::FP8), 1.125f);
  EXPECT_EQ(ref::kv_round(-1000.0f, KvRounding::FP8), -448.0f);     // saturates
  EXPECT_EQ(ref::kv_round(0.001f, KvRounding::FP8), 0.001953125f);  // 2^-9, the smallest subnormal
  EXPECT_EQ(ref::kv_round(3.0e-4f, KvRounding::FP8), 0.0f);
  EXPECT_EQ(ref::kv_round(1.0f + 1.0f / 256, KvRounding::BF16), 1.0f);
  EXPECT_EQ(ref::kv_round(1.3f, KvRounding::NONE), 1.3f);

  std::mt19937_64 rng(test::test_seed("KvCacheFp8"));
  auto model = make_model(formats::ActQuant::NONE);
  const int64_t V = model->config().vocab_size;
  const auto tokens = random_tokens(rng, 13);
  auto run = [&](const std::vector<size_t>& chunks, KvCache& cache) {
    return chunked_logits(*model, cache, tokens, chunks).back();
  };
  KvCache whole(model->config(), 16, BLOCK, KvDtype::FP8), chunked(model->config(), 16, BLOCK, KvDtype::FP8),
      bf16(model->config(), 16, BLOCK, KvDtype::BF16);
  const auto want = run({13}, whole);
  EXPECT_EQ(run({4, 6, 1, 1, 1}, chunked), want);
  const auto with_bf16 = run({13}, bf16);
  ASSERT_EQ(with_bf16.size(), size_t(V));
  EXPECT_NE(with_bf16, want) << "an FP8 cache should change the logits a little";
  // Every stored value is an E4M3 value.
  const ref::PagedKvLayer layer = whole.layer(0);
  const int64_t width = layer.n_kv_heads * layer.head_dim;
  for (int64_t i = 0; i < 13 * width; ++i) {
    const int64_t slot = i / width;  // blocks 0–15 in order
    const float k = layer.k[slot * width + i % width], v = layer.v[slot * width + i % width];
    ASSERT_EQ(ref::kv_round(k, KvRounding::FP8), k) << "K value " << i;
    ASSERT_EQ(ref::kv_round(v, KvRounding::FP8), v) << "V value " << i;
  }
}

// A checkpoint with FP8 KV-cache scales (ModelOpt's k_proj.k_scale, v_proj.v_scale): an FP8 cache holds
// code · scale of each layer's own scale — every stored K and V divided by it is an E4M3 value.
TEST(KvCacheFp8, CalibratedScalesFromTheCheckpoint) {
  const fs::path dir = fs::temp_directory_path() / ("nibble_kvscales_" + std::to_string(getpid()));
  tools::SynthOptions o;
  o.preset = "tiny-moe";
  o.out_dir = dir.string();
  o.seed = 9;
  o.layers = 2;
  o.kv_cache_fp8 = true;
  ASSERT_TRUE(tools::synth_checkpoint(o).is_ok());
  auto loaded = io::load_checkpoint(dir.string());
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  std::shared_ptr<const io::LoadedCheckpoint> checkpoint(std::move(loaded.value()));
  auto model = create_model(checkpoint, {formats::ActQuant::NONE, formats::ActQuant::NONE, {}});
  ASSERT_TRUE(model.is_ok()) << model.status().message();
  std::mt19937_64 rng(test::test_seed("KvCacheFp8.Scales"));
  const auto tokens = random_tokens(rng, 9);
  KvCache cache((*model)->config(), 16, BLOCK, KvDtype::FP8);
  chunked_logits(**model, cache, tokens, {9});
  for (int64_t l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    const float k_scale = checkpoint->bound.linears.at(p + "k_proj").kv_scale;
    const float v_scale = checkpoint->bound.linears.at(p + "v_proj").kv_scale;
    ASSERT_NE(k_scale, 1.0f);
    const ref::PagedKvLayer layer = cache.layer(l);
    size_t off_unit_grid = 0;
    for (int64_t i = 0; i < 9 * layer.n_kv_heads * layer.head_dim; ++i) {
      const float k = layer.k[i], v = layer.v[i];
      ASSERT_EQ(ref::kv_round(k, ref::KvRounding::FP8, k_scale), k) << "layer " << l << " K " << i;
      ASSERT_EQ(ref::kv_round(v, ref::KvRounding::FP8, v_scale), v) << "layer " << l << " V " << i;
      off_unit_grid += ref::kv_round(k, ref::KvRounding::FP8) != k;
    }
    EXPECT_GT(off_unit_grid, 0u) << "layer " << l << ": the values should sit on the scaled grid, not the unit one";
  }
  fs::remove_all(dir);
}

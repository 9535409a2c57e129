// Tensor and expert parallelism on the CPU reference: ranks on threads, each loading only its slices,
// exchanging partial results through a HostGroup, against the single-rank model. Exact where the sums
// are exact (a row-parallel linear over dyadic inputs in every activation mode, the vocabulary-parallel
// ends, each rank's slices of the stored tensors); within a stated tolerance where only the order of
// the partial sums differs (whole models, Qwen3-MoE and ERNIE-4.5 shapes, TP and EP, 2 and 4 ranks).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "core/collectives.h"
#include "formats/nvfp4.h"
#include "io/binding.h"
#include "models/kv_cache.h"
#include "models/model.h"
#include "models/parallel_model.h"
#include "ref/ops.h"
#include "test_seed.h"
#include "tools/synth.h"

using namespace nibble;
namespace fs = std::filesystem;

namespace {

std::string synth(const std::string& preset, uint64_t seed) {
  const fs::path dir = fs::temp_directory_path() / ("nibble_tp_" + preset + "_" + std::to_string(getpid()));
  if (!fs::exists(dir / "config.json")) {
    tools::SynthOptions o;
    o.preset = preset;
    o.out_dir = dir.string();
    o.seed = seed;
    EXPECT_TRUE(tools::synth_checkpoint(o).is_ok());
  }
  return dir.string();
}

// Runs fn(rank, collectives) on `n` threads of one group; every rank's status.
std::vector<Status> on_ranks(int64_t n, const std::function<Status(int64_t, Collectives&)>& fn) {
  HostGroup group(n);
  std::vector<std::unique_ptr<Collectives>> ends;
  for (int64_t r = 0; r < n; ++r) ends.push_back(group.rank(r));
  std::vector<Status> statuses(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      statuses[r] = fn(r, *ends[r]);
      if (!statuses[r]) group.stop(statuses[r].message());
    });
  for (std::thread& t : threads) t.join();
  return statuses;
}

// A prompt of `prompt` tokens, then `decode` single-token steps (greedy on the logits): every step's
// last-row logits, so the KV cache of each rank is read back too.
std::vector<std::vector<float>> run(models::Model& model, const std::vector<int32_t>& prompt, int decode) {
  models::KvCache cache(model.config(), 8, 16);
  models::BatchSequence seq;
  seq.block_table = {3, 5, 1, 0};
  std::vector<std::vector<float>> out;
  std::vector<int32_t> tokens = prompt;
  int64_t done = 0;
  for (int step = 0; step <= decode; ++step) {
    models::Batch batch;
    batch.token_ids.assign(tokens.begin() + done, tokens.end());
    seq.start_position = done;
    seq.n_tokens = static_cast<int64_t>(batch.token_ids.size());
    batch.sequences = {seq};
    batch.logits_rows = {seq.n_tokens - 1};
    std::vector<float> logits;
    EXPECT_TRUE(model.forward(batch, cache, logits).is_ok());
    done = static_cast<int64_t>(tokens.size());
    tokens.push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    out.push_back(std::move(logits));
  }
  return out;
}

struct Case {
  const char* preset;
  int64_t ranks;
  bool expert_parallel;
  formats::ActQuant mode;
};

std::string name(const Case& c) {
  return std::string(c.preset) + (c.expert_parallel ? " EP" : " TP") + std::to_string(c.ranks) + " " +
         formats::act_quant_name(c.mode);
}

class WholeModel : public ::testing::TestWithParam<Case> {};

}  // namespace

// Tolerance: the ranks' partial sums of o_proj, the MLPs and the experts meet in another order than one
// rank's dot products, so the hidden state differs by fp32 rounding (~1e-7 relative) and grows through
// the layers. In W4A16 the logits stay within 1e-4 of their largest magnitude. In the W4A4 modes such a
// difference can move an activation across an FP4 rounding boundary, changing that value by a whole
// quantization step: the bound there is on the mean error (1% of the largest logit), with the greedy
// tokens equal wherever the single rank's top two differ by more than 2% of it.
TEST_P(WholeModel, RanksTogetherMatchOneRank) {
  const Case c = GetParam();
  const uint64_t seed = test::test_seed("TensorParallel.WholeModel");
  const std::string dir = synth(c.preset, 3);
  auto full = io::load_checkpoint(dir);
  ASSERT_TRUE(full.is_ok()) << full.status().message();
  std::shared_ptr<const io::LoadedCheckpoint> checkpoint = std::move(full.value());
  auto one = models::create_model(checkpoint, {c.mode, c.mode, {}});
  auto split = models::create_parallel_model(dir, {}, {c.ranks, 0, c.expert_parallel}, {c.mode, c.mode, {}});
  ASSERT_TRUE(one.is_ok() && split.is_ok()) << name(c) << ": " << (split ? "" : split.status().message());
  std::mt19937_64 rng(seed);
  const int64_t V = checkpoint->bound.config.vocab_size;
  std::vector<int32_t> prompt(13);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % V);
  const auto want = run(**one, prompt, 3), got = run(**split, prompt, 3);
  ASSERT_EQ(want.size(), got.size());
  double worst = 0, mean = 0, scale = 0;
  for (size_t s = 0; s < want.size(); ++s) {
    double step_scale = 0;
    for (int64_t i = 0; i < V; ++i) step_scale = std::max(step_scale, std::fabs(double(want[s][i])));
    scale = std::max(scale, step_scale);
    for (int64_t i = 0; i < V; ++i) {
      const double d = std::fabs(double(want[s][i]) - got[s][i]);
      worst = std::max(worst, d), mean += d / double(V * want.size());
    }
    // Greedy: the same token where the single rank's lead is clear.
    std::vector<float> sorted = want[s];
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    const auto top = [](const std::vector<float>& l) { return std::max_element(l.begin(), l.end()) - l.begin(); };
    if (sorted[0] - sorted[1] > 0.02 * step_scale) EXPECT_EQ(top(want[s]), top(got[s])) << name(c) << " step " << s;
  }
  std::printf("%s: max |logit| %.3f, max error %.2e, mean %.2e\n", name(c).c_str(), scale, worst, mean);
  if (c.mode == formats::ActQuant::NONE)
    EXPECT_LE(worst, 1e-4 * scale) << name(c);
  else
    EXPECT_LE(mean, 1e-2 * scale) << name(c);
}

INSTANTIATE_TEST_SUITE_P(
    TensorParallel, WholeModel,
    ::testing::Values(Case{"tiny-moe", 2, false, formats::ActQuant::NONE},
                      Case{"tiny-moe", 2, false, formats::ActQuant::STATIC},
                      Case{"tiny-moe", 2, false, formats::ActQuant::PER_TOKEN},
                      Case{"tiny-moe", 2, true, formats::ActQuant::NONE},
                      Case{"tiny-moe", 4, true, formats::ActQuant::NONE},  // 2 KV heads on 4 ranks: replicated
                      Case{"tiny-moe", 4, true, formats::ActQuant::PER_TOKEN},
                      Case{"tiny-ernie", 2, false, formats::ActQuant::NONE},  // a dense layer, shared experts
                      Case{"tiny-ernie", 2, false, formats::ActQuant::PER_TOKEN},
                      Case{"tiny-ernie", 2, true, formats::ActQuant::STATIC}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string n = name(info.param);
      for (char& ch : n)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return n;
    });

// A row-parallel NVFP4 linear (input columns split, partial sums all-reduced) where every operation is
// exact in fp32: values k · 7/16 (|k| ≤ 6), so the weight's and each row's amax is 2.625 = 2688 · 2^-10
// and every global scale a power of two; one nonzero input per 16-value block, so the FP4 × E4M3
// products are multiples of 16 below 2^23 and a row sums four. The ranks' result then equals one
// rank's bit for bit in every activation mode. Per-token mode holds only because the ranks agree on
// each row's whole amax (Collectives::all_reduce_max): a rank scaling its slice by the slice's own
// amax (the row's 2.625 lies on one rank) quantizes differently, and this fails.
TEST(TensorParallel, RowParallelLinearIsExactWhereTheSumsAre) {
  const uint64_t seed = test::test_seed("TensorParallel.RowParallelLinear");
  std::mt19937_64 rng(seed);
  const int64_t N = 24, K = 64, T = 6;
  const float step = 0.4375f, amax = 6 * step;
  std::vector<float> w(static_cast<size_t>(N * K)), x(static_cast<size_t>(T * K), 0.0f);
  for (float& v : w) v = static_cast<float>(static_cast<int>(rng() % 13) - 6) * step;
  w[0] = amax;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t b = 0; b < K / 16; ++b)
      x[t * K + b * 16 + rng() % 16] = static_cast<float>(1 + rng() % 5) * step * (rng() % 2 ? 1.0f : -1.0f);
    float* top = x.data() + t * K + (rng() % (K / 16)) * 16;  // the row's amax in one block
    for (int64_t i = 0; i < 16; ++i)
      if (top[i] != 0.0f) top[i] = top[i] > 0 ? amax : -amax;
  }
  auto q = formats::quantize_weight(w, N, K, "w");
  ASSERT_TRUE(q.is_ok());
  const formats::Nvfp4WeightView full{q->packed.data(), q->block_scales.data(), N, K, q->scale};
  for (formats::ActQuant mode : {formats::ActQuant::NONE, formats::ActQuant::STATIC, formats::ActQuant::PER_TOKEN}) {
    std::vector<float> want(static_cast<size_t>(T * N));
    ASSERT_TRUE(ref::linear_nvfp4(x.data(), T, full, mode, amax / 2688.0f, want.data()).is_ok());
    for (int64_t n : {2, 4}) {
      std::vector<std::vector<float>> got(static_cast<size_t>(n));
      const auto statuses = on_ranks(n, [&](int64_t r, Collectives& c) -> Status {
        const int64_t k0 = r * K / n, k1 = (r + 1) * K / n, k = k1 - k0;
        std::vector<uint8_t> packed(static_cast<size_t>(N * k / 2)), scales(static_cast<size_t>(N * k / 16));
        std::vector<float> xs(static_cast<size_t>(T * k));
        for (int64_t i = 0; i < N; ++i) {
          std::memcpy(packed.data() + i * k / 2, q->packed.data() + i * K / 2 + k0 / 2, k / 2);
          std::memcpy(scales.data() + i * k / 16, q->block_scales.data() + i * K / 16 + k0 / 16, k / 16);
        }
        for (int64_t t = 0; t < T; ++t) std::copy_n(x.data() + t * K + k0, k, xs.data() + t * k);
        const formats::Nvfp4WeightView part{packed.data(), scales.data(), N, k, q->scale};
        std::vector<float>& y = got[r];
        y.resize(static_cast<size_t>(T * N));
        NIB_RETURN_IF_ERROR(ref::linear_nvfp4(xs.data(), T, part, mode, amax / 2688.0f, y.data(),
                                              [&](std::span<float> a) { return c.all_reduce_max(a); }));
        return c.all_reduce_sum(y);
      });
      for (const Status& s : statuses) ASSERT_TRUE(s.is_ok()) << s.message();
      for (int64_t r = 0; r < n; ++r)
        EXPECT_EQ(0, std::memcmp(got[r].data(), want.data(), want.size() * sizeof(float)))
            << formats::act_quant_name(mode) << ", rank " << r << " of " << n;
    }
  }
}

// Each rank's stored slices are the full tensors' rows or columns (NVFP4 codes and block scales
// together), and the rank's modules have the rank's shapes.
TEST(TensorParallel, EachRankHoldsItsSlicesOfTheCheckpoint) {
  const std::string dir = synth("tiny-moe", 3);
  auto full = io::load_checkpoint(dir);
  ASSERT_TRUE(full.is_ok());
  for (bool ep : {false, true}) {
    for (int64_t r = 0; r < 2; ++r) {
      auto rank = io::load_checkpoint(dir, {}, {2, r, ep});
      ASSERT_TRUE(rank.is_ok()) << rank.status().message();
      const io::BoundCheckpoint &f = full.value()->bound, &b = rank.value()->bound;
      // o_proj: columns [r·32, r·32 + 32) of [32, 64] — 16 bytes of codes and 2 scales a row.
      const io::LinearWeights &o = b.linears.at("model.layers.1.self_attn.o_proj"),
                              &of = f.linears.at("model.layers.1.self_attn.o_proj");
      ASSERT_EQ(o.module.shape, (std::vector<int64_t>{32, 32}));
      for (int64_t i = 0; i < 32; ++i) {
        EXPECT_EQ(0, std::memcmp(o.weight.data + i * 16, of.weight.data + i * 32 + r * 16, 16));
        EXPECT_EQ(0, std::memcmp(o.weight_scale.data + i * 2, of.weight_scale.data + i * 4 + r * 2, 2));
      }
      // q_proj: rows [r·32, r·32 + 32).
      const io::LinearWeights& q = b.linears.at("model.layers.0.self_attn.q_proj");
      ASSERT_EQ(q.weight.shape, (std::vector<int64_t>{32, 16}));
      EXPECT_EQ(0, std::memcmp(q.weight.data, f.linears.at("model.layers.0.self_attn.q_proj").weight.data + r * 32 * 16,
                               32 * 16));
      // Experts: dealt out whole (EP: 0–3 on rank 0), or every expert's width halved (TP).
      EXPECT_EQ(b.linears.count("model.layers.0.mlp.experts.5.up_proj"), ep ? size_t(r == 1) : 1u);
      if (!ep) EXPECT_EQ(b.linears.at("model.layers.0.mlp.experts.5.down_proj").module.shape[1], 16);
      // The vocabulary-parallel embedding: rows [r·V/2, (r+1)·V/2).
      const int64_t V = f.config.vocab_size;
      EXPECT_EQ(b.tensors.at("model.embed_tokens.weight").shape[0], V / 2);
      const int64_t half = (V / 2) * 32 * 2;  // bytes of V / 2 BF16 rows of 32
      EXPECT_EQ(0, std::memcmp(b.tensors.at("model.embed_tokens.weight").data,
                               f.tensors.at("model.embed_tokens.weight").data + r * half, half));
    }
  }
}

// Shapes that do not split are start-up errors naming each dimension, before any rank loads.
TEST(TensorParallel, UnsplittableShapesAreErrorsNamingTheDimension) {
  const std::string dir = synth("tiny-moe", 3);
  auto three = models::create_parallel_model(dir, {}, {3, 0, false}, {});
  ASSERT_FALSE(three.is_ok());
  EXPECT_NE(three.status().message().find("num_attention_heads 4 does not split across 3 ranks"), std::string::npos)
      << three.status().message();
  // moe_intermediate_size 32 over 4 ranks leaves 8 columns: half an NVFP4 block (EP would deal the experts).
  auto four = models::create_parallel_model(dir, {}, {4, 0, false}, {});
  ASSERT_FALSE(four.is_ok());
  EXPECT_NE(four.status().message().find("moe_intermediate_size 32 does not split into multiples of 16"),
            std::string::npos)
      << four.status().message();
}

// The host group: every rank holds the same bits, summed in rank order; a rank that stops wakes the
// others with its reason instead of leaving them waiting.
TEST(TensorParallel, HostGroupReducesInRankOrderAndStopsCleanly) {
  const auto statuses = on_ranks(3, [](int64_t r, Collectives& c) -> Status {
    // (1e8 + -1e8) + 1 = 1 in rank order; another order would give 0 (1e8 + 1 rounds to 1e8).
    std::vector<float> v = {r == 0 ? 1e8f : r == 1 ? -1e8f : 1.0f, float(r)};
    NIB_RETURN_IF_ERROR(c.all_reduce_sum(v));
    if (v[0] != 1.0f || v[1] != 3.0f) return Status::error("sum " + std::to_string(v[0]) + " " + std::to_string(v[1]));
    std::vector<float> m = {float(r), -float(r)};
    NIB_RETURN_IF_ERROR(c.all_reduce_max(m));
    if (m[0] != 2.0f || m[1] != 0.0f) return Status::error("max");
    const uint8_t mine[2] = {uint8_t(r), uint8_t(10 + r)};
    uint8_t all[6];
    NIB_RETURN_IF_ERROR(c.all_gather(mine, all));
    if (all[0] != 0 || all[3] != 11 || all[5] != 12) return Status::error("gather");
    if (r == 1) return Status::error("rank 1 gives up");
    return c.all_reduce_sum(v);  // ranks 0 and 2 would wait for rank 1 forever
  });
  EXPECT_TRUE(statuses[0].message().find("rank 1 gives up") != std::string::npos) << statuses[0].message();
  EXPECT_TRUE(statuses[2].message().find("rank 1 gives up") != std::string::npos) << statuses[2].message();
}

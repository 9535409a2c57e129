// The GPU sampler against the CPU sampler: the same token for every row and seed (the same Philox
// race; logprobs within 1e-5) under every sampling parameter, and under structured output's grammar
// masks (dense, sparse, one token, none) bit for bit; the stream's wait for a host-written word
// (host_wait.cuh), and a sampler queued behind it; the phase report its timing prints (host only).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda/common/device_context.cuh"
#include "cuda/diagnostics/phase_stamps.cuh"
#include "cuda/sampling/host_wait.cuh"
#include "cuda/sampling/sampler.cuh"
#include "cuda_test_util.cuh"
#include "models/batch.h"
#include "sampling/sampler.h"
#include "test_seed.h"

using namespace nibble;

namespace {

// First in the file, so that nothing has launched the sampler's kernel before: as the CUDA runner
// does, it is loaded ahead (prepare_sampler); its launch behind a wait for the host then returns at
// once, and the host can answer. (Loaded lazily at that launch, it waited for the device, which
// waited for the host: the first constrained step of a server stalled until the wait timed out.)
TEST(CudaSampler, QueuedBehindAHostWaitLeavesTheHostFree) {
  NIB_SKIP_WITHOUT_GPU();
  const int64_t V = 151936;
  ASSERT_TRUE(cuda::prepare_wait_for_host().is_ok());
  ASSERT_TRUE(cuda::prepare_sampler(V).is_ok());
  uint32_t* words = nullptr;  // [0]: the flag, [1]: the timed-out ticket
  NIB_CUDA_CHECK(cudaHostAlloc(&words, 2 * sizeof(uint32_t), cudaHostAllocDefault));
  words[0] = words[1] = 0;
  std::vector<float> logits(static_cast<size_t>(V), 0.0f);
  logits[123] = 5.0f;
  cuda::SamplerRow row;
  row.temperature = 0.0f;
  test::DeviceBuffer<float> d_logits(logits), d_lp(1), d_top_lp(cuda::MAX_TOP_LOGPROBS);
  test::DeviceBuffer<int32_t> d_tokens(std::vector<int32_t>{0}), d_out(1), d_top(cuda::MAX_TOP_LOGPROBS);
  test::DeviceBuffer<cuda::SamplerRow> d_params(std::vector<cuda::SamplerRow>{row});
  cuda::SamplerBatch b{1,           V,          d_logits.get(), d_params.get(), d_tokens.get(), nullptr,
                       d_out.get(), d_lp.get(), d_top.get(),    d_top_lp.get(), nullptr};
  cudaStream_t s;
  NIB_CUDA_CHECK(cudaStreamCreate(&s));
  const double timeout = 20.0;
  ASSERT_TRUE(cuda::wait_for_host(&words[0], 1, &words[1], timeout, s).is_ok());
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(cuda::sample_rows(b, s).is_ok());
  const double launch = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  __atomic_store_n(&words[0], 1u, __ATOMIC_RELEASE);
  NIB_CUDA_CHECK(cudaStreamSynchronize(s));
  // A launch takes microseconds; one that waited for the device returns only when the wait gives up.
  EXPECT_LT(launch, timeout / 4) << "the sampler's launch waited for the device";
  EXPECT_EQ(words[1], 0u) << "the wait timed out";
  EXPECT_EQ(d_out.to_host()[0], 123);
  cudaStreamDestroy(s);
  cudaFreeHost(words);
}

TEST(CudaSampler, DrawsTheCpuSamplersTokensUnderGrammarMasks) {
  NIB_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::test_seed("CudaSampler.DrawsTheCpuSamplersTokensUnderGrammarMasks");
  std::mt19937_64 rng(seed);
  for (const int64_t V : {int64_t{151936}, int64_t{1000}, int64_t{33}}) {
    const int64_t W = (V + 31) / 32;
    for (const int64_t R : {int64_t{1}, int64_t{7}, int64_t{40}}) {
      std::vector<sampling::SamplingParams> ps(static_cast<size_t>(R));
      std::vector<sampling::DrawKey> keys(static_cast<size_t>(R));
      std::vector<std::vector<int32_t>> masked(static_cast<size_t>(R));
      std::vector<cuda::SamplerRow> params;
      std::vector<int32_t> tokens;
      std::vector<uint32_t> masks;  // the constrained rows' words, in mask_row order
      std::vector<int32_t> mask_row(static_cast<size_t>(R), -1);
      for (int64_t r = 0; r < R; ++r) {
        sampling::SamplingParams& p = ps[size_t(r)];
        const int kind = int(rng() % 6);
        p.temperature = kind == 0 ? 0.0f : 0.5f + 0.25f * float(rng() % 4);
        if (kind == 2) p.top_k = int32_t(1 + rng() % 80);
        if (kind == 3) p.top_p = 0.6f + 0.1f * float(rng() % 4);
        if (kind == 4) p.min_p = 0.02f;
        if (kind == 5) p.top_k = 20, p.top_p = 0.8f;
        keys[size_t(r)] = {rng(), rng() % 10000};
        if (rng() % 4 == 0) masked[size_t(r)] = {int32_t(rng() % V)};
        cuda::SamplerRow g;
        g.temperature = p.temperature, g.top_k = p.top_k, g.top_p = p.top_p, g.min_p = p.min_p;
        g.seed = keys[size_t(r)].seed, g.position = keys[size_t(r)].position;
        g.masked_offset = int32_t(tokens.size()), g.masked_len = int32_t(masked[size_t(r)].size());
        tokens.insert(tokens.end(), masked[size_t(r)].begin(), masked[size_t(r)].end());
        const int shape = int(rng() % 5);  // 0: unconstrained; 1 dense; 2 sparse; 3 one token; 4 none allowed
        if (shape != 0 && !(shape == 4 && r % 7 != 3)) {
          g.mask_row = mask_row[size_t(r)] = int32_t(masks.size() / size_t(W));
          std::vector<uint32_t> words(static_cast<size_t>(W), 0);
          auto allow = [&](int64_t t) { words[size_t(t / 32)] |= 1u << (t % 32); };
          if (shape == 1)
            for (int64_t t = 0; t < V; ++t)
              if (rng() % 2) allow(t);
          if (shape == 2)
            for (int k = 0; k < 12; ++k) allow(int64_t(rng() % V));
          if (shape == 3) allow(int64_t(rng() % V));
          masks.insert(masks.end(), words.begin(), words.end());
        }
        params.push_back(g);
      }
      std::vector<float> logits(static_cast<size_t>(R * V));
      std::normal_distribution<float> normal(0.0f, 2.0f);
      for (float& l : logits) l = normal(rng);
      if (tokens.empty()) tokens.push_back(0);
      if (masks.empty()) masks.push_back(0);
      test::DeviceBuffer<float> d_logits(logits), d_lp(static_cast<size_t>(R)),
          d_top_lp(static_cast<size_t>(R * cuda::MAX_TOP_LOGPROBS));
      test::DeviceBuffer<int32_t> d_tokens(tokens), d_out(static_cast<size_t>(R)),
          d_top(static_cast<size_t>(R * cuda::MAX_TOP_LOGPROBS));
      test::DeviceBuffer<cuda::SamplerRow> d_params(params);
      test::DeviceBuffer<uint32_t> d_masks(masks);
      cuda::SamplerBatch b{R,           V,          d_logits.get(), d_params.get(), d_tokens.get(), nullptr,
                           d_out.get(), d_lp.get(), d_top.get(),    d_top_lp.get(), nullptr};
      b.allowed = d_masks.get(), b.mask_words = W;
      ASSERT_TRUE(cuda::sample_rows(b, nullptr).is_ok());
      NIB_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<int32_t> got = d_out.to_host();
      for (int64_t r = 0; r < R; ++r) {
        sampling::SequenceContext c{{}, {}, masked[size_t(r)], {}};
        if (mask_row[size_t(r)] >= 0)
          c.allowed = std::span<const uint32_t>(masks).subspan(size_t(mask_row[size_t(r)] * W), size_t(W));
        const std::span<const float> l(logits.data() + r * V, size_t(V));
        const int32_t want = sampling::sample_next(l, ps[size_t(r)], c, keys[size_t(r)]).token;
        EXPECT_EQ(got[size_t(r)], want) << "vocab " << V << " rows " << R << " row " << r << " seed " << seed;
        if (mask_row[size_t(r)] < 0) continue;
        bool any = false;
        for (uint32_t w : c.allowed) any |= w != 0;
        if (any)  // whenever the mask allows a token, the draw is one it allows
          EXPECT_TRUE(c.allowed[size_t(want / 32)] >> (want % 32) & 1u) << "row " << r;
      }
    }
  }
}

TEST(CudaSampler, StreamWaitsForTheHostsWordAndTimesOut) {
  NIB_SKIP_WITHOUT_GPU();
  uint32_t* words = nullptr;  // [0]: the flag, [1]: the timed-out ticket
  NIB_CUDA_CHECK(cudaHostAlloc(&words, 2 * sizeof(uint32_t), cudaHostAllocDefault));
  words[0] = words[1] = 0;
  cudaStream_t s;
  NIB_CUDA_CHECK(cudaStreamCreate(&s));
  cudaEvent_t done;
  NIB_CUDA_CHECK(cudaEventCreate(&done));
  ASSERT_TRUE(cuda::wait_for_host(&words[0], 7, &words[1], 30.0, s).is_ok());
  NIB_CUDA_CHECK(cudaEventRecord(done, s));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(cudaEventQuery(done), cudaErrorNotReady);  // still waiting for the host
  __atomic_store_n(&words[0], 7u, __ATOMIC_RELEASE);
  NIB_CUDA_CHECK(cudaEventSynchronize(done));
  EXPECT_EQ(words[1], 0u);
  // A host that never writes: the wait gives up and says so.
  ASSERT_TRUE(cuda::wait_for_host(&words[0], 8, &words[1], 0.05, s).is_ok());
  NIB_CUDA_CHECK(cudaStreamSynchronize(s));
  EXPECT_EQ(__atomic_load_n(&words[1], __ATOMIC_ACQUIRE), 8u);
  cudaEventDestroy(done);
  cudaStreamDestroy(s);
  cudaFreeHost(words);
}

TEST(CudaSampler, DrawsTheCpuSamplersTokens) {
  NIB_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::test_seed("CudaSampler.DrawsTheCpuSamplersTokens");
  std::mt19937_64 rng(seed);
  for (const int64_t V : {int64_t{151936}, int64_t{1000}, int64_t{7}}) {
    struct Row {
      sampling::SamplingParams p;
      std::vector<int32_t> prompt, output, masked;
      sampling::DrawKey key;
    };
    std::vector<Row> rows;
    for (int i = 0; i < 48; ++i) {
      Row r;
      const int kind = i % 8;
      r.p.temperature = kind == 0 ? 0.0f : 0.3f + 0.2f * float(i % 5);
      // top-k alone up to 300: the short list takes k ≤ 64 (sampler.cu SHORT_K), the threshold searches the rest.
      if (kind == 2 || kind == 5) r.p.top_k = int32_t(1 + rng() % (kind == 2 ? 300 : 50));
      if (kind == 3 || kind == 5) r.p.top_p = 0.5f + 0.1f * float(i % 5);
      if (kind == 4) r.p.min_p = 0.05f;
      if (kind == 6) r.p.repetition_penalty = 1.3f, r.p.presence_penalty = 0.4f, r.p.frequency_penalty = 0.2f;
      if (kind == 7) r.p.top_k = 5, r.p.top_p = 0.9f, r.p.min_p = 0.01f, r.p.frequency_penalty = -0.3f;
      r.p.logprobs = i % 3 == 0 ? int32_t(rng() % 21) : -1;
      for (int j = 0; j < 20; ++j) r.prompt.push_back(int32_t(rng() % V));
      for (int j = 0; j < int(i % 9); ++j) r.output.push_back(int32_t(rng() % V));
      if (i % 4 == 1) r.masked = {int32_t(rng() % V), int32_t(rng() % V)};
      if (i % 5 == 2) {  // logit_bias: distinct tokens, in order; one may also be masked
        const int32_t a = int32_t(rng() % V), b = int32_t(rng() % V);
        if (a != b) r.p.logit_bias = {{std::min(a, b), 3.5f}, {std::max(a, b), -100.0f}};
        else r.p.logit_bias = {{a, 7.0f}};
        if (!r.masked.empty()) r.p.logit_bias.emplace_back(V, 1.0f);  // past the vocabulary: ignored
      }
      r.key = {rng(), rng() % 100000};
      rows.push_back(std::move(r));
    }
    const int64_t R = int64_t(rows.size());
    // Peaked logits (a few strong tokens) so top-p and min-p cut somewhere inside the vocabulary.
    std::vector<float> logits = test::random_f32(size_t(R * V), rng, 2.0f);
    for (int64_t r = 0; r < R; ++r)
      for (int j = 0; j < 5; ++j) logits[size_t(r * V + rng() % V)] += 6.0f;
    // Every third row (every kind in turn) on a grid of 1/4: many exact ties, which top-k and top-p
    // cut by index across the CTAs that hold the row.
    for (int64_t r = 2; r < R; r += 3)
      for (int64_t t = 0; t < V; ++t) logits[size_t(r * V + t)] = std::round(logits[size_t(r * V + t)] * 4.0f) / 4.0f;
    // Every other row's last output token is a pending id, as overlapped steps upload it: the token
    // the step before drew for some row j, read from `drawn` on the device.
    std::vector<cuda::SamplerRow> params;
    std::vector<int32_t> tokens, drawn(static_cast<size_t>(R));
    std::vector<float> biases;  // beside tokens: each logit_bias token's value
    for (int32_t& t : drawn) t = int32_t(rng() % V);
    for (const Row& r : rows) {
      cuda::SamplerRow g;
      g.temperature = r.p.temperature, g.top_k = r.p.top_k, g.top_p = r.p.top_p, g.min_p = r.p.min_p;
      g.repetition_penalty = r.p.repetition_penalty, g.presence_penalty = r.p.presence_penalty;
      g.frequency_penalty = r.p.frequency_penalty, g.seed = r.key.seed, g.position = r.key.position;
      g.logprobs = r.p.logprobs;
      g.prompt_offset = int32_t(tokens.size()), g.prompt_len = int32_t(r.prompt.size()), g.output_len = int32_t(r.output.size());
      tokens.insert(tokens.end(), r.prompt.begin(), r.prompt.end());
      tokens.insert(tokens.end(), r.output.begin(), r.output.end());
      if (!r.output.empty() && params.size() % 2 == 0) {
        const int64_t j = R - 1 - int64_t(params.size());  // a row of its own: drawn[j] is this row's
        drawn[size_t(j)] = r.output.back();
        tokens.back() = models::pending_token(j);
      }
      g.masked_offset = int32_t(tokens.size()), g.masked_len = int32_t(r.masked.size());
      tokens.insert(tokens.end(), r.masked.begin(), r.masked.end());
      g.bias_offset = int32_t(tokens.size()), g.bias_len = int32_t(r.p.logit_bias.size());
      biases.resize(tokens.size());
      for (const auto& [t, v] : r.p.logit_bias) tokens.push_back(t), biases.push_back(v);
      params.push_back(g);
    }
    test::DeviceBuffer<float> d_logits(logits), d_lp(static_cast<size_t>(R)), d_top_lp(static_cast<size_t>(R * cuda::MAX_TOP_LOGPROBS));
    test::DeviceBuffer<int32_t> d_tokens(tokens), d_drawn(drawn), d_out(static_cast<size_t>(R)), d_top(static_cast<size_t>(R * cuda::MAX_TOP_LOGPROBS));
    test::DeviceBuffer<cuda::SamplerRow> d_params(params);
    biases.resize(tokens.size());
    test::DeviceBuffer<float> d_biases(biases);
    const cuda::SamplerBatch b{R, V, d_logits.get(), d_params.get(), d_tokens.get(), d_drawn.get(),
                               d_out.get(), d_lp.get(), d_top.get(), d_top_lp.get(), d_biases.get()};
    ASSERT_TRUE(cuda::sample_rows(b, nullptr).is_ok());
    NIB_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<int32_t> got = d_out.to_host(), got_top = d_top.to_host();
    const std::vector<float> got_lp = d_lp.to_host(), got_top_lp = d_top_lp.to_host();
    for (int64_t r = 0; r < R; ++r) {
      const Row& row = rows[size_t(r)];
      const std::span<const float> l(logits.data() + r * V, size_t(V));
      const auto want = sampling::sample_next(l, row.p, {row.prompt, row.output, row.masked}, row.key);
      EXPECT_EQ(got[size_t(r)], want.token) << "vocab " << V << " row " << r << " (kind " << r % 8 << ")";
      if (row.p.logprobs < 0) continue;
      EXPECT_NEAR(got_lp[size_t(r)], want.logprob, 1e-5);
      for (size_t j = 0; j < want.top.size(); ++j) {
        EXPECT_EQ(got_top[size_t(r) * cuda::MAX_TOP_LOGPROBS + j], want.top[j].token) << "row " << r << " top " << j;
        EXPECT_NEAR(got_top_lp[size_t(r) * cuda::MAX_TOP_LOGPROBS + j], want.top[j].logprob, 1e-5);
      }
    }
  }
}

}  // namespace

// The phase report (NIBBLE_DIAG_PHASE_TIMING) from hand-made stamps, no GPU needed: a phase a CTA
// skipped (stamp 0) is timed in no CTA's median and the next phase runs from the CTA's latest
// stamp before it (the sampler's greedy steps printed −5.9e7 µs here when skipped phases kept an
// earlier launch's clock); a phase no CTA stamped is left out. 1 GHz: a cycle is a nanosecond.
TEST(PhaseReport, SkippedPhasesAreLeftOutNotNegative) {
  const char* names[5] = {"start", "load", "top-k", "draw", "unused"};
  const std::vector<long long> stamps = {100, 1100, 0,    4100, 0,   // CTA 0 skips the top-k
                                         200, 1200, 2200, 3200, 0};  // CTA 1 runs every phase
  const std::string report = cuda::format_phase_report("sampler", stamps, 2, 5, 1'000'000, names);
  EXPECT_NE(report.find(" load 1.00/1.00;"), std::string::npos) << report;
  EXPECT_NE(report.find(" top-k 1.00/1.00 (1 CTAs);"), std::string::npos) << report;
  EXPECT_NE(report.find(" draw 3.00/3.00;"), std::string::npos) << report;  // CTA 0: from its load, 3 µs
  EXPECT_EQ(report.find("unused"), std::string::npos) << report;
  EXPECT_EQ(report.find(" -"), std::string::npos) << report;  // no negative time
}

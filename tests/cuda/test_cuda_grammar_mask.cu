// Structured output on the GPU: the sampler's grammar masks draw the CPU sampler's tokens, bit for
// bit, on random masks (dense, sparse, one token, none) and batch shapes, greedy and sampled, with
// other processing mixed in; the stream's wait for a host-written word (host_wait.cuh), and a sampler
// queued behind it.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "cuda/common/device_context.cuh"
#include "cuda/sampling/host_wait.cuh"
#include "cuda/sampling/sampler.cuh"
#include "cuda_test_util.cuh"
#include "sampling/sampler.h"
#include "test_seed.h"

using namespace nibble;

namespace {

// First in the file, so that nothing has launched the sampler's kernel before: as the CUDA runner
// does, it is loaded ahead (prepare_sampler); its launch behind a wait for the host then returns at
// once, and the host can answer. (Loaded lazily at that launch, it waited for the device, which
// waited for the host: the first constrained step of a server stalled until the wait timed out.)
TEST(CudaGrammarMask, ASamplerQueuedBehindAHostWaitLeavesTheHostFree) {
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

TEST(CudaGrammarMask, SamplerDrawsTheCpuSamplersTokensUnderMasks) {
  NIB_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::test_seed("CudaGrammarMask.SamplerDrawsTheCpuSamplersTokensUnderMasks");
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

TEST(CudaGrammarMask, StreamWaitsForTheHostsWordAndTimesOut) {
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

}  // namespace

// Decode-attention benchmark: the attention half of one Qwen3-30B-A3B layer for one token (from the
// input norm's BF16 row to the o projection's fp32 output, the new K/V stored), as the kernel chain
// the runner runs (skinny q/k/v, qk_norm_rope_store, FlashInfer's graph-planned decode, skinny o_proj;
// W4A4: the norm's x̂ given, the o input quantized by linear_nvfp4), at each context of
// --attention-contexts. Random NVFP4 weights and KV caches in copies that together exceed twice the
// L2, so every launch reads HBM as in a model.
#include "tools/bench/bench_attention.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/common/device_context.cuh"
#include "cuda/attention/flashinfer_attention.cuh"
#include "cuda/nvfp4/quantize_nvfp4.cuh"
#include "cuda/gemm/skinny_gemm.cuh"
#include "cuda/ops/transformer_ops.cuh"
#include "formats/bf16.h"
#include "ref/ops.h"
#include "tools/bench/cuda_timing.h"

namespace nibble::tools {
namespace {

constexpr int64_t H = 2048, NH = 32, NKV = 4, D = 128, PAGE = 16;
constexpr int COPIES = 12;  // 12 × (10.6 MB of weights + the context's cache) > 2 × the 60 MB L2

// A random NVFP4 weight (upload_random_nvfp4) in the arena.
int upload_weight(int64_t rows, int64_t cols, std::mt19937_64& rng, cuda::DeviceArena& arena,
                  cuda::DeviceNvfp4Weight& w) {
  const size_t values = size_t(rows * cols);
  uint8_t *d_packed = nullptr, *d_scales = nullptr;
  if (!arena.alloc(d_packed, values / 2, "bench weights") || !arena.alloc(d_scales, values / 16, "bench weights"))
    return 1;
  if (upload_random_nvfp4(values, rng, d_packed, d_scales)) return 1;
  w = {d_packed, d_scales, rows, cols, 0.004f};
  return 0;
}

template <class T>
int upload(const std::vector<T>& host, cuda::DeviceArena& arena, T*& device) {
  if (!arena.alloc(device, host.size(), "bench data")) return 1;
  BENCH_CUDA(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return 0;
}

struct LayerCopy {
  cuda::DeviceNvfp4Weight q, k, v, o;
  uint16_t *k_cache = nullptr, *v_cache = nullptr;
};

}  // namespace

int run_bench_attention(const BenchKernelsOptions& o, cudaStream_t stream, nlohmann::json& rows) {
  std::vector<int64_t> contexts;
  std::stringstream list(o.attention_contexts);
  for (std::string item; std::getline(list, item, ',');) contexts.push_back(std::stoll(item));
  if (contexts.empty()) return 0;
  const int64_t max_ctx = *std::max_element(contexts.begin(), contexts.end());
  const int64_t pages = (max_ctx + PAGE - 1) / PAGE, kv_width = NKV * D;
  std::mt19937_64 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  cuda::DeviceArena arena;
  std::vector<LayerCopy> layers(COPIES);
  std::vector<uint16_t> cache_host(size_t(pages * PAGE * kv_width));
  for (LayerCopy& l : layers) {
    if (upload_weight(NH * D, H, rng, arena, l.q) || upload_weight(kv_width, H, rng, arena, l.k) ||
        upload_weight(kv_width, H, rng, arena, l.v) || upload_weight(H, NH * D, rng, arena, l.o))
      return 1;
    for (uint16_t** cache : {&l.k_cache, &l.v_cache}) {
      for (uint16_t& v : cache_host) v = formats::bf16_encode(normal(rng));
      if (upload(cache_host, arena, *cache)) return 1;
    }
  }
  std::vector<uint16_t> x_host(static_cast<size_t>(H)), norm_host(static_cast<size_t>(D));
  for (uint16_t& v : x_host) v = formats::bf16_encode(normal(rng));
  for (uint16_t& v : norm_host) v = formats::bf16_encode(1.0f + 0.1f * normal(rng));
  std::vector<int32_t> table(static_cast<size_t>(pages));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  uint16_t *x = nullptr, *x_hat = nullptr, *q_norm = nullptr, *k_norm = nullptr, *q_bf16 = nullptr, *attn = nullptr;
  uint16_t* o_hat = nullptr;
  float *inv_freq = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr, *row_scale = nullptr;
  float* o_row_scale = nullptr;
  int32_t* positions = nullptr;
  int64_t* slots = nullptr;
  if (upload(x_host, arena, x) || upload(norm_host, arena, q_norm) || upload(norm_host, arena, k_norm) ||
      upload(ref::rope_inv_freq(1e6, D), arena, inv_freq) || upload(std::vector<int32_t>{0}, arena, positions) ||
      upload(std::vector<int64_t>{0}, arena, slots))
    return 1;
  for (const Status& s : {arena.alloc(x_hat, size_t(H), "x̂"), arena.alloc(q_bf16, size_t(NH * D), "q"),
                          arena.alloc(attn, size_t(NH * D), "attn"), arena.alloc(o_hat, size_t(NH * D), "o x̂"),
                          arena.alloc(q, size_t(NH * D), "q"), arena.alloc(k, size_t(kv_width), "k"),
                          arena.alloc(v, size_t(kv_width), "v"), arena.alloc(out, size_t(H), "out"),
                          arena.alloc(row_scale, 1, "row scale"), arena.alloc(o_row_scale, 1, "row scale")})
    if (!s) {
      std::fprintf(stderr, "nibble bench kernels: %s\n", s.message().c_str());
      return 1;
    }
  auto fi = cuda::FlashInferAttention::create({NH, NKV, D, PAGE}, 1, 1, pages, arena);
  if (!fi) {
    std::fprintf(stderr, "nibble bench kernels: %s\n", fi.status().message().c_str());
    return 1;
  }
  const cuda::GemmContext gemm{stream, nullptr, nullptr, 0, o_hat, o_row_scale, size_t(NH * D)};
  const float x_input_scale = 4.0f / 2688.0f, o_input_scale = 3.0f / 2688.0f;

  std::printf(
      "\nattention half of a decode layer, Qwen3-30B-A3B (H=%lld, %lld/%lld heads of %lld), one token, norm output "
      "to o projection output\n",
      (long long)H, (long long)NH, (long long)NKV, (long long)D);
  std::printf("%-9s %7s %-26s %10s %9s %8s\n", "op", "context", "mode", "time(us)", "GB/s", "%floor");
  const double weight_bytes =
      double(NH * D + 2 * kv_width) * H * (0.5 + 1.0 / 16) + double(H) * NH * D * (0.5 + 1.0 / 16);
  for (int64_t ctx : contexts) {
    const int32_t position = int32_t(ctx - 1);
    const int64_t slot = int64_t{table[size_t(position / PAGE)]} * PAGE + position % PAGE;
    BENCH_CUDA(cudaMemcpy(positions, &position, 4, cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMemcpy(slots, &slot, 8, cudaMemcpyHostToDevice));
    (*fi)->clear();
    if (!(*fi)->add(1, ctx, table.data()) || !(*fi)->plan(true, stream)) return 1;
    const double bytes = weight_bytes + double(ctx) * kv_width * 2 * 2 + H * 2.0 + H * 4.0;
    const double floor = bytes / (o.hbm_tb_s * 1e12);
    for (formats::ActQuant mode : {formats::ActQuant::NONE, formats::ActQuant::STATIC, formats::ActQuant::PER_TOKEN}) {
      const bool w4a4 = mode != formats::ActQuant::NONE;
      if (w4a4 && !cuda::quantize_dequantize_activation_bf16(
                      x, 1, H, mode == formats::ActQuant::STATIC ? x_input_scale : 0.0f, x_hat, row_scale, stream))
        return 1;
      const uint16_t* in = w4a4 ? x_hat : x;
      bool ok = true;
      const double t = time_launches(
          [&](int c) {
            LayerCopy& l = layers[size_t(c)];
            const cuda::DeviceNvfp4Weight* qkv_w[3] = {&l.q, &l.k, &l.v};
            float* qkv_out[3] = {q, k, v};
            ok &= cuda::skinny_linear(in, 1, qkv_w, qkv_out, 3, w4a4 ? row_scale : nullptr, stream).is_ok();
            const cuda::QkvLayout layout{1, NH, NKV, D, positions, slots, inv_freq};
            ok &= cuda::qk_norm_rope_store({q, k, v}, layout, q_norm, k_norm, 1e-6f, nullptr, l.k_cache, l.v_cache,
                                           stream, q_bf16)
                      .is_ok();
            ok &= (*fi)->run(q_bf16, l.k_cache, l.v_cache, attn, stream).is_ok();
            ok &= cuda::linear_nvfp4(attn, 1, l.o, mode, o_input_scale, out, DenseKernel::SKINNY, gemm).is_ok();
          },
          COPIES, o.iterations, o.batches, stream);
      BENCH_CUDA(cudaStreamSynchronize(stream));
      if (!ok) {
        std::fprintf(stderr, "nibble bench kernels: attention context %lld failed\n", (long long)ctx);
        return 1;
      }
      std::printf("%-9s %7lld %-26s %10.2f %9.0f %7.0f%%\n", "attention", (long long)ctx,
                  bench_mode_label(mode).c_str(), t * 1e6, bytes / t / 1e9, 100.0 * floor / t);
      rows.push_back({{"op", "attention_decode"},
                      {"context", ctx},
                      {"mode", bench_mode_label(mode)},
                      {"time_us", t * 1e6},
                      {"gb_s", bytes / t / 1e9},
                      {"pct_floor", 100.0 * floor / t}});
    }
  }
  return 0;
}

}  // namespace nibble::tools

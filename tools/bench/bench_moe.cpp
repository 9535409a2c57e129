// MoE block benchmark: one model's MoE (Qwen3-30B-A3B: E = 128, k = 8, H = 2048, I = 768) end to
// end, from BF16 hidden states through the router, grouping, gate_up+SwiGLU, down and combine to the fp32
// output. Random NVFP4 experts in two copies and eight different inputs (so each launch routes to
// other experts and the touched weights exceed L2), a CUDA graph per batch for the fused backend
// (cublas reads expert counts back and is issued directly). The floor counts the weight
// bytes of the experts actually routed to, plus x and the output. --router-skew gives the routing a
// trained model's uneven loads (tools/router_skew.h).
#include "tools/bench/bench_moe.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/moe/moe.cuh"
#include "cuda/nvfp4/nvfp4_layout.h"
#include "cuda/moe/moe_decode.cuh"
#include "formats/bf16.h"
#include "tools/bench/cuda_timing.h"
#include "tools/router_skew.h"

namespace nibble::tools {
namespace {

constexpr int WEIGHT_COPIES = 2, INPUT_COPIES = 8;

struct DeviceExperts {
  uint8_t *packed = nullptr, *scales = nullptr;
  float* global = nullptr;
  std::vector<float> host_global;
};

int upload_experts(int64_t E, int64_t rows, int64_t cols, std::mt19937_64& rng, DeviceExperts& d) {
  const size_t values = size_t(E * rows * cols);
  d.host_global.assign(size_t(E), 0.004f);
  BENCH_CUDA(cudaMalloc(&d.packed, values / 2));
  BENCH_CUDA(cudaMalloc(&d.scales, values / 16));
  BENCH_CUDA(cudaMalloc(&d.global, E * sizeof(float)));
  if (upload_random_nvfp4(values, rng, d.packed, d.scales, cuda::expert_line_order(cols))) return 1;
  BENCH_CUDA(cudaMemcpy(d.global, d.host_global.data(), E * sizeof(float), cudaMemcpyHostToDevice));
  return 0;
}

}  // namespace

int run_bench_moe(const BenchKernelsOptions& o, const MoeShape& shape, cudaStream_t stream, cublasHandle_t cublas,
                  nlohmann::json& rows) {
  const int64_t E = shape.experts, TOP_K = shape.top_k, H = shape.hidden, I = shape.intermediate;
  std::vector<int64_t> token_counts;
  std::stringstream list(o.moe_tokens);
  for (std::string item; std::getline(list, item, ',');) token_counts.push_back(std::stoll(item));
  if (token_counts.empty()) return 0;
  const int64_t max_tokens = *std::max_element(token_counts.begin(), token_counts.end());
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);

  std::vector<DeviceExperts> gate(WEIGHT_COPIES), up(WEIGHT_COPIES), down(WEIGHT_COPIES);
  std::vector<cuda::DeviceMoeWeights> weights(WEIGHT_COPIES);
  // Inputs: isotropic normals, or with --router-skew normals plus a common direction (as hidden states
  // have) against which the router is placed for Zipf loads.
  const bool skewed = o.router_skew >= 0;
  std::vector<float> common(size_t(H), 0.0f);
  if (skewed)
    for (float& v : common) v = 0.5f * normal(rng);
  auto draw_inputs = [&](int64_t n) {
    std::vector<float> xs(size_t(n * H));
    for (size_t i = 0; i < xs.size(); ++i) xs[i] = normal(rng) + common[i % size_t(H)];
    return xs;
  };
  std::vector<uint16_t> router_host(size_t(E * H));
  std::vector<double> shares;
  if (skewed) {
    const std::vector<float> calibration = draw_inputs(4096);
    shares = zipf_shares(E, TOP_K, o.router_skew, 1);
    const PlacedRouter placed = place_router(calibration.data(), 4096, H, shares, TOP_K, 1);
    for (size_t i = 0; i < router_host.size(); ++i) router_host[i] = formats::bf16_encode(placed.rows[i]);
  } else {
    for (uint16_t& v : router_host) v = formats::bf16_encode(0.02f * normal(rng));
  }
  uint16_t* router = nullptr;
  BENCH_CUDA(cudaMalloc(&router, router_host.size() * 2));
  BENCH_CUDA(cudaMemcpy(router, router_host.data(), router_host.size() * 2, cudaMemcpyHostToDevice));
  for (int c = 0; c < WEIGHT_COPIES; ++c) {
    if (upload_experts(E, I, H, rng, gate[c]) || upload_experts(E, I, H, rng, up[c]) ||
        upload_experts(E, H, I, rng, down[c]))
      return 1;
    cuda::DeviceMoeWeights& w = weights[c];
    w.router = router;
    w.experts = E, w.top_k = TOP_K, w.hidden = H, w.intermediate = I;
    w.gate = {gate[c].packed, gate[c].scales, gate[c].global, E, I, H};
    w.up = {up[c].packed, up[c].scales, up[c].global, E, I, H};
    w.down = {down[c].packed, down[c].scales, down[c].global, E, H, I};
    w.gate_scales = gate[c].host_global, w.up_scales = up[c].host_global, w.down_scales = down[c].host_global;
    w.gate_up_input_scale = 5.0f / 2688.0f, w.down_input_scale = 1.0f / 2688.0f;
  }
  std::vector<uint16_t*> x(INPUT_COPIES);
  std::vector<uint16_t> x_host(size_t(max_tokens * H));
  RoutingStats routing;  // of the first copy's tokens
  for (auto& p : x) {
    const std::vector<float> xs = draw_inputs(max_tokens);
    for (size_t i = 0; i < xs.size(); ++i) x_host[i] = formats::bf16_encode(xs[i]);
    if (skewed && &p == &x[0]) {
      std::vector<float> router_rows(router_host.size()), rounded(xs.size());
      for (size_t i = 0; i < router_rows.size(); ++i) router_rows[i] = formats::bf16_decode(router_host[i]);
      for (size_t i = 0; i < xs.size(); ++i) rounded[i] = formats::bf16_decode(x_host[i]);
      routing = routing_stats(top_k_experts(rounded.data(), max_tokens, H, router_rows.data(), E, TOP_K), TOP_K, E, 0);
    }
    BENCH_CUDA(cudaMalloc(&p, x_host.size() * 2));
    BENCH_CUDA(cudaMemcpy(p, x_host.data(), x_host.size() * 2, cudaMemcpyHostToDevice));
  }
  float* out = nullptr;
  BENCH_CUDA(cudaMalloc(&out, size_t(max_tokens * H) * sizeof(float)));
  auto ws = cuda::MoeWorkspace::create(weights[0], max_tokens, true);
  if (!ws) {
    std::fprintf(stderr, "nibble bench kernels: %s\n", ws.status().message().c_str());
    return 1;
  }

  std::printf("\nMoE block %s (E=%lld, k=%lld, H=%lld, I=%lld), router to combined output\n", shape.label, (long long)E,
              (long long)TOP_K, (long long)H, (long long)I);
  if (skewed) {
    const RoutingStats target = share_stats(shares);
    std::printf(
        "routing: Zipf s = %.2f: top expert %.1f%% of picks (target %.1f%%), %.0f%% of experts for 90%% (%.0f%%), "
        "concentration %.3f (%.3f), over %lld tokens\n",
        o.router_skew, 100 * routing.top_share, 100 * target.top_share, 100 * routing.coverage_90,
        100 * target.coverage_90, routing.concentration, target.concentration, (long long)max_tokens);
  }
  std::printf("%-6s %6s %-30s %10s %9s %9s %8s %8s %16s\n", "op", "T", "backend/mode", "time(us)", "GB/s", "TFLOP/s",
              "%floor", "experts", "vs cublas");
  const double expert_bytes = 3.0 * I * H * (0.5 + 1.0 / 16);
  for (int64_t tokens : token_counts) {
    // Experts routed to (the floor's weight bytes), from one run's grouping.
    Status s = cuda::moe_forward(weights[0], **ws,
                                 {.x = x[0],
                                  .tokens = tokens,
                                  .mode = formats::ActQuant::NONE,
                                  .kernel = MoeKernel::GROUPED_MMA,
                                  .out = out,
                                  .stream = stream,
                                  .cublas = cublas});
    if (!s) {
      std::fprintf(stderr, "nibble bench kernels: moe T=%lld: %s\n", (long long)tokens, s.message().c_str());
      return 1;
    }
    std::vector<int32_t> offsets(size_t(E + 1));
    BENCH_CUDA(cudaMemcpyAsync(offsets.data(), (*ws)->groups.expert_offsets, offsets.size() * 4, cudaMemcpyDeviceToHost,
                               stream));
    BENCH_CUDA(cudaStreamSynchronize(stream));
    int active = 0;
    for (int64_t e = 0; e < E; ++e) active += offsets[e + 1] > offsets[e];
    const double flops = 2.0 * tokens * TOP_K * 3 * H * I;
    const double bytes = active * expert_bytes + tokens * H * (2.0 + 4.0);
    const double floor = std::max(bytes / (o.hbm_tb_s * 1e12), flops / (o.bf16_tflops * 1e12));
    double t_baseline = 0;
    std::vector<MoeKernel> backends = moe_kernels_to_time(o.moe_backend);
    if (o.moe_backend == "all") backends.push_back(MoeKernel::AUTO);  // the one-launch block at T = 1
    std::stable_partition(backends.begin(), backends.end(), [](MoeKernel b) {
      return b == MoeKernel::CUBLAS;  // first: the other rows compare to it
    });
    for (MoeKernel backend : backends)
      for (formats::ActQuant mode :
           {formats::ActQuant::NONE, formats::ActQuant::STATIC, formats::ActQuant::PER_TOKEN}) {
        bool ok = true;
        const double t = time_launches(
            [&](int c) {
              ok &= cuda::moe_forward(weights[c % WEIGHT_COPIES], **ws,
                                      {.x = x[c % INPUT_COPIES],
                                       .tokens = tokens,
                                       .mode = mode,
                                       .kernel = backend,
                                       .out = out,
                                       .stream = stream,
                                       .cublas = cublas})
                        .is_ok();
            },
            INPUT_COPIES, o.iterations, o.batches, stream, backend != MoeKernel::CUBLAS);
        BENCH_CUDA(cudaStreamSynchronize(stream));
        if (!ok) {
          std::fprintf(stderr, "nibble bench kernels: moe T=%lld %s failed\n", (long long)tokens,
                       bench_mode_label(mode).c_str());
          return 1;
        }
        if (backend == MoeKernel::CUBLAS && mode == formats::ActQuant::NONE) t_baseline = t;
        const std::string label = std::string(kernel_name(backend)) + "/" + bench_mode_label(mode);
        char versus[32] = "-";
        if (t_baseline > 0) std::snprintf(versus, sizeof versus, "%.2fx", t_baseline / t);
        std::printf("%-6s %6lld %-30s %10.2f %9.0f %9.1f %7.0f%% %8d %17s\n", "moe", (long long)tokens, label.c_str(),
                    t * 1e6, bytes / t / 1e9, flops / t / 1e12, 100.0 * floor / t, active, versus);
        if (backend == MoeKernel::AUTO && tokens == 1)  // the block's phases in each mode
          if (const std::string phases = cuda::moe_decode_block_timing(H); !phases.empty())
            std::printf("%s\n", phases.c_str());
        rows.push_back({{"op", "moe"},
                        {"shape", shape.label},
                        {"tokens", tokens},
                        {"backend", kernel_name(backend)},
                        {"mode", bench_mode_label(mode)},
                        {"time_us", t * 1e6},
                        {"gb_s", bytes / t / 1e9},
                        {"tflops", flops / t / 1e12},
                        {"pct_floor", 100.0 * floor / t},
                        {"experts_active", active},
                        {"router_skew", o.router_skew}});
      }
  }
  for (int c = 0; c < WEIGHT_COPIES; ++c)
    for (DeviceExperts* d : {&gate[c], &up[c], &down[c]}) cudaFree(d->packed), cudaFree(d->scales), cudaFree(d->global);
  for (uint16_t* p : x) cudaFree(p);
  cudaFree(out), cudaFree(router);
  return 0;
}

}  // namespace nibble::tools

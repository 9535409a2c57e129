// Random MoE problems for the GPU MoE tests: Qwen3-style shapes, NVFP4 expert weights with random
// codes and E4M3 block scales (subnormal, zero and negative scales included), a router of uneven row
// scales; the reference's view of them and the device's (repacked as the model loads them).
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cuda/moe/moe.cuh"
#include "cuda/nvfp4/nvfp4_layout.h"
#include "cuda_test_util.cuh"
#include "formats/bf16.h"
#include "ref/moe.h"

namespace nibble::test {

struct Config {
  int64_t experts, top_k, hidden, intermediate;
};
inline constexpr Config QWEN3_30B{128, 8, 2048, 768};

struct HostProjection {
  std::vector<uint8_t> packed, scales;
  std::vector<float> global;
  int64_t cols = 0;  // in_features: expert weights repack in line order where expert_line_order(cols)
};

struct Problem {
  Config c;
  std::vector<uint16_t> router;
  HostProjection gate, up, down;
  ref::MoeWeights ref;
};

inline HostProjection random_projection(int64_t experts, int64_t rows, int64_t cols, std::mt19937_64& rng) {
  HostProjection p;
  p.cols = cols;
  p.packed.resize(size_t(experts * rows * cols / 2));
  p.scales.resize(size_t(experts * rows * cols / 16));
  for (size_t i = 0; i < p.packed.size(); i += 8) {
    const uint64_t bits = rng();
    for (size_t b = 0; b < 8 && i + b < p.packed.size(); ++b) p.packed[i + b] = uint8_t(bits >> (8 * b));
  }
  // Mostly E4M3 0x30..0x40 (0.5 … 2); one block in 16 anywhere in 0x01..0x2F, E4M3 subnormals included;
  // one in 256 a zero or negative scale, which the GPU layout folds into the codes (nvfp4_layout.h).
  for (uint8_t& s : p.scales) {
    s = rng() % 16 ? uint8_t(0x30 + rng() % 17) : uint8_t(1 + rng() % 0x2F);
    if (rng() % 256 == 0) s = rng() % 2 ? uint8_t(0x80 * (rng() % 2)) : uint8_t(s | 0x80);
  }
  std::uniform_real_distribution<float> spread(0.5f, 2.0f);
  for (int64_t e = 0; e < experts; ++e) p.global.push_back(0.004f * spread(rng) / std::sqrt(float(cols) / 768.0f));
  return p;
}

inline Problem make_problem(const Config& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Problem p;
  p.c = c;
  p.router.resize(size_t(c.experts * c.hidden));
  for (int64_t e = 0; e < c.experts; ++e) {
    const float row_scale = 0.02f * std::exp(0.5f * normal(rng));  // uneven routing
    for (int64_t h = 0; h < c.hidden; ++h) p.router[e * c.hidden + h] = formats::bf16_encode(row_scale * normal(rng));
  }
  p.gate = random_projection(c.experts, c.intermediate, c.hidden, rng);
  p.up = random_projection(c.experts, c.intermediate, c.hidden, rng);
  p.down = random_projection(c.experts, c.hidden, c.intermediate, rng);
  p.ref.router = p.router.data();
  p.ref.n_experts = c.experts, p.ref.top_k = c.top_k, p.ref.hidden = c.hidden, p.ref.intermediate = c.intermediate;
  auto view = [](const HostProjection& h, int64_t e, int64_t rows, int64_t cols) {
    ref::LinearWeight w;
    w.out_features = rows, w.in_features = cols;
    w.nvfp4 = {h.packed.data() + e * rows * cols / 2, h.scales.data() + e * rows * cols / 16, rows, cols, h.global[e]};
    return w;
  };
  for (int64_t e = 0; e < c.experts; ++e)
    p.ref.experts.push_back({view(p.gate, e, c.intermediate, c.hidden), view(p.up, e, c.intermediate, c.hidden),
                             view(p.down, e, c.hidden, c.intermediate)});
  return p;
}

struct DeviceProjection {
  test::DeviceNvfp4 weights;
  test::DeviceBuffer<float> global;
  explicit DeviceProjection(const HostProjection& h)
      : weights(h.packed, h.scales, cuda::expert_line_order(h.cols)), global(h.global) {}
  cuda::DeviceNvfp4Experts view(int64_t experts, int64_t rows, int64_t cols) {
    return {weights.packed.get(), weights.scales.get(), global.get(), experts, rows, cols};
  }
};

// A problem's weights on the device, and the DeviceMoeWeights view of them.
struct DeviceProblem {
  DeviceProjection gate, up, down;
  test::DeviceBuffer<uint16_t> router;
  cuda::DeviceMoeWeights w;
  explicit DeviceProblem(const Problem& p) : gate(p.gate), up(p.up), down(p.down), router(p.router) {
    const Config& c = p.c;
    w.router = router.get();
    w.experts = c.experts, w.top_k = c.top_k, w.hidden = c.hidden, w.intermediate = c.intermediate;
    w.gate = gate.view(c.experts, c.intermediate, c.hidden);
    w.up = up.view(c.experts, c.intermediate, c.hidden);
    w.down = down.view(c.experts, c.hidden, c.intermediate);
    w.gate_scales = p.gate.global, w.up_scales = p.up.global, w.down_scales = p.down.global;
  }
};

}  // namespace nibble::test

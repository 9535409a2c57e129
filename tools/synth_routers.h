// `nibble synth --router-skew S`: after the checkpoint is written, a CPU forward over seeded random
// tokens places each MoE layer's router against the hidden states it sees (tools/router_skew.h), layer
// by layer, and writes the placed rows over the checkpoint's router tensors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/model_config.h"
#include "tools/fast_random.h"
#include "tools/router_skew.h"

namespace nibble::models {
class Model;
}

namespace nibble::tools {

struct LayerRouting {
  int64_t layer = 0;
  RoutingStats target;    // of the Zipf shares asked for
  RoutingStats held_out;  // measured on the calibration tokens the fit did not see
  double fit_error = 0;   // PlacedRouter::fit_error on the tokens it saw
};

// Zipf exponent s ≥ 0 (0: uniform); `tokens` calibration tokens in sequences of 128, alternately
// fitted and held out. Qwen3-MoE's BF16 routers only (ERNIE's fp32 router chooses with a bias too).
Result<std::vector<LayerRouting>> place_synth_routers(const std::string& dir, double s, uint64_t seed, int64_t tokens);

// One forward of `model` (of `config`) over `sequences` sequences of `tokens_each` tokens drawn from
// `rng`, as one batch: the calibration forward here, and the forwards that measure routing.
Status forward_random_tokens(models::Model& model, const io::ModelConfig& config, int64_t sequences,
                             int64_t tokens_each, FastRandom& rng);

}  // namespace nibble::tools

// A model's RoPE table from its config: the default frequencies, divided by a linear factor, or
// YaRN's blend of interpolated and original ones with its attention factor.
#pragma once

#include "io/model_config.h"
#include "ref/ops.h"

namespace nibble::models {

// transformers 5.24 (modeling_rope_utils.py: _compute_default_rope_parameters,
// _compute_linear_scaling_rope_parameters, _compute_yarn_parameters), in fp32 as it computes them.
ref::Rope rope_for(const io::ModelConfig& config);

}  // namespace nibble::models

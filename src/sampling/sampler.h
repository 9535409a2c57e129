// Token sampling on the CPU: greedy (temperature 0) and temperature sampling with a seeded
// generator. Filters (top-k/top-p/min-p, penalties) build on this in the serving engine.
#pragma once

#include <cstdint>
#include <random>
#include <span>

namespace nibble::sampling {

// The highest logit's index; the lowest index among equal maxima (as torch.argmax).
int32_t argmax(std::span<const float> logits);

// temperature == 0: argmax; otherwise a draw from softmax(logits / temperature).
int32_t sample(std::span<const float> logits, float temperature, std::mt19937_64& rng);

}  // namespace nibble::sampling

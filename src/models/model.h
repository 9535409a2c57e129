// The Model interface: one forward step over a mixed batch, returning the logits asked for.
// Implementations are registered by Hugging Face architecture name (registry.cpp).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/collectives.h"
#include "core/status.h"
#include "formats/nvfp4.h"
#include "io/binding.h"
#include "models/batch.h"
#include "models/kv_cache.h"

namespace nibble::models {

// Called with the input of every Linear (module name as in the checkpoint, rows × width) before
// it is used; `nibble quantize` calibrates input_scale with it.
using LinearInputObserver = std::function<void(const std::string& module, const float* x, int64_t rows, int64_t width)>;

// Called with each MoE layer's router input (rows × width, in forward order) before it routes; rows
// it returns ([experts, width]) replace that layer's router from then on (rounded to the router's
// dtype). `nibble synth --router-skew` places synthetic routers against real hidden states with it.
using RouterPlacer = std::function<std::vector<float>(int64_t layer, const float* x, int64_t rows, int64_t width)>;
// Called with each MoE layer's routing (expert ids [rows, top_k], in forward order): `nibble bench
// routing` reports the loads a checkpoint's routers give.
using RoutingObserver = std::function<void(int64_t layer, const int32_t* expert_ids, int64_t rows, int64_t top_k)>;

struct ModelOptions {
  formats::ActQuant act_quant_moe = formats::ActQuant::NONE;
  formats::ActQuant act_quant_dense = formats::ActQuant::NONE;
  LinearInputObserver input_observer;
  // Round to BF16 wherever the GPU forward stores BF16 (every GEMM input, the MoE's SwiGLU output
  // in W4A16 and its expert outputs), so the GPU can be checked against the CPU tightly.
  bool gpu_rounding = false;
  // This model is one rank of a tensor- or expert-parallel group (its checkpoint holds the rank's
  // slices): the partial results meet through these collectives, which outlive the model.
  Collectives* collectives = nullptr;
  RouterPlacer router_placer;        // (the CPU backend)
  RoutingObserver routing_observer;  // (the CPU backend)
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const io::ModelConfig& config() const = 0;
  // Runs one step: stores the batch's K/V into `cache`, writes the logits of batch.logits_rows
  // ([rows, vocab], fp32) to `logits`. Bad batches (token ids out of range, too few KV blocks)
  // are errors, not crashes.
  virtual Status forward(const Batch& batch, KvCache& cache, std::vector<float>& logits) = 0;
};

// Builds the model for a loaded checkpoint's architecture; the checkpoint must outlive the model.
Result<std::unique_ptr<Model>> create_model(std::shared_ptr<const io::LoadedCheckpoint> checkpoint,
                                            const ModelOptions& options);

}  // namespace nibble::models

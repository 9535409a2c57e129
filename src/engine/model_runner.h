// What the engine needs from a backend: run a step over the KV cache it owns, and swap in new
// weights of the same shapes. The CPU runner wraps the reference model; the CUDA runner will
// implement the same interface, so the engine never knows which one it drives.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/model_config.h"
#include "models/batch.h"
#include "models/kv_cache.h"
#include "models/model.h"

namespace nibble::engine {

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual const io::ModelConfig& config() const = 0;
  virtual int64_t n_kv_blocks() const = 0;
  virtual int64_t block_size() const = 0;
  // Logits of batch.logits_rows, [rows, vocab] fp32.
  virtual Status forward(const models::Batch& batch, std::vector<float>& logits) = 0;
  // Loads the checkpoint at `path`; it must have the same architecture and tensor shapes, else an
  // error and the current weights stay. The KV cache is kept (the engine decides whether to flush).
  virtual Status replace_weights(const std::string& path) = 0;
};

struct CpuRunnerOptions {
  models::ModelOptions model;
  int64_t n_kv_blocks = 0;
  int64_t block_size = 16;
  models::KvDtype kv_dtype = models::KvDtype::BF16;
};

Result<std::unique_ptr<ModelRunner>> create_cpu_runner(const std::string& path, const CpuRunnerOptions& options);

}  // namespace nibble::engine

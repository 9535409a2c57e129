// The CPU runner: the reference model over a CPU KV cache.
#include "engine/model_runner.h"

#include "io/binding.h"

namespace nibble::engine {
namespace {

class CpuRunner : public ModelRunner {
 public:
  CpuRunner(std::shared_ptr<const io::LoadedCheckpoint> checkpoint, std::unique_ptr<models::Model> model,
            const CpuRunnerOptions& options)
      : options_(options), checkpoint_(std::move(checkpoint)), model_(std::move(model)),
        cache_(model_->config(), options.n_kv_blocks, options.block_size, options.kv_dtype) {}

  const io::ModelConfig& config() const override { return model_->config(); }
  int64_t n_kv_blocks() const override { return cache_.n_blocks(); }
  int64_t block_size() const override { return cache_.block_size(); }

  Status forward(const models::Batch& batch, std::vector<float>& logits) override {
    return model_->forward(batch, cache_, logits);
  }

  Status replace_weights(const std::string& path) override {
    auto loaded = io::load_checkpoint(path);
    if (!loaded) return loaded.status();
    std::shared_ptr<const io::LoadedCheckpoint> checkpoint = std::move(loaded.value());
    NIB_RETURN_IF_ERROR(io::check_same_layout(checkpoint_->bound, checkpoint->bound));
    auto model = models::create_model(checkpoint, options_.model);
    if (!model) return model.status();
    model_ = std::move(model.value());
    checkpoint_ = std::move(checkpoint);
    return Status::ok();
  }

 private:
  CpuRunnerOptions options_;
  std::shared_ptr<const io::LoadedCheckpoint> checkpoint_;
  std::unique_ptr<models::Model> model_;
  models::KvCache cache_;
};

}  // namespace

Result<std::unique_ptr<ModelRunner>> create_cpu_runner(const std::string& path, const CpuRunnerOptions& options) {
  if (options.n_kv_blocks <= 0 || options.block_size <= 0) return Status::error("the KV cache needs blocks");
  auto loaded = io::load_checkpoint(path);
  if (!loaded) return loaded.status();
  std::shared_ptr<const io::LoadedCheckpoint> checkpoint = std::move(loaded.value());
  auto model = models::create_model(checkpoint, options.model);
  if (!model) return model.status();
  return std::unique_ptr<ModelRunner>(new CpuRunner(std::move(checkpoint), std::move(model.value()), options));
}

}  // namespace nibble::engine

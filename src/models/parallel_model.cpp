// ParallelModel (parallel_model.h): rank 0 runs on the caller's thread, ranks 1..n-1 on their own,
// each step handed to all at once; a rank that fails stops the group so that no rank waits forever in
// a collective, and the group is reset for the next step.
#include "models/parallel_model.h"

#include <condition_variable>
#include <mutex>
#include <thread>

#include "core/collectives.h"

namespace nibble::models {

std::string rank_layout_key(const io::LoadedCheckpoint& c) {
  const io::ModelConfig& m = c.bound.config;
  std::string key = m.architecture + "/" + std::to_string(m.num_hidden_layers) + "/" + std::to_string(m.hidden_size) +
                    "/" + std::to_string(m.vocab_size) + "/" + std::to_string(m.num_experts) + "/" +
                    std::to_string(c.bound.quant.nvfp4);
  for (const io::ModuleSpec& s : io::plan_modules(m, c.bound.quant)) {
    key += ";" + s.name + (s.quantized ? "q" : "");
    for (int64_t d : s.shape) key += "," + std::to_string(d);
  }
  return key;
}

namespace {

class ParallelModel final : public Model {
 public:
  explicit ParallelModel(int64_t size) : group_(size) {}
  ~ParallelModel() override {
    {
      std::lock_guard lock(mutex_);
      quit_ = true;
    }
    start_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  Status init(const std::string& path, const io::ConfigOverrides& overrides, const io::ParallelConfig& group,
              const ModelOptions& options) {
    const int64_t n = group_.size();
    for (int64_t r = 0; r < n; ++r) {
      io::ParallelConfig rank = group;
      rank.rank = r;
      auto loaded = io::load_checkpoint(path, overrides, rank);
      if (!loaded) return loaded.status();
      Rank& k = ranks_.emplace_back();
      k.checkpoint = std::move(loaded.value());
      k.collectives = group_.rank(r);
      if (rank_layout_key(*k.checkpoint) != rank_layout_key(*ranks_[0].checkpoint))
        return Status::error("rank " + std::to_string(r) + " read a different checkpoint layout from " + path +
                             " than rank 0 (was it replaced while loading?)");
      ModelOptions o = options;
      o.collectives = k.collectives.get();
      auto model = create_model(k.checkpoint, o);
      if (!model) return model.status();
      k.model = std::move(model.value());
      const io::LinearWeights& k_proj = k.checkpoint->bound.linears.at("model.layers.0.self_attn.k_proj");
      k.kv_heads = k_proj.module.shape[0] / k.checkpoint->bound.config.head_dim;
    }
    for (int64_t r = 1; r < n; ++r) threads_.emplace_back([this, r] { serve(r); });
    return Status::ok();
  }

  const io::ModelConfig& config() const override { return ranks_[0].model->config(); }

  Status forward(const Batch& batch, KvCache& cache, std::vector<float>& logits) override {
    for (Rank& k : ranks_) {
      if (!k.cache || k.cache->n_blocks() != cache.n_blocks() || k.cache->block_size() != cache.block_size() ||
          k.cache->dtype() != cache.dtype())
        k.cache = std::make_unique<KvCache>(config(), cache.n_blocks(), cache.block_size(), cache.dtype(), k.kv_heads);
    }
    {
      std::lock_guard lock(mutex_);
      batch_ = &batch, running_ = static_cast<int64_t>(ranks_.size()) - 1, ++step_;
    }
    start_.notify_all();
    run(0, logits);
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return running_ == 0; });
    Status first;
    for (Rank& k : ranks_)
      if (!k.status && first) first = k.status;
    if (!first) group_.reset();  // every rank has returned: the group may meet again
    return first;
  }

 private:
  struct Rank {
    std::shared_ptr<const io::LoadedCheckpoint> checkpoint;
    std::unique_ptr<Collectives> collectives;
    std::unique_ptr<Model> model;
    std::unique_ptr<KvCache> cache;
    int64_t kv_heads = 0;
    std::vector<float> logits;  // ranks 1..n-1 (every rank computes the same)
    Status status;
  };

  void run(int64_t r, std::vector<float>& logits) {
    Rank& k = ranks_[static_cast<size_t>(r)];
    k.status = k.model->forward(*batch_, *k.cache, logits);
    if (!k.status) group_.stop("rank " + std::to_string(r) + ": " + k.status.message());
  }

  void serve(int64_t r) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        start_.wait(lock, [&] { return quit_ || step_ != seen; });
        if (quit_) return;
        seen = step_;
      }
      run(r, ranks_[static_cast<size_t>(r)].logits);
      std::lock_guard lock(mutex_);
      if (--running_ == 0) done_.notify_all();
    }
  }

  HostGroup group_;
  std::vector<Rank> ranks_;
  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable start_, done_;
  const Batch* batch_ = nullptr;
  uint64_t step_ = 0;
  int64_t running_ = 0;
  bool quit_ = false;
};

}  // namespace

Result<std::unique_ptr<Model>> create_parallel_model(const std::string& path, const io::ConfigOverrides& overrides,
                                                     const io::ParallelConfig& group, const ModelOptions& options) {
  if (group.size < 1 || group.size > 64)
    return Status::error("--tensor-parallel-size " + std::to_string(group.size) + " is not in 1..64");
  auto model = std::make_unique<ParallelModel>(group.size);
  NIB_RETURN_IF_ERROR(model->init(path, overrides, group, options));
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace nibble::models

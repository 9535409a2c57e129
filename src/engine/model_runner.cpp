// The runner factory and the CPU runner: the reference model over a CPU KV cache, sampling each row
// with the CPU sampler (in parallel: a draw depends only on its row's logits, seed and position).
#include "engine/model_runner.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <sstream>

#include "core/env.h"
#include "core/log.h"
#include "core/parallel.h"
#include "engine/cuda_runner.h"
#include "io/binding.h"
#include "models/kv_cache.h"
#include "models/model.h"
#include "models/parallel_model.h"

namespace nibble::engine {
namespace {

// MemAvailable from /proc/meminfo (bytes), or 0 when it cannot be read.
uint64_t available_host_memory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (meminfo >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

// The model of a checkpoint: one rank's, or a parallel group's (which loads its ranks' slices itself).
using ModelFactory =
    std::function<Result<std::unique_ptr<models::Model>>(std::shared_ptr<const io::LoadedCheckpoint>)>;

class CpuRunner : public ModelRunner {
 public:
  CpuRunner(std::shared_ptr<const io::LoadedCheckpoint> checkpoint, std::unique_ptr<models::Model> model,
            ModelFactory make_model, int64_t n_blocks, int64_t block_size, models::KvDtype kv_dtype)
      : make_model_(std::move(make_model)),
        checkpoint_(std::move(checkpoint)),
        model_(std::move(model)),
        cache_(model_->config(), n_blocks, block_size, kv_dtype) {}

  const io::ModelConfig& config() const override { return model_->config(); }
  int64_t n_kv_blocks() const override { return cache_.n_blocks(); }
  int64_t block_size() const override { return cache_.block_size(); }
  std::string describe() const override {
    const models::KvDtype d = cache_.dtype();
    return std::string("cpu (reference, ") +
           (d == models::KvDtype::BF16  ? "bf16"
            : d == models::KvDtype::FP8 ? "fp8"
                                        : "fp32") +
           " KV)";
  }

  Status forward_logits(const models::Batch& batch, std::vector<float>& logits) override {
    return model_->forward(batch, cache_, logits);
  }

  // The CPU computes at launch; collect hands the tokens over. Pending ids resolve from the tokens
  // of the step launched before (kept in drawn_).
  Status launch(const models::Batch& batch, std::span<const SampleRow> rows) override {
    if (rows.size() != batch.logits_rows.size()) return Status::error("launch: one sample row per logits row");
    if (n_uncollected_ == 2) return Status::error("launch: two steps are already uncollected");
    const bool pending = std::any_of(batch.token_ids.begin(), batch.token_ids.end(), models::is_pending_token);
    const models::Batch* run = &batch;
    if (pending) {
      resolved_batch_ = batch;
      for (int32_t& id : resolved_batch_.token_ids) NIB_RETURN_IF_ERROR(resolve(id));
      run = &resolved_batch_;
    }
    // Token lists the sampler reads (the penalties' prompt and output, the mask) that hold pending
    // ids, resolved into copies (their buffers stay put as `lists` grows: it was reserved).
    std::vector<std::vector<int32_t>> lists;
    lists.reserve(3 * rows.size());
    std::vector<SampleRow> resolved(rows.begin(), rows.end());
    for (SampleRow& row : resolved) {
      const bool penalties = row.params->has_penalties();
      for (std::span<const int32_t>* list : {&row.context.prompt, &row.context.output, &row.context.masked}) {
        if (list != &row.context.masked && !penalties) continue;
        if (std::none_of(list->begin(), list->end(), models::is_pending_token)) continue;
        std::vector<int32_t>& copy = lists.emplace_back(list->begin(), list->end());
        for (int32_t& id : copy) NIB_RETURN_IF_ERROR(resolve(id));
        *list = copy;
      }
    }
    NIB_RETURN_IF_ERROR(model_->forward(*run, cache_, logits_));
    const size_t vocab = static_cast<size_t>(config().vocab_size);
    std::vector<sampling::SampledToken>& out = results_[n_uncollected_];
    out.assign(rows.size(), {});
    parallel_for(rows.size(), [&](size_t i) {
      const std::span<const float> row(logits_.data() + i * vocab, vocab);
      const SampleRow& r = resolved[i];
      if (r.constrained) return;  // drawn by supply_masks
      out[i] = r.score_token >= 0 ? sampling::score_token(row, r.score_token, r.params->logprobs)
                                  : sampling::sample_next(row, *r.params, r.context, r.key);
    });
    // Constrained rows wait for their masks with their logits and copies of their context's lists
    // (the engine's token lists change before the masks come: the step before is collected),
    // resolved against the step before's draws while drawn_ still holds them.
    constrained_.clear();
    for (size_t i = 0; i < rows.size(); ++i) {
      if (!resolved[i].constrained) continue;
      Waiting& w = constrained_.emplace_back();
      w.index = i;
      w.row = resolved[i];
      w.logits.assign(logits_.begin() + i * vocab, logits_.begin() + (i + 1) * vocab);
      const sampling::SequenceContext& c = resolved[i].context;
      w.prompt.assign(c.prompt.begin(), c.prompt.end());
      w.output.assign(c.output.begin(), c.output.end());
      w.masked.assign(c.masked.begin(), c.masked.end());
      for (std::vector<int32_t>* list : {&w.prompt, &w.output, &w.masked})
        for (int32_t& id : *list) NIB_RETURN_IF_ERROR(resolve(id));
      w.row.context = {w.prompt, w.output, w.masked, {}};
    }
    drawn_.resize(out.size());
    for (size_t i = 0; i < out.size(); ++i) drawn_[i] = out[i].token;
    ++n_uncollected_;
    return Status::ok();
  }

  Status supply_masks(std::span<const uint32_t> words) override {
    const size_t per = static_cast<size_t>(grammar_mask_words());
    if (words.size() != constrained_.size() * per)
      return Status::error("supply_masks: " + std::to_string(words.size()) + " words for " +
                           std::to_string(constrained_.size()) + " constrained rows");
    if (constrained_.empty()) return Status::ok();
    std::vector<sampling::SampledToken>& out = results_[n_uncollected_ - 1];
    parallel_for(constrained_.size(), [&](size_t k) {
      Waiting& w = constrained_[k];
      w.row.context.allowed = words.subspan(k * per, per);
      out[w.index] = sampling::sample_next(w.logits, *w.row.params, w.row.context, w.row.key);
    });
    for (const Waiting& w : constrained_) drawn_[w.index] = out[w.index].token;
    constrained_.clear();
    return Status::ok();
  }

  Status collect(StepOutput& out) override {
    if (n_uncollected_ == 0) return Status::error("collect: no step was launched");
    if (n_uncollected_ == 1 && !constrained_.empty())
      return Status::error("collect: the step's constrained rows never had their masks");
    out.tokens = std::move(results_[0]);
    out.device_seconds = out.device_idle_seconds = -1.0;
    std::swap(results_[0], results_[1]);
    --n_uncollected_;
    return Status::ok();
  }

  Status replace_weights(const std::string& path) override {
    auto loaded = load_same_layout(checkpoint_->bound, path);
    if (!loaded) return loaded.status();
    std::shared_ptr<const io::LoadedCheckpoint> checkpoint = std::move(loaded.value());
    auto model = make_model_(checkpoint);
    if (!model) return model.status();
    model_ = std::move(model.value());
    checkpoint_ = std::move(checkpoint);
    return Status::ok();
  }

 private:
  ModelFactory make_model_;
  std::shared_ptr<const io::LoadedCheckpoint> checkpoint_;
  std::unique_ptr<models::Model> model_;
  Status resolve(int32_t& id) const {
    if (!models::is_pending_token(id)) return Status::ok();
    const int64_t row = models::pending_row(id);
    if (row >= static_cast<int64_t>(drawn_.size()))
      return Status::error("a pending token names row " + std::to_string(row) + " of a step that drew " +
                           std::to_string(drawn_.size()));
    id = drawn_[static_cast<size_t>(row)];
    return Status::ok();
  }

  int64_t grammar_mask_words() const { return (config().vocab_size + 31) / 32; }

  // A constrained row of the last launched step, waiting for its mask.
  struct Waiting {
    size_t index = 0;
    SampleRow row;  // its context views the lists below
    std::vector<float> logits;
    std::vector<int32_t> prompt, output, masked;
  };
  std::vector<Waiting> constrained_;

  models::KvCache cache_;
  std::vector<float> logits_;
  models::Batch resolved_batch_;
  std::vector<int32_t> drawn_;                      // the last launched step's tokens, by row
  std::vector<sampling::SampledToken> results_[2];  // uncollected steps, oldest first
  int n_uncollected_ = 0;
};

Result<std::unique_ptr<ModelRunner>> create_cpu_runner(std::shared_ptr<const io::LoadedCheckpoint> checkpoint,
                                                       const RunnerOptions& o) {
  models::ModelOptions model_options;
  model_options.act_quant_moe = o.act_quant_moe, model_options.act_quant_dense = o.act_quant_dense;
  model_options.gpu_rounding = o.cpu_gpu_rounding;
  const io::ParallelConfig group{o.tensor_parallel_size, 0, o.expert_parallel};
  const io::ConfigOverrides overrides = o.config_overrides;
  ModelFactory make_model = [=](std::shared_ptr<const io::LoadedCheckpoint> c) {
    return group.size > 1 ? models::create_parallel_model(c->path, overrides, group, model_options)
                          : models::create_model(std::move(c), model_options);
  };
  auto model = make_model(checkpoint);
  if (!model) return model.status();
  const int64_t block_bytes = models::KvCache::bytes_per_token((*model)->config()) * o.block_size;
  int64_t n_blocks = o.num_kv_blocks;
  if (n_blocks <= 0) {
    double budget = o.kv_cache_memory_gb * double(1ull << 30);
    if (!(budget > 0)) {
      const uint64_t available = available_host_memory();
      budget = std::min<double>(double(1ull << 30), available > 0 ? available / 4.0 : double(1ull << 30));
      budget /= std::max(o.engines_on_device, 1);  // data-parallel engines share the host's budget
    }
    n_blocks = static_cast<int64_t>(budget / double(block_bytes));
  }
  if (n_blocks < 1)
    return Status::error("the KV cache budget holds no block of " + std::to_string(o.block_size) + " tokens");
  log_info("CPU KV cache: " + std::to_string(n_blocks) + " blocks of " + std::to_string(o.block_size) + " tokens (" +
           std::to_string(n_blocks * block_bytes >> 20) + " MiB)");
  return std::unique_ptr<ModelRunner>(new CpuRunner(std::move(checkpoint), std::move(model.value()),
                                                    std::move(make_model), n_blocks, o.block_size,
                                                    o.kv_dtype == KvCacheDtype::FP32  ? models::KvDtype::FP32
                                                    : o.kv_dtype == KvCacheDtype::FP8 ? models::KvDtype::FP8
                                                                                      : models::KvDtype::BF16));
}

}  // namespace

Status ModelRunner::step(const models::Batch& batch, std::span<const SampleRow> rows,
                         std::vector<sampling::SampledToken>& out) {
  NIB_RETURN_IF_ERROR(launch(batch, rows));
  StepOutput result;
  NIB_RETURN_IF_ERROR(collect(result));
  out = std::move(result.tokens);
  return Status::ok();
}

bool cuda_available() { return cuda_runner_available(); }

Result<std::shared_ptr<const io::LoadedCheckpoint>> load_same_layout(const io::BoundCheckpoint& current,
                                                                     const std::string& path) {
  auto loaded = io::load_checkpoint(path);
  if (!loaded) return loaded.status();
  std::shared_ptr<const io::LoadedCheckpoint> checkpoint = std::move(loaded.value());
  NIB_RETURN_IF_ERROR(io::check_same_layout(current, checkpoint->bound));
  return checkpoint;
}

Result<std::unique_ptr<ModelRunner>> create_runner(const std::string& path, const RunnerOptions& options) {
  if (options.block_size <= 0) return Status::error("the KV block size must be > 0");
  auto loaded = io::load_checkpoint(path, options.config_overrides);
  if (!loaded) return loaded.status();
  std::shared_ptr<const io::LoadedCheckpoint> checkpoint = std::move(loaded.value());
  // As vLLM: a checkpoint's FP8 KV-cache scales serve an FP8 cache; auto keeps BF16 (and fp32 on the CPU).
  if (checkpoint->bound.quant.kv_cache_fp8)
    log_info(options.kv_dtype == KvCacheDtype::FP8
                 ? "FP8 KV cache with the checkpoint's calibrated k_scale / v_scale"
                 : "the checkpoint has FP8 KV-cache scales (kv_cache_quant_algo FP8): used with --kv-cache-dtype fp8");
  Backend backend = options.backend;
  if (backend == Backend::AUTO) {
    // The GPU when there is one and its kernels take this checkpoint; else the CPU reference (a
    // tiny test model on a GPU machine still serves).
    backend = Backend::CPU;
    if (cuda_available()) {
      const Status fits = cuda_runner_supports(checkpoint->bound);
      if (fits)
        backend = Backend::CUDA;
      else
        log_warn("--backend auto: " + fits.message() + "; running on the CPU reference");
    }
  }
  if (options.tensor_parallel_size > 1) {
    // The dimensions' checks first (each names what does not split), for every backend.
    NIB_RETURN_IF_ERROR(
        io::partition(checkpoint->bound.config, checkpoint->bound.quant,
                      {options.tensor_parallel_size, 0, options.expert_parallel})
            .status());
  }
  if (options.nnodes > 1 && backend != Backend::CUDA)
    return Status::error("--nnodes " + std::to_string(options.nnodes) + " runs on the GPU backend");
  if (backend == Backend::CUDA) return create_cuda_runner(std::move(checkpoint), options);
  RunnerOptions cpu = options;
  if (cpu.kv_dtype == KvCacheDtype::AUTO && options.cpu_kv_fp32) cpu.kv_dtype = KvCacheDtype::FP32;
  return create_cpu_runner(std::move(checkpoint), cpu);
}

Status follow_node(const std::string& path, const RunnerOptions& options) {
  auto loaded = io::load_checkpoint(path, options.config_overrides);
  if (!loaded) return loaded.status();
  NIB_RETURN_IF_ERROR(io::partition(loaded.value()->bound.config, loaded.value()->bound.quant,
                                    {options.tensor_parallel_size, 0, options.expert_parallel})
                          .status());
  return follow_cuda_node(std::move(loaded.value()), options);
}

namespace {

// NIBBLE_DIAG_FAIL_ENGINE's runner: the wrapped one, until its launches fail.
class FailingRunner final : public ModelRunner {
 public:
  FailingRunner(std::unique_ptr<ModelRunner> inner, int64_t fail_from)
      : inner_(std::move(inner)), fail_from_(fail_from) {}
  const io::ModelConfig& config() const override { return inner_->config(); }
  int64_t n_kv_blocks() const override { return inner_->n_kv_blocks(); }
  int64_t block_size() const override { return inner_->block_size(); }
  std::string describe() const override { return inner_->describe(); }
  Status launch(const models::Batch& batch, std::span<const SampleRow> rows) override {
    if (++launches_ >= fail_from_) return Status::error("injected failure (NIBBLE_DIAG_FAIL_ENGINE)");
    return inner_->launch(batch, rows);
  }
  Status supply_masks(std::span<const uint32_t> words) override { return inner_->supply_masks(words); }
  Status collect(StepOutput& out) override { return inner_->collect(out); }
  Status forward_logits(const models::Batch& batch, std::vector<float>& logits) override {
    return inner_->forward_logits(batch, logits);
  }
  Status replace_weights(const std::string& path) override { return inner_->replace_weights(path); }
  void bind_thread() override { inner_->bind_thread(); }
  bool loads_kernels_lazily() const override { return inner_->loads_kernels_lazily(); }

 private:
  std::unique_ptr<ModelRunner> inner_;
  int64_t fail_from_ = 0, launches_ = 0;
};

}  // namespace

std::unique_ptr<ModelRunner> inject_engine_failure(std::unique_ptr<ModelRunner> runner, int engine_index) {
  const char* value = env_value("NIBBLE_DIAG_FAIL_ENGINE");
  const std::string spec = value ? value : "";
  const size_t colon = spec.find(':');
  if (spec.empty() || colon == std::string::npos) return runner;
  try {
    if (std::stoi(spec.substr(0, colon)) != engine_index) return runner;
    const int64_t from = std::stoll(spec.substr(colon + 1));
    log_warn("NIBBLE_DIAG_FAIL_ENGINE: engine " + std::to_string(engine_index) + "'s steps fail from launch " +
             std::to_string(from));
    return std::make_unique<FailingRunner>(std::move(runner), from);
  } catch (const std::exception&) {
    log_warn("NIBBLE_DIAG_FAIL_ENGINE='" + spec + "' is not ENGINE:LAUNCH; ignored");
    return runner;
  }
}

}  // namespace nibble::engine

// The CUDA runner: the GPU model, its KV cache sized from measured memory, and the GPU sampler; a
// step leaves only the sampled ids (and logprobs when asked) to copy back.
#include "engine/cuda_runner.h"

#include <algorithm>

#include "core/log.h"
#include "cuda/check.cuh"
#include "cuda/flashinfer_attention.cuh"
#include "cuda/sampler.cuh"
#include "models/qwen3_cuda.h"

namespace nibble::engine {
namespace {

cuda::GemmBackend to_cuda(KernelChoice c) {
  switch (c) {
    case KernelChoice::FUSED: return cuda::GemmBackend::FUSED;
    case KernelChoice::DEQUANT_CUBLAS: return cuda::GemmBackend::DEQUANT_CUBLAS;
    case KernelChoice::SKINNY: return cuda::GemmBackend::SKINNY;
    case KernelChoice::WGMMA: return cuda::GemmBackend::WGMMA;
    default: return cuda::GemmBackend::AUTO;
  }
}

class CudaRunner : public ModelRunner {
 public:
  CudaRunner(std::unique_ptr<cuda::DeviceContext> ctx, std::unique_ptr<models::CudaModel> model,
             std::shared_ptr<const io::LoadedCheckpoint> checkpoint, const RunnerOptions& options)
      : options_(options), ctx_(std::move(ctx)), model_(std::move(model)), checkpoint_(std::move(checkpoint)) {}

  Status init_sampler(int64_t max_rows) {
    const int64_t V = model_->config().vocab_size, words = (V + 31) / 32;
    cuda::DeviceArena& a = ctx_->arena;
    max_rows_ = max_rows;
    NIB_RETURN_IF_ERROR(a.alloc(work_, static_cast<size_t>(max_rows * V), "the sampler's work rows"));
    NIB_RETURN_IF_ERROR(a.alloc(seen_, static_cast<size_t>(max_rows * 2 * words), "the sampler's token sets"));
    NIB_RETURN_IF_ERROR(a.alloc(params_, static_cast<size_t>(max_rows), "the sampling parameters"));
    NIB_RETURN_IF_ERROR(a.alloc(out_tokens_, static_cast<size_t>(max_rows), "sampled tokens"));
    NIB_RETURN_IF_ERROR(a.alloc(out_logprobs_, static_cast<size_t>(max_rows), "sampled logprobs"));
    NIB_RETURN_IF_ERROR(a.alloc(out_top_tokens_, static_cast<size_t>(max_rows * cuda::MAX_TOP_LOGPROBS), "top tokens"));
    NIB_RETURN_IF_ERROR(a.alloc(out_top_logprobs_, static_cast<size_t>(max_rows * cuda::MAX_TOP_LOGPROBS), "top logprobs"));
    return Status::ok();
  }

  ~CudaRunner() override {
    const std::string report = model_ ? model_->profile_report() : std::string();
    if (!report.empty()) log_info("step profile (NIBBLE_PROFILE_STEPS=1):\n" + report);
  }

  cuda::DeviceContext* context() { return ctx_.get(); }
  models::CudaModel& model() { return *model_; }

  const io::ModelConfig& config() const override { return model_->config(); }
  int64_t n_kv_blocks() const override { return model_->n_kv_blocks(); }
  int64_t block_size() const override { return options_.block_size; }
  std::string describe() const override { return "cuda (" + ctx_->name + ")"; }

  Status forward_logits(const models::Batch& batch, std::vector<float>& logits) override {
    NIB_RETURN_IF_ERROR(model_->forward(batch));
    logits.resize(batch.logits_rows.size() * static_cast<size_t>(config().vocab_size));
    NIB_RETURN_IF_ERROR(cuda::cuda_status(cudaMemcpyAsync(logits.data(), model_->logits(), logits.size() * sizeof(float),
                                                          cudaMemcpyDeviceToHost, ctx_->stream),
                                          "copying the logits"));
    return ctx_->synchronize();
  }

  Status step(const models::Batch& batch, std::span<const SampleRow> rows,
              std::vector<sampling::SampledToken>& out) override {
    if (rows.size() != batch.logits_rows.size()) return Status::error("step: one sample row per logits row");
    const int64_t R = static_cast<int64_t>(rows.size());
    if (R > max_rows_) return Status::error("step: more than " + std::to_string(max_rows_) + " rows to sample");
    NIB_RETURN_IF_ERROR(model_->forward(batch));
    out.assign(rows.size(), {});
    if (R == 0) return ctx_->synchronize();
    // Every row's parameters and token lists in one upload.
    std::vector<cuda::SamplerRow> params(rows.size());
    std::vector<int32_t> tokens;
    int32_t max_logprobs = -1;
    for (size_t i = 0; i < rows.size(); ++i) {
      const sampling::SamplingParams& p = *rows[i].params;
      const sampling::SequenceContext& c = rows[i].context;
      cuda::SamplerRow& g = params[i];
      g.temperature = p.temperature;
      g.top_k = p.top_k;
      g.top_p = p.top_p;
      g.min_p = p.min_p;
      g.repetition_penalty = p.repetition_penalty;
      g.presence_penalty = p.presence_penalty;
      g.frequency_penalty = p.frequency_penalty;
      g.seed = rows[i].key.seed;
      g.position = rows[i].key.position;
      g.logprobs = p.logprobs;
      max_logprobs = std::max(max_logprobs, p.logprobs);
      const bool needs_tokens = p.has_penalties();
      g.prompt_offset = static_cast<int32_t>(tokens.size());
      if (needs_tokens) {
        tokens.insert(tokens.end(), c.prompt.begin(), c.prompt.end());
        tokens.insert(tokens.end(), c.output.begin(), c.output.end());
        g.prompt_len = static_cast<int32_t>(c.prompt.size());
        g.output_len = static_cast<int32_t>(c.output.size());
      }
      g.masked_offset = static_cast<int32_t>(tokens.size());
      tokens.insert(tokens.end(), c.masked.begin(), c.masked.end());
      g.masked_len = static_cast<int32_t>(c.masked.size());
    }
    if (static_cast<int64_t>(tokens.size()) > token_capacity_) {
      token_capacity_ = std::max<int64_t>(static_cast<int64_t>(tokens.size()), 2 * token_capacity_);
      NIB_RETURN_IF_ERROR(ctx_->synchronize());
      NIB_RETURN_IF_ERROR(ctx_->arena.alloc(tokens_, static_cast<size_t>(token_capacity_), "the sampler's token lists"));
    }
    const cudaStream_t s = ctx_->stream;
    NIB_RETURN_IF_ERROR(cuda::cuda_status(cudaMemcpyAsync(params_, params.data(), params.size() * sizeof(params[0]),
                                                          cudaMemcpyHostToDevice, s), "sampling parameters"));
    if (!tokens.empty())
      NIB_RETURN_IF_ERROR(cuda::cuda_status(cudaMemcpyAsync(tokens_, tokens.data(), tokens.size() * 4,
                                                            cudaMemcpyHostToDevice, s), "sampler token lists"));
    const cuda::SamplerBatch sb{R, config().vocab_size, model_->logits(), params_, tokens_, work_, seen_,
                                out_tokens_, out_logprobs_, out_top_tokens_, out_top_logprobs_};
    NIB_RETURN_IF_ERROR(cuda::sample_rows(sb, s));
    std::vector<int32_t> ids(rows.size());
    std::vector<float> lps(rows.size());
    std::vector<int32_t> top_ids;
    std::vector<float> top_lps;
    NIB_RETURN_IF_ERROR(cuda::cuda_status(cudaMemcpyAsync(ids.data(), out_tokens_, ids.size() * 4, cudaMemcpyDeviceToHost, s), "sampled ids"));
    if (max_logprobs >= 0) {
      top_ids.resize(rows.size() * cuda::MAX_TOP_LOGPROBS);
      top_lps.resize(top_ids.size());
      NIB_RETURN_IF_ERROR(cuda::cuda_status(cudaMemcpyAsync(lps.data(), out_logprobs_, lps.size() * 4, cudaMemcpyDeviceToHost, s), "logprobs"));
      NIB_RETURN_IF_ERROR(cuda::cuda_status(cudaMemcpyAsync(top_ids.data(), out_top_tokens_, top_ids.size() * 4, cudaMemcpyDeviceToHost, s), "top ids"));
      NIB_RETURN_IF_ERROR(cuda::cuda_status(cudaMemcpyAsync(top_lps.data(), out_top_logprobs_, top_lps.size() * 4, cudaMemcpyDeviceToHost, s), "top logprobs"));
    }
    NIB_RETURN_IF_ERROR(ctx_->synchronize());
    for (size_t i = 0; i < rows.size(); ++i) {
      out[i].token = ids[i];
      const int32_t k = rows[i].params->logprobs;
      if (k < 0) continue;
      out[i].logprob = lps[i];
      for (int32_t j = 0; j < k && j < cuda::MAX_TOP_LOGPROBS; ++j)
        out[i].top.push_back({top_ids[i * cuda::MAX_TOP_LOGPROBS + j], top_lps[i * cuda::MAX_TOP_LOGPROBS + j]});
    }
    return Status::ok();
  }

  Status replace_weights(const std::string& path) override {
    auto loaded = load_same_layout(checkpoint_->bound, path);
    if (!loaded) return loaded.status();
    std::shared_ptr<const io::LoadedCheckpoint> checkpoint = std::move(loaded.value());
    NIB_RETURN_IF_ERROR(model_->reload(checkpoint));
    checkpoint_ = std::move(checkpoint);
    return Status::ok();
  }

 private:
  RunnerOptions options_;
  std::unique_ptr<cuda::DeviceContext> ctx_;
  std::unique_ptr<models::CudaModel> model_;
  std::shared_ptr<const io::LoadedCheckpoint> checkpoint_;
  int64_t max_rows_ = 0, token_capacity_ = 0;
  float* work_ = nullptr;
  uint32_t* seen_ = nullptr;
  cuda::SamplerRow* params_ = nullptr;
  int32_t* tokens_ = nullptr;
  int32_t *out_tokens_ = nullptr, *out_top_tokens_ = nullptr;
  float *out_logprobs_ = nullptr, *out_top_logprobs_ = nullptr;
};

}  // namespace

bool cuda_runner_available() { return cuda::device_count() > 0; }

Status cuda_runner_supports(const io::BoundCheckpoint& checkpoint) { return models::cuda_model_supports(checkpoint); }

Result<std::unique_ptr<ModelRunner>> create_cuda_runner(std::shared_ptr<const io::LoadedCheckpoint> checkpoint,
                                                        const RunnerOptions& o) {
  if (o.kv_dtype == KvCacheDtype::FP32) return Status::error("--backend cuda keeps a BF16 KV cache (fp32 is CPU-only)");
  NIB_RETURN_IF_ERROR(models::cuda_model_supports(checkpoint->bound));
  auto ctx = cuda::DeviceContext::create(0);
  if (!ctx) return Status::error("--backend cuda: " + ctx.status().message());
  models::CudaModelOptions mo;
  mo.act_quant_moe = o.act_quant_moe;
  mo.act_quant_dense = o.act_quant_dense;
  mo.gemm = to_cuda(o.gemm);
  mo.moe = to_cuda(o.moe);
  mo.tensor_core_decode_min_rows = o.decode_attention == DecodeAttention::TENSOR_CORE ? 1
                                   : o.decode_attention == DecodeAttention::SPLIT_KV ? INT64_MAX
                                                                                     : models::AUTO_TENSOR_CORE_DECODE_MIN_ROWS;
  if (o.attention == AttentionBackend::FLASHINFER && !cuda::flashinfer_attention_supported(checkpoint->bound.config.head_dim))
    return Status::error("--attention-backend flashinfer: head_dim " + std::to_string(checkpoint->bound.config.head_dim) +
                         " is not compiled in (64, 128); use auto or native");
  mo.flashinfer = o.attention != AttentionBackend::NATIVE;
  mo.max_tokens = std::max<int64_t>(o.max_num_batched_tokens, 1);
  mo.max_rows = std::max<int64_t>(o.max_num_seqs, 1);
  mo.max_seqs = std::max<int64_t>(o.max_num_seqs, 1);
  mo.block_size = o.block_size;
  auto model = models::CudaModel::create(checkpoint, mo, **ctx);
  if (!model) return model.status();
  auto runner = std::make_unique<CudaRunner>(std::move(ctx.value()), std::move(model.value()), checkpoint, o);
  NIB_RETURN_IF_ERROR(runner->init_sampler(mo.max_rows));
  // KV blocks: as asked, or what the memory budget leaves (vLLM's --gpu-memory-utilization: the
  // share of the whole card this process may fill, weights and workspaces included).
  cuda::DeviceContext& c = *runner->context();
  const int64_t block_bytes = runner->model().kv_bytes_per_block();
  int64_t n_blocks = o.num_kv_blocks;
  std::string sizing;  // how the budget came about, for the error below
  if (n_blocks <= 0) {
    double budget = o.kv_cache_memory_gb * double(1ull << 30);
    sizing = "--kv-cache-memory-gb " + std::to_string(o.kv_cache_memory_gb);
    if (!(budget > 0)) {
      const double used = static_cast<double>(c.total_memory - c.free_memory());
      budget = o.gpu_memory_utilization * static_cast<double>(c.total_memory) - used;
      // Memory other processes hold counts against the share too (vLLM's rule): say so.
      sizing = std::to_string(int64_t(used) >> 20) + " MiB of the card in use (other processes included) of the " +
               std::to_string(int64_t(o.gpu_memory_utilization * double(c.total_memory)) >> 20) +
               " MiB --gpu-memory-utilization allows";
    }
    n_blocks = static_cast<int64_t>(budget / static_cast<double>(block_bytes));
  }
  if (n_blocks < 1)
    return Status::error("--backend cuda: no memory left for the KV cache (this model's weights and workspaces: " +
                         std::to_string(c.arena.bytes() >> 20) + " MiB; " + sizing +
                         "); raise --gpu-memory-utilization, give --kv-cache-memory-gb or --num-kv-blocks, or lower "
                         "--max-num-batched-tokens");
  NIB_RETURN_IF_ERROR(runner->model().allocate_kv_cache(n_blocks));
  if (o.enforce_eager) log_info("decode steps run eagerly (--enforce-eager)");
  else if (mo.moe == cuda::GemmBackend::DEQUANT_CUBLAS)
    log_info("decode steps run eagerly: the dequant-cublas MoE backend reads expert counts back to the host");
  else NIB_RETURN_IF_ERROR(runner->model().capture_decode_graphs(mo.max_seqs));
  log_info("GPU KV cache: " + std::to_string(n_blocks) + " blocks of " + std::to_string(o.block_size) + " tokens (" +
           std::to_string((n_blocks * block_bytes) >> 20) + " MiB); " + std::to_string(c.arena.bytes() >> 20) +
           " MiB on " + c.name + " in all");
  return std::unique_ptr<ModelRunner>(std::move(runner));
}

}  // namespace nibble::engine

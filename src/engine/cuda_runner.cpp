// The CUDA runner: the GPU model, its KV cache sized from measured memory, and the GPU sampler; a
// step is queued without waiting and leaves only the sampled ids (and logprobs when asked) to copy
// back into pinned memory, where collect finds them.
#include "engine/cuda_runner.h"

#include <algorithm>
#include <atomic>

#include "core/log.h"
#include "engine/gpu_fit.h"
#include "cuda/common/check.cuh"
#include "cuda/attention/flashinfer_attention.cuh"
#include "cuda/sampling/host_wait.cuh"
#include "cuda/sampling/sampler.cuh"
#include "models/cuda_model.h"
#include "models/parallel_cuda_model.h"
#include "models/parallel_model.h"

namespace nibble::engine {
namespace {

class CudaRunner : public ModelRunner {
 public:
  CudaRunner(std::unique_ptr<cuda::DeviceContext> ctx, std::unique_ptr<models::CudaModel> model,
             std::shared_ptr<const io::LoadedCheckpoint> checkpoint, const RunnerOptions& options)
      : options_(options), ctx_(std::move(ctx)), model_(std::move(model)), checkpoint_(std::move(checkpoint)) {}

  Status init_sampler(int64_t max_rows) {
    cuda::DeviceArena& a = ctx_->arena;
    max_rows_ = max_rows;
    NIB_RETURN_IF_ERROR(a.alloc(params_, static_cast<size_t>(max_rows), "the sampling parameters"));
    NIB_RETURN_IF_ERROR(a.alloc(out_tokens_, static_cast<size_t>(max_rows), "sampled tokens"));
    NIB_RETURN_IF_ERROR(a.alloc(out_logprobs_, static_cast<size_t>(max_rows), "sampled logprobs"));
    NIB_RETURN_IF_ERROR(a.alloc(out_top_tokens_, static_cast<size_t>(max_rows * cuda::MAX_TOP_LOGPROBS), "top tokens"));
    NIB_RETURN_IF_ERROR(
        a.alloc(out_top_logprobs_, static_cast<size_t>(max_rows * cuda::MAX_TOP_LOGPROBS), "top logprobs"));
    const size_t R = static_cast<size_t>(max_rows), top = R * cuda::MAX_TOP_LOGPROBS;
    for (Slot& slot : slots_) {
      NIB_RETURN_IF_ERROR(slot.params.resize(R, "sampling parameters"));
      NIB_RETURN_IF_ERROR(slot.ids.resize(R, "sampled tokens"));
      NIB_RETURN_IF_ERROR(slot.logprobs.resize(R, "sampled logprobs"));
      NIB_RETURN_IF_ERROR(slot.top_ids.resize(top, "top tokens"));
      NIB_RETURN_IF_ERROR(slot.top_logprobs.resize(top, "top logprobs"));
      for (cudaEvent_t* e : {&slot.start, &slot.end})
        NIB_RETURN_IF_ERROR(cuda::cuda_status(cudaEventCreate(e), "a step event"));
    }
    NIB_RETURN_IF_ERROR(mask_flags_.resize(2, "structured output's flags"));
    mask_flags_[0] = mask_flags_[1] = 0;
    // Loaded now, not at their first launch: a sampler loaded behind a step's wait for its masks
    // stalled the host that supplies them until the wait timed out (the first constrained step).
    NIB_RETURN_IF_ERROR(cuda::prepare_wait_for_host());
    return cuda::prepare_sampler(config().vocab_size);
  }

  ~CudaRunner() override {
    if (ctx_) (void)ctx_->synchronize();  // nothing in flight writes into the slots below
    for (Slot& slot : slots_)
      for (cudaEvent_t e : {slot.start, slot.end})
        if (e) cudaEventDestroy(e);
    const std::string report = model_ ? model_->profile_report() : std::string();
    if (!report.empty()) log_info("step profile (NIBBLE_DIAG_PROFILE_STEPS=1):\n" + report);
  }

  cuda::DeviceContext* context() { return ctx_.get(); }
  models::CudaModel& model() { return *model_; }

  const io::ModelConfig& config() const override { return model_->config(); }
  int64_t n_kv_blocks() const override { return model_->n_kv_blocks(); }
  int64_t block_size() const override { return options_.block_size; }
  std::string describe() const override {
    const std::string split = model_->layout();
    return "cuda:" + std::to_string(ctx_->device) + " (" + ctx_->name + (split.empty() ? "" : "; " + split) + ")";
  }
  void bind_thread() override { cudaSetDevice(ctx_->device); }
  bool loads_kernels_lazily() const override { return true; }  // CUDA_MODULE_LOADING's default, LAZY

  Status forward_logits(const models::Batch& batch, std::vector<float>& logits) override {
    NIB_RETURN_IF_ERROR(model_->forward(batch));
    logits.resize(batch.logits_rows.size() * static_cast<size_t>(config().vocab_size));
    NIB_RETURN_IF_ERROR(
        cuda::cuda_status(cudaMemcpyAsync(logits.data(), model_->logits(), logits.size() * sizeof(float),
                                          cudaMemcpyDeviceToHost, ctx_->stream),
                          "copying the logits"));
    return ctx_->synchronize();
  }

  // Queues the step: the forward, the sampler, and the copies of what it drew into the step's pinned
  // slot; nothing waits. Pending ids (the uncollected step's draws) are read on the device from the
  // model's drawn tokens, which each step's sampler output refreshes after its own sampling.
  Status launch(const models::Batch& batch, std::span<const SampleRow> rows) override {
    if (rows.size() != batch.logits_rows.size()) return Status::error("launch: one sample row per logits row");
    const int64_t R = static_cast<int64_t>(rows.size());
    if (R > max_rows_) return Status::error("launch: more than " + std::to_string(max_rows_) + " rows to sample");
    if (n_uncollected_ == 2) return Status::error("launch: two steps are already uncollected");
    for (int32_t id : batch.token_ids)
      if (models::is_pending_token(id) && models::pending_row(id) >= last_rows_)
        return Status::error("launch: a pending token names row " + std::to_string(models::pending_row(id)) +
                             " of a step that drew " + std::to_string(last_rows_));
    Slot& slot = slots_[launched_ % SLOTS];
    const cudaStream_t s = ctx_->stream;
    NIB_RETURN_IF_ERROR(cuda::cuda_status(cudaEventRecord(slot.start, s), "recording a step event"));
    NIB_RETURN_IF_ERROR(model_->forward(batch));
    slot.rows = R;
    slot.top_counts.resize(rows.size());
    if (R > 0) NIB_RETURN_IF_ERROR(sample(rows, slot));
    NIB_RETURN_IF_ERROR(cuda::cuda_status(cudaEventRecord(slot.end, s), "recording a step event"));
    last_rows_ = R;
    ++launched_;
    ++n_uncollected_;
    return Status::ok();
  }

  // Writes the masks into the last launched step's pinned slot, then the word its device wait polls.
  Status supply_masks(std::span<const uint32_t> words) override {
    if (launched_ == 0) return Status::error("supply_masks: no step was launched");
    Slot& slot = slots_[(launched_ - 1) % SLOTS];
    if (words.size() != static_cast<size_t>(slot.constrained) * static_cast<size_t>(mask_words()))
      return Status::error("supply_masks: " + std::to_string(words.size()) + " words for " +
                           std::to_string(slot.constrained) + " constrained rows");
    if (slot.constrained == 0) return Status::ok();
    std::copy(words.begin(), words.end(), slot.masks.data());
    std::atomic_thread_fence(std::memory_order_release);  // the masks before the word the device polls
    std::atomic_ref<uint32_t>(mask_flags_[0]).store(slot.mask_ticket, std::memory_order_release);
    slot.constrained = 0;
    return Status::ok();
  }

  Status collect(StepOutput& out) override {
    if (n_uncollected_ == 0) return Status::error("collect: no step was launched");
    const uint64_t index = launched_ - static_cast<uint64_t>(n_uncollected_);
    --n_uncollected_;
    Slot& slot = slots_[index % SLOTS];
    if (slot.constrained > 0 && n_uncollected_ == 0)
      return Status::error("collect: the step's constrained rows never had their masks");
    NIB_RETURN_IF_ERROR(cuda::cuda_status(cudaEventSynchronize(slot.end), "the step"));
    if (slot.mask_ticket != 0 &&
        std::atomic_ref<uint32_t>(mask_flags_[1]).load(std::memory_order_acquire) == slot.mask_ticket)
      return Status::error("structured output: the step's grammar masks did not come within " +
                           std::to_string(int(MASK_TIMEOUT_SECONDS)) + " s");
    out.tokens.resize(static_cast<size_t>(slot.rows));
    for (size_t i = 0; i < out.tokens.size(); ++i) {
      sampling::SampledToken& t = out.tokens[i];
      t.token = slot.ids[i];
      t.top.clear();
      const int32_t k = slot.top_counts[i];
      if (k < 0) continue;
      t.logprob = slot.logprobs[i];
      for (int32_t j = 0; j < k && j < cuda::MAX_TOP_LOGPROBS; ++j)
        t.top.push_back(
            {slot.top_ids[i * cuda::MAX_TOP_LOGPROBS + j], slot.top_logprobs[i * cuda::MAX_TOP_LOGPROBS + j]});
    }
    // The events of the step before are intact: a slot is reused three launches later.
    out.device_seconds = elapsed(slot.start, slot.end);
    out.device_idle_seconds = index == 0 ? -1.0 : elapsed(slots_[(index - 1) % SLOTS].end, slot.start);
    return Status::ok();
  }

  Status replace_weights(const std::string& path) override {
    if (n_uncollected_ > 0) return Status::error("replace_weights: a step is still uncollected");
    auto loaded = load_same_layout(checkpoint_->bound, path);
    if (!loaded) return loaded.status();
    std::shared_ptr<const io::LoadedCheckpoint> checkpoint = std::move(loaded.value());
    NIB_RETURN_IF_ERROR(model_->reload(checkpoint));
    checkpoint_ = std::move(checkpoint);
    return Status::ok();
  }

 private:
  // What one launched step stages and brings back, in pinned memory, and its start and end events.
  // Three slots: a step in flight, the one before it being collected, and the one before that,
  // whose end event measures the device's idle time before the step being collected.
  struct Slot {
    cuda::PinnedArray<cuda::SamplerRow> params;
    cuda::PinnedArray<int32_t> tokens;  // every row's token lists (penalties, mask, logit_bias)
    cuda::PinnedArray<float> biases;    // logit_bias values, at their tokens' indices
    cuda::PinnedArray<int32_t> ids, top_ids;
    cuda::PinnedArray<float> logprobs, top_logprobs;
    std::vector<int32_t> top_counts;    // per row: the logprobs asked (-1: none)
    cuda::PinnedArray<uint32_t> masks;  // structured output: the constrained rows' masks, supply_masks's
    int64_t constrained = 0;            // constrained rows still waiting for their masks
    uint32_t mask_ticket = 0;           // the value the step's device wait polls for; 0: none
    int64_t rows = 0;
    cudaEvent_t start = nullptr, end = nullptr;
  };
  static constexpr uint64_t SLOTS = 3;
  // How long a step's sampler waits for its masks before it gives up (the host always answers: a
  // safety net, so a bug cannot hang the device).
  static constexpr double MASK_TIMEOUT_SECONDS = 60.0;
  int64_t mask_words() const { return (config().vocab_size + 31) / 32; }

  static double elapsed(cudaEvent_t from, cudaEvent_t to) {
    float ms = 0.0f;
    return cudaEventElapsedTime(&ms, from, to) == cudaSuccess ? 1e-3 * ms : -1.0;
  }

  // Every row's parameters and token lists in one upload each, the sampler, then the drawn tokens
  // to the model (what the next step's pending ids read) and to the slot.
  Status sample(std::span<const SampleRow> rows, Slot& slot) {
    const int64_t R = static_cast<int64_t>(rows.size());
    size_t n_tokens = 0;
    bool any_bias = false;
    for (const SampleRow& row : rows) {
      n_tokens += row.context.masked.size() + row.params->logit_bias.size() +
                  (row.params->has_penalties() ? row.context.prompt.size() + row.context.output.size() : 0);
      any_bias |= !row.params->logit_bias.empty();
    }
    if (n_tokens > slot.tokens.size()) {
      // Grows for every slot at once (rare: long sequences with penalties), once nothing is in flight.
      const size_t capacity = std::max(n_tokens, 2 * slot.tokens.size());
      NIB_RETURN_IF_ERROR(ctx_->synchronize());
      for (Slot& each : slots_) {
        NIB_RETURN_IF_ERROR(each.tokens.resize(capacity, "the sampler's token lists"));
        NIB_RETURN_IF_ERROR(each.biases.resize(capacity, "the sampler's logit_bias values"));
      }
      NIB_RETURN_IF_ERROR(ctx_->arena.alloc(tokens_, capacity, "the sampler's token lists"));
      NIB_RETURN_IF_ERROR(ctx_->arena.alloc(biases_, capacity, "the sampler's logit_bias values"));
    }
    int32_t max_logprobs = -1;
    size_t used = 0;
    int64_t n_constrained = 0;
    auto append = [&](std::span<const int32_t> list) {
      std::copy(list.begin(), list.end(), slot.tokens.data() + used);
      used += list.size();
    };
    for (size_t i = 0; i < rows.size(); ++i) {
      const sampling::SamplingParams& p = *rows[i].params;
      const sampling::SequenceContext& c = rows[i].context;
      cuda::SamplerRow& g = slot.params[i];
      g = {};
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
      g.score_token = rows[i].score_token;
      slot.top_counts[i] = p.logprobs;
      max_logprobs = std::max(max_logprobs, p.logprobs);
      g.prompt_offset = static_cast<int32_t>(used);
      if (p.has_penalties()) {
        append(c.prompt);
        append(c.output);
        g.prompt_len = static_cast<int32_t>(c.prompt.size());
        g.output_len = static_cast<int32_t>(c.output.size());
      }
      g.masked_offset = static_cast<int32_t>(used);
      append(c.masked);
      g.masked_len = static_cast<int32_t>(c.masked.size());
      g.bias_offset = static_cast<int32_t>(used);
      for (const auto& [token, bias] : p.logit_bias)
        slot.tokens.data()[used] = token, slot.biases.data()[used++] = bias;
      g.bias_len = static_cast<int32_t>(p.logit_bias.size());
      g.mask_row = rows[i].constrained ? static_cast<int32_t>(n_constrained++) : -1;
    }
    const cudaStream_t s = ctx_->stream;
    auto copy = [&](void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const char* what) {
      return cuda::cuda_status(cudaMemcpyAsync(dst, src, bytes, kind, s), what);
    };
    NIB_RETURN_IF_ERROR(
        copy(params_, slot.params.data(), R * sizeof(cuda::SamplerRow), cudaMemcpyHostToDevice, "sampling parameters"));
    if (used)
      NIB_RETURN_IF_ERROR(copy(tokens_, slot.tokens.data(), used * 4, cudaMemcpyHostToDevice, "sampler token lists"));
    if (any_bias)
      NIB_RETURN_IF_ERROR(copy(biases_, slot.biases.data(), used * 4, cudaMemcpyHostToDevice, "logit_bias values"));
    slot.constrained = n_constrained;
    slot.mask_ticket = 0;
    if (n_constrained > 0) {
      // The masks come from the host after this launch (supply_masks): the copy waits on the device.
      const size_t words = static_cast<size_t>(n_constrained * mask_words());
      if (words > slot.masks.size()) NIB_RETURN_IF_ERROR(grow_masks(words));
      slot.mask_ticket = ++mask_tickets_;
      if (slot.mask_ticket == 0) slot.mask_ticket = ++mask_tickets_;  // 0 means none
      NIB_RETURN_IF_ERROR(
          cuda::wait_for_host(&mask_flags_[0], slot.mask_ticket, &mask_flags_[1], MASK_TIMEOUT_SECONDS, s));
      NIB_RETURN_IF_ERROR(copy(allowed_, slot.masks.data(), words * 4, cudaMemcpyHostToDevice, "grammar masks"));
    }
    int32_t* drawn = model_->drawn_tokens();
    cuda::SamplerBatch sb{R,           config().vocab_size, model_->logits(), params_,           tokens_, drawn,
                          out_tokens_, out_logprobs_,       out_top_tokens_,  out_top_logprobs_, biases_};
    if (n_constrained > 0) sb.allowed = allowed_, sb.mask_words = mask_words();
    NIB_RETURN_IF_ERROR(cuda::sample_rows(sb, s));
    NIB_RETURN_IF_ERROR(copy(drawn, out_tokens_, R * 4, cudaMemcpyDeviceToDevice, "drawn tokens"));
    NIB_RETURN_IF_ERROR(copy(slot.ids.data(), out_tokens_, R * 4, cudaMemcpyDeviceToHost, "sampled ids"));
    if (max_logprobs >= 0) {
      const size_t top = static_cast<size_t>(R) * cuda::MAX_TOP_LOGPROBS;
      NIB_RETURN_IF_ERROR(copy(slot.logprobs.data(), out_logprobs_, R * 4, cudaMemcpyDeviceToHost, "logprobs"));
      NIB_RETURN_IF_ERROR(copy(slot.top_ids.data(), out_top_tokens_, top * 4, cudaMemcpyDeviceToHost, "top ids"));
      NIB_RETURN_IF_ERROR(
          copy(slot.top_logprobs.data(), out_top_logprobs_, top * 4, cudaMemcpyDeviceToHost, "top logprobs"));
    }
    return Status::ok();
  }

  // Mask buffers for `words` words a slot (and on the device), once nothing is in flight.
  Status grow_masks(size_t words) {
    const size_t capacity = std::max(words, static_cast<size_t>(std::min<int64_t>(max_rows_, 64) * mask_words()));
    NIB_RETURN_IF_ERROR(ctx_->synchronize());
    for (Slot& each : slots_) NIB_RETURN_IF_ERROR(each.masks.resize(capacity, "grammar masks"));
    return ctx_->arena.alloc(allowed_, capacity, "grammar masks");
  }

  RunnerOptions options_;
  std::unique_ptr<cuda::DeviceContext> ctx_;
  std::unique_ptr<models::CudaModel> model_;
  std::shared_ptr<const io::LoadedCheckpoint> checkpoint_;
  Slot slots_[SLOTS];
  uint64_t launched_ = 0;  // steps launched so far; step i used slot i % SLOTS
  int n_uncollected_ = 0;
  int64_t last_rows_ = 0;  // rows the last launched step draws (what pending ids may name)
  int64_t max_rows_ = 0;
  cuda::SamplerRow* params_ = nullptr;
  int32_t* tokens_ = nullptr;
  float* biases_ = nullptr;
  uint32_t* allowed_ = nullptr;             // device: the constrained rows' masks
  cuda::PinnedArray<uint32_t> mask_flags_;  // [0]: the last supplied ticket; [1]: a timed-out wait's ticket
  uint32_t mask_tickets_ = 0;
  int32_t *out_tokens_ = nullptr, *out_top_tokens_ = nullptr;
  float *out_logprobs_ = nullptr, *out_top_logprobs_ = nullptr;
};

}  // namespace

bool cuda_runner_available() { return cuda::device_count() > 0; }

int cuda_device_count() { return cuda::device_count(); }

Status cuda_runner_supports(const io::BoundCheckpoint& checkpoint) { return models::cuda_model_supports(checkpoint); }

namespace {

// The GPU model's options from the runner's (every node of a group builds the same from its flags).
Result<models::CudaModelOptions> cuda_model_options(const RunnerOptions& o, const io::BoundCheckpoint& b) {
  if (o.kv_dtype == KvCacheDtype::FP32)
    return Status::error("--backend cuda keeps a BF16 or FP8 KV cache (fp32 is CPU-only)");
  NIB_RETURN_IF_ERROR(models::cuda_model_supports(b));
  models::CudaModelOptions mo;
  mo.act_quant_moe = o.act_quant_moe;
  mo.act_quant_dense = o.act_quant_dense;
  mo.gemm = o.gemm;
  mo.moe = o.moe;
  mo.tensor_core_decode_min_rows = o.decode_attention == DecodeAttention::TENSOR_CORE ? 1
                                   : o.decode_attention == DecodeAttention::SPLIT_KV
                                       ? INT64_MAX
                                       : models::AUTO_TENSOR_CORE_DECODE_MIN_ROWS;
  if (o.attention == AttentionBackend::FLASHINFER && !cuda::flashinfer_attention_supported(b.config.head_dim))
    return Status::error("--attention-backend flashinfer: head_dim " + std::to_string(b.config.head_dim) +
                         " is not compiled in (64, 128); use auto or native");
  mo.flashinfer = o.attention != AttentionBackend::NATIVE;
  mo.kv_fp8 = o.kv_dtype == KvCacheDtype::FP8;
  mo.max_tokens = std::max<int64_t>(o.max_num_batched_tokens, 1);
  mo.max_rows = std::max<int64_t>(o.max_num_seqs, 1) + MAX_SCORE_ROWS;
  mo.max_seqs = std::max<int64_t>(o.max_num_seqs, 1);
  mo.block_size = o.block_size;
  return mo;
}

// This node's ranks' GPUs: its tensor_parallel_size / nnodes ranks on the GPUs from --device on (round
// the visible ones: ranks that share a GPU split its memory as data-parallel engines do), and the
// node group; over hosts, `key` (what every node must agree on) from the checkpoint's layout and the
// options.
struct Placement {
  std::vector<int> devices;
  models::NodeGroup nodes;
  int gpus = 1;  // visible here
};
Placement place(const RunnerOptions& o, const io::LoadedCheckpoint& c, const models::CudaModelOptions& mo) {
  Placement p;
  p.gpus = std::max(cuda::device_count(), 1);
  for (int64_t r = 0; r < o.tensor_parallel_size / std::max(o.nnodes, 1); ++r)
    p.devices.push_back(static_cast<int>((o.device + r) % p.gpus));
  p.nodes = {o.nnodes, o.node_rank, o.dist_init_addr, ""};
  if (o.nnodes < 2) return p;
  p.nodes.key = models::rank_layout_key(c);
  for (int64_t v : {int64_t(mo.act_quant_moe), int64_t(mo.act_quant_dense), int64_t(mo.gemm), int64_t(mo.moe),
                    mo.tensor_core_decode_min_rows, int64_t(mo.flashinfer), int64_t(mo.kv_fp8), mo.max_tokens,
                    mo.max_rows, mo.max_seqs, mo.block_size, o.tensor_parallel_size, int64_t(o.expert_parallel)})
    p.nodes.key += "|" + std::to_string(v);
  return p;
}

// Before anything loads: a model too large for its GPUs is an error saying what would fit.
// ranks_per_card: this process's ranks and engines sharing the card.
Status check_fit(const RunnerOptions& o, const io::LoadedCheckpoint& c, const models::CudaModelOptions& mo,
                 const cuda::DeviceContext& ctx, const Placement& p, int ranks_per_card) {
  return check_weights_fit(c.bound.config, c.bound.quant, {o.tensor_parallel_size, 0, o.expert_parallel},
                           mo.gemm == DenseKernel::AUTO || mo.gemm == DenseKernel::CUBLAS, ctx.total_memory,
                           o.gpu_memory_utilization, p.gpus * std::max(o.nnodes, 1), ranks_per_card);
}

}  // namespace

Status follow_cuda_node(std::shared_ptr<const io::LoadedCheckpoint> checkpoint, const RunnerOptions& o) {
  auto mo = cuda_model_options(o, checkpoint->bound);
  if (!mo) return mo.status();
  auto ctx = cuda::DeviceContext::create(o.device);
  if (!ctx) return Status::error("--backend cuda: " + ctx.status().message());
  const Placement p = place(o, *checkpoint, *mo);
  NIB_RETURN_IF_ERROR(check_fit(o, *checkpoint, *mo, **ctx, p, 1));
  return models::follow_node(checkpoint->path, o.config_overrides, {o.tensor_parallel_size, 0, o.expert_parallel},
                             p.devices, *mo, **ctx, p.nodes);
}

Result<std::unique_ptr<ModelRunner>> create_cuda_runner(std::shared_ptr<const io::LoadedCheckpoint> checkpoint,
                                                        const RunnerOptions& o) {
  auto options = cuda_model_options(o, checkpoint->bound);
  if (!options) return options.status();
  const models::CudaModelOptions mo = *options;
  auto ctx = cuda::DeviceContext::create(o.device);
  if (!ctx) return Status::error("--backend cuda: " + ctx.status().message());
  const Placement p = place(o, *checkpoint, mo);
  const int ranks_on_device = static_cast<int>(std::count(p.devices.begin(), p.devices.end(), p.devices[0]));
  NIB_RETURN_IF_ERROR(check_fit(o, *checkpoint, mo, **ctx, p, ranks_on_device * std::max(o.engines_on_device, 1)));
  Result<std::unique_ptr<models::CudaModel>> model = Status::error("no model");
  if (o.tensor_parallel_size > 1) {
    model = models::create_parallel_cuda_model(checkpoint->path, o.config_overrides,
                                               {o.tensor_parallel_size, 0, o.expert_parallel}, p.devices, mo, **ctx,
                                               p.nodes);
  } else {
    model = models::create_cuda_model(checkpoint, mo, **ctx);
  }
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
      // Engines sharing the card (data parallelism): each its share of the budget, less its own
      // weights and workspaces; never more than the card has left.
      if (o.engines_on_device > 1)
        budget = std::min(budget, o.gpu_memory_utilization * static_cast<double>(c.total_memory) / o.engines_on_device -
                                      static_cast<double>(c.arena.bytes()));
      budget /= ranks_on_device;  // each rank on the card keeps a cache of this many blocks
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
  if (o.enforce_eager)
    log_info("decode steps run eagerly (--enforce-eager)");
  else if (mo.moe == MoeKernel::CUBLAS)
    log_info("decode steps run eagerly: --moe-backend cublas reads expert counts back to the host");
  else
    NIB_RETURN_IF_ERROR(runner->model().capture_decode_graphs(mo.max_seqs));
  log_info(std::string("GPU KV cache (") + (mo.kv_fp8 ? "FP8 E4M3" : "BF16") + "): " + std::to_string(n_blocks) +
           " blocks of " + std::to_string(o.block_size) + " tokens (" + std::to_string((n_blocks * block_bytes) >> 20) +
           " MiB); " + std::to_string(c.arena.bytes() >> 20) + " MiB on " + c.name + " in all");
  return std::unique_ptr<ModelRunner>(std::move(runner));
}

}  // namespace nibble::engine

// The decoder (Qwen3, Qwen3-MoE, ERNIE-4.5-MoE) on the GPU, the twin of decoder_cpu.cpp: its device
// weights and workspaces. decoder_cuda.cpp is the forward, decoder_cuda_weights.cpp the upload; the
// step's inputs (cuda_step.h) and decode graphs (cuda_graphs.h) are the model-agnostic machinery.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "cuda/attention/attention.cuh"
#include "cuda/attention/decode_attention.cuh"
#include "cuda/attention/flashinfer_attention.cuh"
#include "cuda/diagnostics/step_profiler.cuh"
#include "cuda/gemm/linear_nvfp4.cuh"
#include "cuda/moe/moe.cuh"
#include "cuda/ops/transformer_ops.cuh"
#include "models/cuda_graphs.h"
#include "models/cuda_model.h"
#include "models/cuda_step.h"

namespace nibble::models {

struct DeviceLinear {
  int64_t out = 0, in = 0;
  bool nvfp4 = false;
  cuda::DeviceNvfp4Weight q;  // nvfp4
  uint16_t* bf16 = nullptr;   // BF16 weight otherwise
  float input_scale = 0.0f;   // static mode (shared inputs: the maximum)
  float kv_scale = 1.0f;      // k_proj / v_proj: the FP8 KV cache's calibrated scale (io::LinearWeights)
};

struct DeviceLayer {
  uint16_t *input_norm = nullptr, *post_norm = nullptr, *q_norm = nullptr, *k_norm = nullptr;
  DeviceLinear q, k, v, o;
  // q, k and v's BF16 copies as one weight [q + k + v rows, in] (null: apart or none): one cuBLAS
  // GEMM for all three where batches take the copies.
  const uint16_t* qkv_bf16 = nullptr;
  bool is_moe = false;
  cuda::DeviceMoeWeights moe;
  bool has_shared = false;  // ERNIE's shared experts: one SwiGLU MLP beside the routed ones
  DeviceLinear shared_gate, shared_up, shared_down;
  DeviceLinear gate, up, down;  // dense MLP layers
};

// The config as a rank sees it: the heads, KV heads and MLP / expert widths of its slices (the
// checkpoint's own on one GPU); the vocabulary stays the model's.
io::ModelConfig rank_config(const io::BoundCheckpoint& checkpoint);

class CudaDecoder final : public CudaModel {
 public:
  static Status supports(const io::BoundCheckpoint& checkpoint);
  static Result<std::unique_ptr<CudaModel>> create(std::shared_ptr<const io::LoadedCheckpoint> checkpoint,
                                                   const CudaModelOptions& options, cuda::DeviceContext& ctx);
  ~CudaDecoder() override;

  // The model's config; config_ below is the rank's view of it (heads and widths of its slices).
  const io::ModelConfig& config() const override { return checkpoint->bound.config; }
  int64_t kv_bytes_per_block() const override;
  Status allocate_kv_cache(int64_t n_blocks) override;
  int64_t n_kv_blocks() const override { return n_blocks; }
  Status capture_decode_graphs(int64_t max_batch) override;
  Status reload(std::shared_ptr<const io::LoadedCheckpoint> checkpoint) override;
  Status forward(const Batch& batch) override;
  const float* logits() const override { return logits_; }
  int32_t* drawn_tokens() override { return drawn; }
  std::string profile_report() const override { return profiler.report(); }

 private:
  CudaDecoder() = default;
  cudaStream_t stream() const { return ctx->stream; }
  int64_t kv_element_bytes() const { return options.kv_fp8 ? 1 : 2; }

  // decoder_cuda_weights.cpp: every weight to the device in a fixed order; `allocate` on the first
  // load, in place on reloads.
  Status upload(const io::LoadedCheckpoint& c, bool allocate);
  template <class T>
  Status copy(T*& dst, const void* src, size_t bytes, bool allocate, const std::string& what);
  Status tensor(uint16_t*& dst, const io::BoundCheckpoint& b, const std::string& name, bool allocate);
  bool bf16_copies() const;
  Status linear(DeviceLinear& l, const io::BoundCheckpoint& b, const std::string& name, bool allocate,
                uint16_t* dense_at = nullptr);
  Status qkv_linears(DeviceLayer& w, const io::BoundCheckpoint& b, const std::string& prefix, bool allocate);
  Status experts(cuda::DeviceNvfp4Experts& d, std::vector<float>& host_scales, float& input_scale,
                 const io::BoundCheckpoint& b, const std::string& prefix, const char* kind, int64_t begin,
                 int64_t count, bool allocate);

  // decoder_cuda.cpp: the workspaces and the forward.
  Status workspaces();
  Status run(int64_t T, int64_t R, int64_t splits);
  Status attention_chain(const DeviceLayer& w, int64_t T, void* kc, void* vc, const cuda::QkvLayout& qkv,
                         const cuda::AttentionBatch& att, const cuda::DecodeAttentionBatch& one_launch,
                         bool qkv_quantized);
  Status run_linear(const DeviceLinear& l, const uint16_t* in, int64_t M, formats::ActQuant mode, float* out,
                    bool in_quantized = false, const float** deferred_row_scales = nullptr);
  Status swiglu_mlp(const DeviceLinear& gate, const DeviceLinear& up, const DeviceLinear& down, const uint16_t* in,
                    int64_t T, float* out);
  Status run_shared_input(const DeviceLinear* const* linears, float* const* outputs, int count, const uint16_t* in,
                          int64_t M, formats::ActQuant mode, bool in_quantized = false);
  Status run_qkv(const DeviceLayer& w, const uint16_t* in, int64_t M, formats::ActQuant mode, bool in_quantized);
  bool qkv_rope_in_gemm(const DeviceLayer& w, int64_t T, formats::ActQuant mode, bool qkv_quantized) const;
  cuda::NormActQuant qkv_quant(const DeviceLayer& w) const;
  cuda::NormActQuant moe_quant(const DeviceLayer& w) const;
  // The attention plan a graph of this step is captured with (empty where none applies).
  std::vector<int64_t> attention_plan() const;
  // Tensor parallelism (options.collectives of more than one rank): the partial sums of a row-parallel
  // output summed over the ranks; a row-parallel linear's per-token input quantized with the whole
  // row's amax (sets `quantized`); the vocabulary-parallel logits gathered into logits_.
  bool parallel() const { return options.collectives && options.collectives->size() > 1; }
  Status all_reduce(float* data, int64_t count);
  Status row_parallel_input(const DeviceLinear& l, const uint16_t* in, int64_t M, formats::ActQuant mode,
                            bool& quantized);
  Status gather_logits(int64_t R);

  std::shared_ptr<const io::LoadedCheckpoint> checkpoint;
  io::ModelConfig config_;  // narrowed to the rank's slices (rank_config)
  int64_t vocab_begin = 0, vocab_rows = 0;  // the rank's embedding and lm_head rows
  CudaModelOptions options;
  cuda::DeviceContext* ctx = nullptr;
  uint16_t *embed = nullptr, *final_norm = nullptr;
  DeviceLinear lm_head;  // bf16 == embed when tied
  std::vector<DeviceLayer> layers;
  // Workspaces for max_tokens tokens.
  float *x = nullptr, *delta = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *q_rot = nullptr;
  cuda::QkvInput qkv_out;  // where run_qkv left this layer's q, k and v
  // The o projection's per-token row scales when it left delta unscaled (cuBLAS), for the norm that adds it.
  const float* delta_row_scales = nullptr;
  float *mlp_gate = nullptr, *mlp_up = nullptr, *logits_ = nullptr, *shared_out = nullptr;
  // Tensor parallelism: the rank's logits [R, vocab_rows], every rank's [ranks, R, vocab_rows], and the
  // rows' amax of a row-parallel per-token input.
  float *logits_part = nullptr, *logits_gathered = nullptr, *row_amax = nullptr;
  uint16_t *h = nullptr, *attn = nullptr, *mlp_act = nullptr, *final_rows = nullptr;
  cuda::GemmContext gemm;
  std::unique_ptr<cuda::MoeWorkspace> moe_ws;
  float* attention_ws = nullptr;  // split-KV partial results
  float* inv_freq = nullptr;      // RoPE [head_dim / 2], models::rope_for's table
  float rope_scaling = 1.0f;      // ... and its cos / sin factor
  // FlashInfer attention for every step (null: the native kernels) and its BF16 query input.
  std::unique_ptr<cuda::FlashInferAttention> flashinfer;
  uint16_t* q_bf16 = nullptr;
  StepInputs step;
  DecodeGraphs graphs;
  // The tokens the last step drew, by logits row (the runner's sampler writes them): what the
  // pending ids of the next step's batch read (models::pending_token).
  int32_t* drawn = nullptr;
  cuda::StepProfiler profiler;  // NIBBLE_DIAG_PROFILE_STEPS=1
  // KV cache: [layers, blocks + 1, block_size, NKV, D] for K and for V, BF16 values or FP8 codes
  // (options.kv_fp8); the extra block is where graph padding rows write.
  uint8_t *k_cache = nullptr, *v_cache = nullptr;
  int64_t n_blocks = 0;
  int64_t max_blocks_per_seq = 0;  // a block table row: context_length() / block_size
  // Upload bookkeeping.
  uint64_t bytes_uploaded = 0, bytes_total = 0, bf16_copy_bytes = 0;
  int next_quarter = 1;
  std::chrono::steady_clock::time_point upload_start;
};

}  // namespace nibble::models

// A model on the GPU as the CUDA runner drives it: weights uploaded once from the memory-mapped
// checkpoint, a paged KV cache, decode CUDA graphs, and one forward that leaves the logits of the
// asked rows on the device. The GPU model registry (cuda_registry.cpp) maps architectures to them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "cuda/common/device_context.cuh"
#include "cuda/parallel/device_collectives.cuh"
#include "core/kernel_choice.h"
#include "formats/nvfp4.h"
#include "io/binding.h"
#include "models/batch.h"

namespace nibble::models {

// --decode-attention auto's threshold. H200, full-size Qwen3-30B-A3B, 1000-token contexts (docs/lab/perf-notebook.md):
// split-KV / tensor-core 236 / 186 tok/s at 1 sequence (one CTA walks a whole context), 1,537 / 1,667
// at 16, 2,760 / 3,635 at 64, 3,528 / 4,730 at 128.
inline constexpr int64_t AUTO_TENSOR_CORE_DECODE_MIN_ROWS = 16;

struct CudaModelOptions {
  formats::ActQuant act_quant_moe = formats::ActQuant::NONE;
  formats::ActQuant act_quant_dense = formats::ActQuant::NONE;
  DenseKernel gemm = DenseKernel::AUTO;
  MoeKernel moe = MoeKernel::AUTO;
  // Decode tokens go to the tensor-core attention as one-token items when a step has at least this
  // many of them (graph padding rows included), else to the split-KV kernel (RunnerOptions).
  int64_t tensor_core_decode_min_rows = AUTO_TENSOR_CORE_DECODE_MIN_ROWS;
  // Attention through FlashInfer (cuda/attention/flashinfer_attention.cuh) for every step where the head dim
  // is compiled in (it measured faster than the native kernels at every decode batch size and for
  // pp2048, docs/lab/perf-notebook.md); the native kernels above otherwise.
  bool flashinfer = true;
  // Decode steps of at most this many rows (graph padding included) run the one-launch decode
  // attention (cuda/attention/decode_attention.cuh) instead of FlashInfer's split-KV kernel and merge, where
  // the shapes allow; 0: never.
  // 2: on the H200 (full-size Qwen3-30B-A3B, docs/lab/perf-notebook.md, 2026-12-04) it is faster at 1 and 2 rows
  // in every mode (tg128 +5%, 1,000-key contexts +2–5%), at 4 rows 1% slower in W4A16 (faster in
  // W4A4), and 9% slower at 16 (more splits there: slower still).
  int64_t one_launch_decode_max_rows = 2;
  // ... and contexts of at most this many keys: it splits a (token, KV head) over one cluster of at
  // most 8 CTAs, so one sequence of Qwen3's 4 KV heads keeps 32 CTAs busy — at 32k keys 0.71 TB/s of
  // KV reads on an H100 against FlashInfer's split-KV 2.4 (2026-12-06, docs/perf.md). Longer steps
  // replay a second graph family captured on FlashInfer.
  int64_t one_launch_decode_max_keys = 4096;
  // The KV cache in FP8 E4M3 of the checkpoint's k/v scales, or of unit scale (half the bytes a token;
  // FlashInfer attention with head dim 128 only).
  bool kv_fp8 = false;
  int64_t max_tokens = 8192;  // tokens in one step
  int64_t max_rows = 256;     // rows that want logits in one step
  int64_t max_seqs = 256;     // sequences in one step
  int64_t block_size = 16;
  // A tensor-parallel rank (the checkpoint holds the rank's slices): its partial sums meet here, one
  // all-reduce after attention and one after each MLP or MoE block (null: one GPU).
  cuda::DeviceCollectives* collectives = nullptr;
};

// Whether a GPU model runs this checkpoint (architecture, shapes the kernels take, NVFP4 experts);
// the error says what does not fit.
Status cuda_model_supports(const io::BoundCheckpoint& checkpoint);

class CudaModel {
 public:
  virtual ~CudaModel() = default;

  virtual const io::ModelConfig& config() const = 0;
  virtual int64_t kv_bytes_per_block() const = 0;  // K and V of one block over all layers
  virtual Status allocate_kv_cache(int64_t n_blocks) = 0;
  virtual int64_t n_kv_blocks() const = 0;
  // Captures a CUDA graph of the decode step for batch sizes 1, 2, 4, 8, 16, ... up to max_batch
  // (after allocate_kv_cache); decode steps of those sizes (padded up) then replay them.
  virtual Status capture_decode_graphs(int64_t max_batch) = 0;
  // Copies another checkpoint of the same layout into the same device buffers (no second copy).
  virtual Status reload(std::shared_ptr<const io::LoadedCheckpoint> checkpoint) = 0;
  // One step; the logits of batch.logits_rows are left in logits() ([rows, vocab] fp32, device).
  // Queued on the stream, nothing waits: a step may be staged while the one before still runs.
  virtual Status forward(const Batch& batch) = 0;
  virtual const float* logits() const = 0;
  // [max_rows] device: the tokens the last step drew, by logits row, which the runner writes after
  // sampling; pending ids (models::pending_token) in the next batch read them on the device.
  virtual int32_t* drawn_tokens() = 0;
  // With NIBBLE_DIAG_PROFILE_STEPS=1 in the environment: per-op GPU time of the steps so far.
  virtual std::string profile_report() const = 0;
  // How the model is split (e.g. "2 ranks on cuda:0,1 through NCCL"); "" on one GPU.
  virtual std::string layout() const { return ""; }
};

// The GPU model for the checkpoint's architecture: weights uploaded (a progress line per quarter),
// workspaces sized; the KV cache comes later (allocate_kv_cache), from what is left.
Result<std::unique_ptr<CudaModel>> create_cuda_model(std::shared_ptr<const io::LoadedCheckpoint> checkpoint,
                                                     const CudaModelOptions& options, cuda::DeviceContext& ctx);

}  // namespace nibble::models

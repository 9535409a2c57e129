// The whole NVFP4 MoE block on the GPU, from BF16 hidden states to the combined fp32 output: router,
// token → expert grouping, gate_up (+SwiGLU), down and the weighted combine, in any activation mode
// (W4A16, static, per-token) on either backend. Twin of ref::moe.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "core/status.h"
#include "cuda/gemm/linear_nvfp4.cuh"
#include "cuda/moe/moe_gemm.cuh"
#include "cuda/moe/moe_grouping.cuh"
#include "cuda/moe/moe_router.cuh"
#include "cuda/ops/transformer_ops.cuh"
#include "formats/nvfp4.h"

namespace nibble::cuda {

struct DeviceMoeWeights {
  const uint16_t* router = nullptr;   // BF16 [experts, hidden] ...
  const float* router_f32 = nullptr;  // ... or fp32 (ERNIE-4.5)
  const float* score_bias = nullptr;  // device [experts]: chooses, does not weigh (ERNIE-4.5); or null
  float norm_min = 0.0f;              // renormalization divides by max(Σ top-k, norm_min)
  int64_t experts = 0, top_k = 0, hidden = 0, intermediate = 0;
  bool norm_topk_prob = true;
  // gate/up [E, I, H], down [E, H, I] for E = gate.experts: every expert, or under expert parallelism
  // the rank's experts [expert_begin, expert_begin + E) (the router still chooses among all `experts`).
  DeviceNvfp4Experts gate, up, down;
  int64_t expert_begin = 0;
  // Each expert's weight_scale_2 on the host too (the cublas backend's GEMM alphas).
  std::vector<float> gate_scales, up_scales, down_scales;
  // Static mode: one input scale for all gate/up inputs and one for all down inputs (maxima over experts).
  float gate_up_input_scale = 0.0f, down_input_scale = 0.0f;
};

// The most experts a token the one-launch decode block (moe_decode.cuh) takes.
inline constexpr int DECODE_BLOCK_MAX_TOP_K = 8;

// Device buffers for one MoE call of up to max_tokens tokens, reused across layers and steps; after a
// call they hold its routing and grouping (tests and tools read them). With the cublas
// backend it also holds every expert's weights as BF16 (3 · E · I · H values).
struct MoeWorkspace {
  static Result<std::unique_ptr<MoeWorkspace>> create(const DeviceMoeWeights& w, int64_t max_tokens,
                                                      bool dequant_cublas);
  MoeWorkspace() = default;
  ~MoeWorkspace();
  MoeWorkspace(const MoeWorkspace&) = delete;
  MoeWorkspace& operator=(const MoeWorkspace&) = delete;

  int64_t max_tokens = 0;
  float* logits = nullptr;         // [T, E]
  int32_t* expert_ids = nullptr;   // [T, k]
  float* route_weights = nullptr;  // [T, k]
  ExpertGroups groups;
  float* x_f32 = nullptr;           // [T, H] the router input in fp32 (fp32 routers only)
  uint16_t* x_hat = nullptr;        // [T, H] W4A4 gate_up input
  float* x_row_scales = nullptr;    // [T]
  void* act = nullptr;              // [P, I] SwiGLU output: BF16 (W4A16) or fp32 (W4A4, re-quantized)
  uint16_t* act_hat = nullptr;      // [P, I] W4A4 down input
  uint16_t* x_frag = nullptr;       // [T, H] the wgmma gate_up's input in fragment order (nvfp4_layout.h)
  float* act_row_scales = nullptr;  // [P]
  uint16_t* y = nullptr;            // [P, H] down output, BF16
  // moe_decode_block (moe_decode.cuh): its grid barrier {arrived, generation}, its router logits
  // beside their launch's tag, and the next norm's partial sums, one a CTA.
  uint32_t* block_barrier = nullptr;
  unsigned long long* block_logits = nullptr;  // [E]
  float* block_partials = nullptr;      // [hidden / 16]
  uint32_t* block_slot_amax = nullptr;  // [2, DECODE_BLOCK_MAX_TOP_K] per-token W4A4: each slot's SwiGLU row amax (fp32
                                        // bits), a set a launch parity
  // cublas only
  uint16_t* gate_bf16 = nullptr;      // [E, I, H]
  uint16_t* up_bf16 = nullptr;        // [E, I, H]
  uint16_t* down_bf16 = nullptr;      // [E, H, I]
  uint16_t* x_sorted = nullptr;       // [P, H]
  void* gate_up = nullptr;            // [P, 2I] BF16 (W4A16) or fp32 (W4A4), each half × its weight_scale_2
  const void** pointers = nullptr;    // device pointer arrays for the grouped GEMMs (3 · 2E)
  std::vector<int32_t> host_offsets;  // expert_offsets read back

 private:
  template <class T>
  Status alloc(T*& ptr, size_t count);
  std::vector<void*> allocations_;
};

// AUTO takes SKINNY while experts average fewer than this many rows (tokens · top_k / experts; when
// hidden and intermediate allow it), GROUPED_MMA above, WGMMA from AUTO_WGMMA_MOE_MIN_ROWS_PER_EXPERT.
// H200, Qwen3-30B-A3B shapes, W4A16, codes in the GPU layout (docs/lab/perf-notebook.md "Repacked NVFP4 codes"):
// skinny/fused 26/33 µs at T = 1, 121/135 at 16, 190/191 at 64 (4 rows per expert), 206/194 at 96,
// 224/199 at 128, 325/276 at 256; wgmma/fused 483/453 at 512 (32 rows), 493/613 at 768, 686/974 at
// 2,048, 1,845/2,960 at 8,192 (the benchmark routes evenly). End to end (`bench latency`, the
// synthetic checkpoint's skewed routing) wgmma wins from 32 rows: pp512 27,697 tok/s against 20,233
// on fused; fused wins decode at 128 and 256 sequences (7,838 / 10,508 tok/s against skinny's 7,260 / 9,502).
// With the skinny MoE's long warps (docs/lab/perf-notebook.md "Long warps", twenty-first session) skinny wins to
// 8 rows: S_TG b96 8,123 against fused's 7,748, b128 9,244 / 9,074; fused from 12: b192 10,699 /
// 10,520, b256 11,823 / 11,287. With expert weights in line order (docs/lab/perf-notebook.md, "The expert line
// order merged") skinny wins to 16 rows (one build, bound 24 against 10): S_TG b192 12,067 against
// fused's 10,325, b256 13,266 / 11,381; a bound of 40 (pp512's 32 rows on skinny) took pp512 from
// 38,773 to 28,503.
inline constexpr int64_t AUTO_SKINNY_MOE_MAX_ROWS_PER_EXPERT = 24;
// With the copy engine bringing its codes, wgmma beats the grouped mma kernel from 24 rows (pp384
// +64%, H200): skinny below 24 rows, wgmma from 24.
inline constexpr int64_t AUTO_WGMMA_MOE_MIN_ROWS_PER_EXPERT = 24;
// The backend moe_forward runs for `backend` (AUTO resolved; SKINNY falls back to GROUPED_MMA for shapes
// it does not take).
MoeKernel resolve_moe_kernel(MoeKernel backend, int64_t tokens, const DeviceMoeWeights& w);
// The tile height (sorted rows per GEMM tile) the grouping uses for `pairs` rows on the resolved backend.
int moe_grouping_tile_rows(MoeKernel kernels, int64_t pairs, const DeviceMoeWeights& w);

// The next norm fused into the MoE block's combine: residual += the block's output, then
// out = BF16(rmsnorm(residual) · weight) (add_rmsnorm's math), in place of writing the output.
struct ResidualNorm {
  float* residual = nullptr;         // fp32 [tokens, hidden]
  const uint16_t* weight = nullptr;  // BF16 [hidden]
  float eps = 0.0f;
  uint16_t* out = nullptr;  // BF16 [tokens, hidden] (may be the block's own input x)
  NormActQuant quant;       // optional x̂ of out for the next W4A4 GEMM (transformer_ops.cuh)
  // Set by moe_forward when the router computed the block's input norm: the post-attention output
  // not yet in residual, added first — (residual + pending) + output, add_rmsnorm's sum and then the combine's.
  const float* pending = nullptr;
};

// One call of the block. out: fp32 [tokens, hidden] (unused with `norm`); `add` (fp32 [tokens, hidden],
// ERNIE's shared experts) is added to the routed sum when given. GROUPED_MMA, SKINNY, WGMMA and AUTO run
// without host synchronization (CUDA-graph safe); CUBLAS reads the expert counts back to size
// cublasGemmGroupedBatchedEx. x_quantized (W4A4): a norm already wrote x̂ and the row scales into
// ws.x_hat / ws.x_row_scales (NormActQuant with w.gate_up_input_scale in static mode), so the block
// does not quantize x itself. input_norm: the block computes x itself first (input_norm->out == x;
// with x_quantized, its quant writes the x̂ above): inside the router's launch for small batches with
// `norm` (the combine then adds input_norm->delta to the residual), else with add_rmsnorm. Either way
// the same bits.
struct MoeArgs {
  const uint16_t* x = nullptr;  // BF16 [tokens, hidden]
  int64_t tokens = 0;
  formats::ActQuant mode = formats::ActQuant::NONE;
  MoeKernel kernel = MoeKernel::AUTO;
  float* out = nullptr;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;  // the router's logits past the cluster kernel's sizes, and CUBLAS
  const ResidualNorm* norm = nullptr;
  const float* add = nullptr;
  bool x_quantized = false;
  const InputNorm* input_norm = nullptr;
};
Status moe_forward(const DeviceMoeWeights& w, MoeWorkspace& ws, const MoeArgs& args);

}  // namespace nibble::cuda

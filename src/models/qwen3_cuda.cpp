// The Qwen3 / Qwen3-MoE forward on the GPU (reads like qwen3_moe.cpp): embed → per layer (RMSNorm →
// q/k/v → q/k norm + RoPE + KV store → paged attention → o_proj → residual + RMSNorm → MoE or dense
// SwiGLU MLP) → final RMSNorm of the rows that need logits → lm_head. Residual stream fp32, GEMM
// inputs BF16, every op the twin of a ref:: op. ERNIE-4.5-MoE's features (fp32 router with a
// correction bias, shared experts, interleaved RoPE without q/k norm) are here too.
#include "models/qwen3_cuda.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>

#include "core/env.h"
#include "core/log.h"
#include "cuda/attention.cuh"
#include "cuda/check.cuh"
#include "cuda/decode_attention.cuh"
#include "cuda/flashinfer_attention.cuh"
#include "cuda/kernel_trace.h"
#include "cuda/linear_nvfp4.cuh"
#include "cuda/moe.cuh"
#include "cuda/nvfp4_layout.h"
#include "cuda/quantize_nvfp4.cuh"
#include "cuda/step_profiler.cuh"
#include "cuda/transformer_ops.cuh"
#include "ref/ops.h"

namespace nibble::models {
namespace {

using formats::ActQuant;

struct DeviceLinear {
  int64_t out = 0, in = 0;
  bool nvfp4 = false;
  cuda::DeviceNvfp4Weight q;      // nvfp4
  uint16_t* bf16 = nullptr;       // BF16 weight otherwise
  float input_scale = 0.0f;       // static mode (shared inputs: the maximum)
  float kv_scale = 1.0f;          // k_proj / v_proj: the FP8 KV cache's calibrated scale (io::LinearWeights)
};

struct DeviceLayer {
  uint16_t *input_norm = nullptr, *post_norm = nullptr, *q_norm = nullptr, *k_norm = nullptr;
  DeviceLinear q, k, v, o;
  // q, k and v's BF16 copies as one weight [q + k + v rows, in] (null: apart or none): one cuBLAS
  // GEMM for all three where batches take the copies.
  const uint16_t* qkv_bf16 = nullptr;
  bool is_moe = false;
  cuda::DeviceMoeWeights moe;
  bool has_shared = false;      // ERNIE's shared experts: one SwiGLU MLP beside the routed ones
  DeviceLinear shared_gate, shared_up, shared_down;
  DeviceLinear gate, up, down;  // dense MLP layers
};

// Where each array of a step's metadata sits in its block, for a step of T tokens (the padded size
// for a graph): fixed by T, so a graph's captured pointers hold for every replay of its size; the
// block tables last, so a step copies only the rows of its sequences (and the padding row).
class StepLayout {
 public:
  StepLayout(int64_t T, int64_t max_blocks_per_seq) : T_(size_t(T)), per_seq_(size_t(max_blocks_per_seq)) {}
  int32_t* ids(uint8_t* b) const { return reinterpret_cast<int32_t*>(b); }
  int32_t* positions(uint8_t* b) const { return ids(b) + T_; }
  int32_t* token_seq(uint8_t* b) const { return positions(b) + T_; }
  int32_t* rows(uint8_t* b) const { return token_seq(b) + T_; }  // (logits rows: at most T)
  int32_t* decode_rows(uint8_t* b) const { return rows(b) + T_; }
  int64_t* slots(uint8_t* b) const { return reinterpret_cast<int64_t*>(b + align16(5 * 4 * T_)); }
  int4* items(uint8_t* b) const { return reinterpret_cast<int4*>(b + items_at()); }
  int32_t* block_tables(uint8_t* b) const { return reinterpret_cast<int32_t*>(b + items_at() + 16 * T_); }
  // The bytes up to the end of S sequences' block tables and the padding row, or up to the tables'
  // start (a step whose attention does not read them).
  size_t bytes(int64_t S, bool tables) const { return items_at() + 16 * T_ + (tables ? (size_t(S) + 1) * per_seq_ * 4 : 0); }

 private:
  static size_t align16(size_t n) { return (n + 15) / 16 * 16; }
  size_t items_at() const { return align16(align16(5 * 4 * T_) + 8 * T_); }
  size_t T_, per_seq_;
};

}  // namespace

struct CudaModel::Impl {
  std::shared_ptr<const io::LoadedCheckpoint> checkpoint;
  io::ModelConfig config;
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
  float *mlp_gate = nullptr, *mlp_up = nullptr, *logits = nullptr, *shared_out = nullptr;
  uint16_t *h = nullptr, *attn = nullptr, *mlp_act = nullptr, *final_rows = nullptr;
  cuda::GemmContext gemm;
  std::unique_ptr<cuda::MoeWorkspace> moe_ws;
  // Step metadata.
  int32_t *ids = nullptr, *positions = nullptr, *token_seq = nullptr, *block_tables = nullptr, *rows = nullptr;
  int64_t* slots = nullptr;
  int64_t max_blocks_per_seq = 0, step_max_keys = 0;
  float* attention_ws = nullptr;  // split-KV partial results
  float* inv_freq = nullptr;      // RoPE [head_dim / 2], ref::rope_inv_freq
  // Eager steps with prefill chunks: tensor-core items and the decode rows beside them.
  int4* items = nullptr;
  int32_t* decode_rows = nullptr;
  int64_t step_items = 0, step_decode = 0;
  bool step_lists = false;
  // FlashInfer attention for every step (null: the native kernels), its BF16 query input, and the
  // plan each decode graph was captured with (a replay needs the same launch shape).
  std::unique_ptr<cuda::FlashInferAttention> flashinfer;
  uint16_t* q_bf16 = nullptr;
  std::map<int64_t, std::vector<int64_t>> graph_plans;
  // Decode steps of up to one_launch_max_rows rows run the one-launch decode attention (0: never).
  int64_t one_launch_max_rows = 0;
  bool step_one_launch = false;
  // The step metadata lives in one device block, laid out by the step's token count (StepLayout), so
  // that a step uploads it in one copy from one of two pinned host blocks of the same layout: two, as
  // a step is staged while the one before it may still be waiting for its copy (overlapped
  // scheduling). A decode graph's pointers are its size's layout.
  uint8_t* step_block = nullptr;
  cuda::PinnedArray<uint8_t> host_steps[2];
  int host_parity = 0;
  // The tokens the last step drew, by logits row (the runner's sampler writes them): what the
  // pending ids of the next step's batch read (models::pending_token).
  int32_t* drawn = nullptr;
  // Decode graphs by padded batch size. Padding tokens write into the trash block (one past the
  // engine's blocks) through a sequence row of their own.
  std::map<int64_t, cudaGraphExec_t> graphs;
  int32_t trash_block = 0;
  cuda::StepProfiler profiler;  // NIBBLE_DIAG_PROFILE_STEPS=1

  ~Impl() {
    for (auto& [size, graph] : graphs) cudaGraphExecDestroy(graph);
  }
  // KV cache: [layers, blocks, block_size, NKV, D] for K and for V, BF16 values or FP8 codes (options.kv_fp8).
  uint8_t *k_cache = nullptr, *v_cache = nullptr;
  int64_t kv_element_bytes() const { return options.kv_fp8 ? 1 : 2; }
  int64_t n_blocks = 0;
  // Upload bookkeeping.
  uint64_t bytes_uploaded = 0, bytes_total = 0, bf16_copy_bytes = 0;
  int next_quarter = 1;
  std::chrono::steady_clock::time_point upload_start;

  cudaStream_t stream() const { return ctx->stream; }

  // Copies `bytes` of host memory to *dst (allocated first when `allocate`).
  template <class T>
  Status copy(T*& dst, const void* src, size_t bytes, bool allocate, const std::string& what) {
    if (allocate) NIB_RETURN_IF_ERROR(ctx->arena.alloc(dst, (bytes + sizeof(T) - 1) / sizeof(T), what));
    NIB_RETURN_IF_ERROR(cuda::cuda_status(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), what.c_str()));
    bytes_uploaded += bytes;
    if (bytes_total && bytes_uploaded * 4 >= bytes_total * static_cast<uint64_t>(next_quarter)) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - upload_start).count();
      log_info("weights to the GPU: " + std::to_string(next_quarter * 25) + "% (" +
               std::to_string(bytes_uploaded / 1000000000.0).substr(0, 5) + " GB, " +
               std::to_string(s > 0 ? bytes_uploaded / 1e9 / s : 0.0).substr(0, 5) + " GB/s)");
      ++next_quarter;
    }
    return Status::ok();
  }

  Status tensor(uint16_t*& dst, const io::BoundCheckpoint& b, const std::string& name, bool allocate) {
    const io::TensorRef& t = b.tensors.at(name);
    size_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<size_t>(d);
    return copy(dst, t.data, n * 2, allocate, name);
  }

  // Whether dense NVFP4 weights get BF16 copies (the backends that run batches over
  // AUTO_SKINNY_MAX_M rows on cuBLAS).
  bool bf16_copies() const {
    return options.gemm == cuda::GemmBackend::AUTO || options.gemm == cuda::GemmBackend::DEQUANT_CUBLAS;
  }

  // dense_at: where the BF16 copy goes on the first load (null: an allocation of its own).
  Status linear(DeviceLinear& l, const io::BoundCheckpoint& b, const std::string& name, bool allocate,
                uint16_t* dense_at = nullptr) {
    const io::LinearWeights& lw = b.linears.at(name);
    l.out = lw.module.shape[0];
    l.in = lw.module.shape[1];
    l.nvfp4 = lw.module.quantized;
    l.kv_scale = lw.kv_scale;
    const size_t n = static_cast<size_t>(l.out * l.in);
    if (!l.nvfp4) return copy(l.bf16, lw.weight.data, n * 2, allocate, name + ".weight");
    uint8_t* packed = const_cast<uint8_t*>(l.q.packed);
    uint8_t* scales = const_cast<uint8_t*>(l.q.block_scales);
    uint16_t* dense = const_cast<uint16_t*>(l.q.bf16);  // a reload keeps all three buffers
    NIB_RETURN_IF_ERROR(copy(packed, lw.weight.data, n / 2, allocate, name + ".weight"));
    NIB_RETURN_IF_ERROR(copy(scales, lw.weight_scale.data, n / 16, allocate, name + ".weight_scale"));
    NIB_RETURN_IF_ERROR(cuda::repack_nvfp4(packed, scales, n / 16, nullptr));  // after the copies, on their stream
    l.q = {packed, scales, l.out, l.in, lw.weight_scale_2};
    // Batches over AUTO_SKINNY_MAX_M rows run dense NVFP4 weights through cuBLAS in BF16: dequantized
    // here once (the same exact values the per-call dequantize made), and again on a reload.
    if (bf16_copies()) {
      if (allocate && dense_at) dense = dense_at;
      else if (allocate) NIB_RETURN_IF_ERROR(ctx->arena.alloc(dense, n, name + " (BF16 for large batches)"));
      l.q.bf16 = dense;
      NIB_RETURN_IF_ERROR(cuda::dequantize_nvfp4_bf16(l.q, dense, nullptr));  // after the repack, on its stream
      bf16_copy_bytes += n * 2;
    }
    l.input_scale = lw.input_scale;
    return Status::ok();
  }

  // q, k and v; their BF16 copies (when made) side by side in one allocation when all three are NVFP4
  // of one in_features, so that large batches run them as one GEMM.
  Status qkv_linears(DeviceLayer& w, const io::BoundCheckpoint& b, const std::string& prefix, bool allocate) {
    const std::string names[3] = {prefix + "q_proj", prefix + "k_proj", prefix + "v_proj"};
    DeviceLinear* linears[3] = {&w.q, &w.k, &w.v};
    uint16_t* merged = const_cast<uint16_t*>(w.qkv_bf16);
    if (allocate && bf16_copies()) {
      int64_t rows = 0, in = -1;
      bool mergeable = true;
      for (const std::string& name : names) {
        const io::ModuleSpec& m = b.linears.at(name).module;
        mergeable = mergeable && m.quantized && (in < 0 || m.shape[1] == in);
        rows += m.shape[0], in = m.shape[1];
      }
      if (mergeable) NIB_RETURN_IF_ERROR(ctx->arena.alloc(merged, static_cast<size_t>(rows * in), prefix + "qkv (BF16 for large batches)"));
    }
    int64_t offset = 0;
    for (int i = 0; i < 3; ++i) {
      NIB_RETURN_IF_ERROR(linear(*linears[i], b, names[i], allocate, merged ? merged + offset : nullptr));
      offset += linears[i]->out * linears[i]->in;
    }
    w.qkv_bf16 = merged;
    return Status::ok();
  }

  // One projection of every expert, stacked [E, rows, cols]; `kind` is gate_proj, up_proj or down_proj.
  Status experts(cuda::DeviceNvfp4Experts& d, std::vector<float>& host_scales, float& input_scale,
                 const io::BoundCheckpoint& b, const std::string& prefix, const char* kind, bool allocate) {
    const int64_t E = config.num_experts;
    const io::LinearWeights& first = b.linears.at(prefix + "0." + kind);
    if (!first.module.quantized)
      return Status::error(prefix + "*." + kind + " is BF16: the GPU MoE runs NVFP4 experts only");
    const int64_t rows = first.module.shape[0], cols = first.module.shape[1];
    const size_t packed_bytes = static_cast<size_t>(rows * cols / 2), scale_bytes = static_cast<size_t>(rows * cols / 16);
    uint8_t* packed = const_cast<uint8_t*>(d.packed);
    uint8_t* scales = const_cast<uint8_t*>(d.block_scales);
    float* global = const_cast<float*>(d.global_scales);
    if (allocate) {
      NIB_RETURN_IF_ERROR(ctx->arena.alloc(packed, packed_bytes * E, prefix + kind));
      NIB_RETURN_IF_ERROR(ctx->arena.alloc(scales, scale_bytes * E, prefix + kind + " scales"));
      NIB_RETURN_IF_ERROR(ctx->arena.alloc(global, static_cast<size_t>(E), prefix + kind + " global scales"));
    }
    host_scales.assign(static_cast<size_t>(E), 0.0f);
    for (int64_t e = 0; e < E; ++e) {
      const io::LinearWeights& lw = b.linears.at(prefix + std::to_string(e) + "." + kind);
      uint8_t* p = packed + packed_bytes * e;
      uint8_t* s = scales + scale_bytes * e;
      NIB_RETURN_IF_ERROR(copy(p, lw.weight.data, packed_bytes, false, lw.module.name));
      NIB_RETURN_IF_ERROR(copy(s, lw.weight_scale.data, scale_bytes, false, lw.module.name + ".weight_scale"));
      host_scales[static_cast<size_t>(e)] = lw.weight_scale_2;
      input_scale = std::max(input_scale, lw.input_scale);
    }
    // after the copies, on their stream
    NIB_RETURN_IF_ERROR(cuda::repack_nvfp4(packed, scales, scale_bytes * E, nullptr, cuda::expert_line_order(cols)));
    NIB_RETURN_IF_ERROR(cuda::cuda_status(cudaMemcpy(global, host_scales.data(), E * sizeof(float), cudaMemcpyHostToDevice),
                                          "expert global scales"));
    d = {packed, scales, global, E, rows, cols};
    return Status::ok();
  }

  // Every weight to the device in a fixed order; `allocate` on the first load, in place on reloads.
  Status upload(const io::BoundCheckpoint& b, bool allocate) {
    bytes_uploaded = 0, bf16_copy_bytes = 0;
    next_quarter = 1;
    bytes_total = 0;
    for (const io::ModuleSpec& m : b.modules) bytes_total += m.nbytes();
    upload_start = std::chrono::steady_clock::now();
    NIB_RETURN_IF_ERROR(tensor(embed, b, "model.embed_tokens.weight", allocate));
    NIB_RETURN_IF_ERROR(tensor(final_norm, b, "model.norm.weight", allocate));
    if (config.tie_word_embeddings) lm_head = {config.vocab_size, config.hidden_size, false, {}, embed, 0.0f};
    else NIB_RETURN_IF_ERROR(linear(lm_head, b, "lm_head", allocate));
    if (allocate) layers.resize(static_cast<size_t>(config.num_hidden_layers));
    for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
      DeviceLayer& w = layers[static_cast<size_t>(l)];
      const std::string p = "model.layers." + std::to_string(l) + ".";
      NIB_RETURN_IF_ERROR(tensor(w.input_norm, b, p + "input_layernorm.weight", allocate));
      NIB_RETURN_IF_ERROR(tensor(w.post_norm, b, p + "post_attention_layernorm.weight", allocate));
      if (config.qk_norm) {
        NIB_RETURN_IF_ERROR(tensor(w.q_norm, b, p + "self_attn.q_norm.weight", allocate));
        NIB_RETURN_IF_ERROR(tensor(w.k_norm, b, p + "self_attn.k_norm.weight", allocate));
      }
      NIB_RETURN_IF_ERROR(qkv_linears(w, b, p + "self_attn.", allocate));
      NIB_RETURN_IF_ERROR(linear(w.o, b, p + "self_attn.o_proj", allocate));
      // q/k/v read one input: static mode quantizes it once with the largest of their scales.
      w.q.input_scale = w.k.input_scale = w.v.input_scale = std::max({w.q.input_scale, w.k.input_scale, w.v.input_scale});
      w.is_moe = config.is_moe_layer(l);
      if (w.is_moe) {
        cuda::DeviceMoeWeights& m = w.moe;
        const io::LinearWeights& r = b.linears.at(p + "mlp.gate");
        const size_t router_values = static_cast<size_t>(config.num_experts * config.hidden_size);
        if (r.weight.dtype == DType::F32) {  // ERNIE-4.5 keeps it in fp32
          float* router = const_cast<float*>(m.router_f32);
          NIB_RETURN_IF_ERROR(copy(router, r.weight.data, router_values * 4, allocate, p + "mlp.gate.weight"));
          m.router_f32 = router;
        } else {
          uint16_t* router = const_cast<uint16_t*>(m.router);
          NIB_RETURN_IF_ERROR(copy(router, r.weight.data, router_values * 2, allocate, p + "mlp.gate.weight"));
          m.router = router;
        }
        if (config.router_score_bias) {  // fp32 on the device whatever the checkpoint stores
          const std::vector<float> bias = io::read_f32_values(b.tensors.at(p + "mlp.moe_statics.e_score_correction_bias"));
          float* d = const_cast<float*>(m.score_bias);
          NIB_RETURN_IF_ERROR(copy(d, bias.data(), bias.size() * 4, allocate, p + "mlp.moe_statics.e_score_correction_bias"));
          m.score_bias = d;
        }
        m.norm_min = static_cast<float>(config.moe_norm_min);
        m.experts = config.num_experts;
        m.top_k = config.num_experts_per_tok;
        m.hidden = config.hidden_size;
        m.intermediate = config.moe_intermediate_size;
        m.norm_topk_prob = config.norm_topk_prob;
        m.gate_up_input_scale = m.down_input_scale = 0.0f;
        const std::string x = p + "mlp.experts.";
        NIB_RETURN_IF_ERROR(experts(m.gate, m.gate_scales, m.gate_up_input_scale, b, x, "gate_proj", allocate));
        NIB_RETURN_IF_ERROR(experts(m.up, m.up_scales, m.gate_up_input_scale, b, x, "up_proj", allocate));
        NIB_RETURN_IF_ERROR(experts(m.down, m.down_scales, m.down_input_scale, b, x, "down_proj", allocate));
        w.has_shared = config.moe_num_shared_experts > 0;
        if (w.has_shared) {
          NIB_RETURN_IF_ERROR(linear(w.shared_gate, b, p + "mlp.shared_experts.gate_proj", allocate));
          NIB_RETURN_IF_ERROR(linear(w.shared_up, b, p + "mlp.shared_experts.up_proj", allocate));
          NIB_RETURN_IF_ERROR(linear(w.shared_down, b, p + "mlp.shared_experts.down_proj", allocate));
          w.shared_gate.input_scale = w.shared_up.input_scale = std::max(w.shared_gate.input_scale, w.shared_up.input_scale);
        }
      } else {
        NIB_RETURN_IF_ERROR(linear(w.gate, b, p + "mlp.gate_proj", allocate));
        NIB_RETURN_IF_ERROR(linear(w.up, b, p + "mlp.up_proj", allocate));
        NIB_RETURN_IF_ERROR(linear(w.down, b, p + "mlp.down_proj", allocate));
        w.gate.input_scale = w.up.input_scale = std::max(w.gate.input_scale, w.up.input_scale);
      }
    }
    // The repacks ran on the legacy stream, which the runner's non-blocking stream does not wait for.
    NIB_RETURN_IF_ERROR(cuda::cuda_status(cudaStreamSynchronize(nullptr), "weight repack"));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - upload_start).count();
    log_info("weights on the GPU: " + std::to_string(bytes_uploaded / 1e9).substr(0, 6) + " GB in " +
             std::to_string(s).substr(0, 5) + " s (" + std::to_string(s > 0 ? bytes_uploaded / 1e9 / s : 0.0).substr(0, 5) +
             " GB/s)" +
             (bf16_copy_bytes ? ", and " + std::to_string(bf16_copy_bytes / 1e9).substr(0, 5) +
                                    " GB of dense NVFP4 weights in BF16 for batches over " +
                                    std::to_string(cuda::AUTO_SKINNY_MAX_M) + " rows"
                              : std::string()));
    return Status::ok();
  }

  Status workspaces() {
    const int64_t T = options.max_tokens, R = options.max_rows, H = config.hidden_size, D = config.head_dim;
    const int64_t NH = config.num_attention_heads, NKV = config.num_key_value_heads, V = config.vocab_size;
    const int64_t I = config.intermediate_size;
    cuda::DeviceArena& a = ctx->arena;
    NIB_RETURN_IF_ERROR(a.alloc(x, T * H, "the residual stream"));
    NIB_RETURN_IF_ERROR(a.alloc(delta, T * H, "the layer output"));
    NIB_RETURN_IF_ERROR(a.alloc(h, T * H, "the normed activations"));
    // q, k and v apart ([T, width] each) or as one GEMM's rows [T, (NH + 2·NKV)·D]: the same floats.
    NIB_RETURN_IF_ERROR(a.alloc(q, T * (NH + 2 * NKV) * D, "q, k and v"));
    k = q + T * NH * D, v = k + T * NKV * D;
    NIB_RETURN_IF_ERROR(a.alloc(q_rot, T * NH * D, "q after RoPE"));
    NIB_RETURN_IF_ERROR(a.alloc(attn, T * NH * D, "the attention output"));
    const std::vector<float> freq = ref::rope_inv_freq(config.rope_theta, D);
    NIB_RETURN_IF_ERROR(a.alloc(inv_freq, freq.size(), "the RoPE frequencies"));
    NIB_RETURN_IF_ERROR(cuda::cuda_status(cudaMemcpy(inv_freq, freq.data(), freq.size() * sizeof(float), cudaMemcpyHostToDevice),
                                          "the RoPE frequencies"));
    NIB_RETURN_IF_ERROR(a.alloc(final_rows, R * H, "the final norm rows"));
    NIB_RETURN_IF_ERROR(a.alloc(logits, R * V, "the logits"));
    bool any_dense_mlp = false, any_moe = false;
    bool any_shared = false;
    for (const DeviceLayer& l : layers) (l.is_moe ? any_moe : any_dense_mlp) = true, any_shared |= l.has_shared;
    if (any_dense_mlp || any_shared) {  // the shared experts run as a dense MLP of their own width
      const int64_t width = std::max(any_dense_mlp ? I : 0, config.moe_intermediate_size * config.moe_num_shared_experts);
      NIB_RETURN_IF_ERROR(a.alloc(mlp_gate, T * width, "the MLP gate"));
      NIB_RETURN_IF_ERROR(a.alloc(mlp_up, T * width, "the MLP up"));
      NIB_RETURN_IF_ERROR(a.alloc(mlp_act, T * width, "the MLP activation"));
    }
    if (any_shared) NIB_RETURN_IF_ERROR(a.alloc(shared_out, T * H, "the shared experts' output"));
    if (any_moe) {
      const DeviceLayer& first = *std::find_if(layers.begin(), layers.end(), [](const DeviceLayer& l) { return l.is_moe; });
      auto ws = cuda::MoeWorkspace::create(first.moe, T, options.moe == cuda::GemmBackend::DEQUANT_CUBLAS);
      if (!ws) return ws.status();
      moe_ws = std::move(ws.value());
    }
    // Dense NVFP4 GEMMs: the largest weight dequant-cublas must dequantize per call (those without a
    // BF16 copy, see linear()), the largest input for W4A4.
    int64_t max_weight = 0, max_in = 0;
    auto note = [&](const DeviceLinear& l) {
      if (!l.nvfp4) return;
      if (!l.q.bf16) max_weight = std::max(max_weight, l.out * l.in);
      max_in = std::max(max_in, l.in);
    };
    note(lm_head);
    for (const DeviceLayer& l : layers)
      for (const DeviceLinear* d : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down, &l.shared_gate, &l.shared_up, &l.shared_down})
        note(*d);
    gemm.stream = stream();
    gemm.cublas = ctx->cublas;
    if (max_weight > 0 && options.gemm != cuda::GemmBackend::FUSED) {
      NIB_RETURN_IF_ERROR(a.alloc(gemm.workspace, static_cast<size_t>(max_weight), "the dequantized weight"));
      gemm.workspace_elements = static_cast<size_t>(max_weight);
    }
    if (max_in > 0) {
      NIB_RETURN_IF_ERROR(a.alloc(gemm.act_workspace, static_cast<size_t>(T * max_in), "the quantized activations"));
      NIB_RETURN_IF_ERROR(a.alloc(gemm.row_scales, static_cast<size_t>(T), "the activation row scales"));
      gemm.act_workspace_elements = static_cast<size_t>(T * max_in);
    }
    max_blocks_per_seq = (config.max_position_embeddings + options.block_size - 1) / options.block_size;
    const size_t step_bytes = StepLayout(T, max_blocks_per_seq).bytes(options.max_seqs, true);
    NIB_RETURN_IF_ERROR(a.alloc(step_block, step_bytes, "the step metadata"));
    for (cuda::PinnedArray<uint8_t>& h : host_steps) NIB_RETURN_IF_ERROR(h.resize(step_bytes, "the step metadata"));
    NIB_RETURN_IF_ERROR(a.alloc(drawn, R, "drawn tokens"));
    NIB_RETURN_IF_ERROR(cuda::cuda_status(cudaMemset(drawn, 0, static_cast<size_t>(R) * 4), "drawn tokens"));
    // Split-KV steps have fewer than 528 / NKV tokens (cuda::attention_splits), at most 32 splits.
    const int64_t split_tokens = std::min<int64_t>(T, 528);
    NIB_RETURN_IF_ERROR(a.alloc(attention_ws, static_cast<size_t>(cuda::attention_workspace_floats(split_tokens, NH, D, 32)),
                                "the split-KV attention scratch"));
    if (options.flashinfer && cuda::flashinfer_attention_supported(D)) {
      const int64_t S = options.max_seqs;  // decode graphs pad to at most max_seqs requests
      auto fi = cuda::FlashInferAttention::create({NH, NKV, D, options.block_size, options.kv_fp8}, T, S,
                                                  S * max_blocks_per_seq + S, a);
      if (!fi) return fi.status();
      flashinfer = std::move(fi.value());
      NIB_RETURN_IF_ERROR(a.alloc(q_bf16, T * NH * D, "q after RoPE (BF16)"));
      if (cuda::decode_attention_supported(NH, NKV, D, options.block_size) && !options.kv_fp8)
        one_launch_max_rows = std::min({options.one_launch_decode_max_rows, options.max_seqs, T});
    }
    return Status::ok();
  }

  Status run_linear(const DeviceLinear& l, const uint16_t* in, int64_t M, ActQuant mode, float* out,
                    bool in_quantized = false, const float** deferred_row_scales = nullptr) {
    if (deferred_row_scales) *deferred_row_scales = nullptr;
    if (!l.nvfp4) return cuda::linear_bf16(in, M, l.bf16, l.out, l.in, out, ctx->cublas);
    const cuda::GemmBackend backend =
        options.gemm == cuda::GemmBackend::FUSED && M > cuda::FUSED_MAX_M ? cuda::GemmBackend::DEQUANT_CUBLAS : options.gemm;
    if (backend == cuda::GemmBackend::DEQUANT_CUBLAS && !gemm.workspace)
      return Status::error("--gemm-backend fused: this step has more than " + std::to_string(cuda::FUSED_MAX_M) + " rows");
    return cuda::linear_nvfp4(in, M, l.q, mode, l.input_scale, out, backend, gemm, in_quantized, deferred_row_scales);
  }

  // out = down(silu(gate(in)) · up(in)) in the dense activation mode (dense layers, shared experts).
  Status swiglu_mlp(const DeviceLinear& gate, const DeviceLinear& up, const DeviceLinear& down, const uint16_t* in,
                    int64_t T, float* out) {
    const ActQuant mode = options.act_quant_dense;
    const DeviceLinear* gate_up[2] = {&gate, &up};
    float* outputs[2] = {mlp_gate, mlp_up};
    NIB_RETURN_IF_ERROR(run_shared_input(gate_up, outputs, 2, in, T, mode));
    NIB_RETURN_IF_ERROR(cuda::silu_mul_bf16(mlp_gate, mlp_up, T * gate.out, mlp_act, stream()));
    return run_linear(down, mlp_act, T, mode, out);
  }

  // Linears that share their input (and their static input scale, the maximum of theirs: q/k/v,
  // gate/up): one launch where the skinny kernels run.
  Status run_shared_input(const DeviceLinear* const* linears, float* const* outputs, int count, const uint16_t* in,
                          int64_t M, ActQuant mode, bool in_quantized = false) {
    const bool all_nvfp4 = std::all_of(linears, linears + count, [](const DeviceLinear* l) { return l->nvfp4; });
    if (!all_nvfp4 || options.gemm == cuda::GemmBackend::FUSED) {
      for (int i = 0; i < count; ++i) NIB_RETURN_IF_ERROR(run_linear(*linears[i], in, M, mode, outputs[i], in_quantized));
      return Status::ok();
    }
    const cuda::DeviceNvfp4Weight* weights[3];
    for (int i = 0; i < count; ++i) weights[i] = &linears[i]->q;
    return cuda::linear_nvfp4_shared_input(in, M, weights, outputs, count, mode, linears[0]->input_scale, options.gemm, gemm,
                                           in_quantized);
  }

  // q/k/v of `in` into qkv_out: apart, or where batches run the BF16 copies and those are one weight,
  // as one cuBLAS GEMM whose scales (as the GEMM epilogues apply them) qk_norm_rope_store applies.
  Status run_qkv(const DeviceLayer& w, const uint16_t* in, int64_t M, ActQuant mode, bool in_quantized) {
    const int64_t K = w.q.in, rows = w.q.out + w.k.out + w.v.out;
    if (w.qkv_bf16 && cuda::resolve_gemm_backend(options.gemm, M, K) == cuda::GemmBackend::DEQUANT_CUBLAS) {
      const DeviceLinear* qkv[3] = {&w.q, &w.k, &w.v};
      const uint16_t* x = in;
      if (mode != ActQuant::NONE) {  // x̂ and its row scales (static: each row's is input_scale)
        if (!in_quantized)
          NIB_RETURN_IF_ERROR(cuda::quantize_dequantize_activation_bf16(in, M, K, mode == ActQuant::STATIC ? w.q.input_scale : 0.0f,
                                                                        gemm.act_workspace, gemm.row_scales, stream()));
        x = gemm.act_workspace;
      }
      NIB_RETURN_IF_ERROR(cuda::linear_bf16(x, M, w.qkv_bf16, rows, K, q, ctx->cublas));
      qkv_out = {q, q + w.q.out, q + w.q.out + w.k.out, rows, {}, mode == ActQuant::PER_TOKEN ? gemm.row_scales : nullptr};
      for (int i = 0; i < 3; ++i)  // static: the input scale folded in as linear_nvfp4 folds it into alpha
        qkv_out.scale[i] = mode == ActQuant::STATIC ? qkv[i]->q.weight_scale_2 * w.q.input_scale : qkv[i]->q.weight_scale_2;
      return Status::ok();
    }
    const DeviceLinear* qkv[3] = {&w.q, &w.k, &w.v};
    float* outputs[3] = {q, k, v};
    qkv_out = {q, k, v};
    return run_shared_input(qkv, outputs, 3, in, M, mode, in_quantized);
  }

  // W4A4: the norms before q/k/v and before the MoE write x̂ and the row scales beside h (their
  // CTAs hold whole rows), so those GEMMs need no quantize launch; {} where nothing consumes it.
  cuda::NormActQuant qkv_quant(const DeviceLayer& w) const {
    const ActQuant mode = options.act_quant_dense;
    if (mode == ActQuant::NONE || !w.q.nvfp4 || !w.k.nvfp4 || !w.v.nvfp4 || !gemm.act_workspace) return {};
    return {mode == ActQuant::STATIC ? w.q.input_scale : 0.0f, gemm.act_workspace, gemm.row_scales};
  }
  cuda::NormActQuant moe_quant(const DeviceLayer& w) const {
    const ActQuant mode = options.act_quant_moe;
    if (mode == ActQuant::NONE || !w.is_moe) return {};
    return {mode == ActQuant::STATIC ? w.moe.gate_up_input_scale : 0.0f, moe_ws->x_hat, moe_ws->x_row_scales};
  }

  // The step's metadata into pinned buffers, padded to T tokens (padding: token 0 at position 0 of
  // the trash block), then to the device on the stream. The two sets of pinned buffers alternate:
  // the caller waits for a step before staging the one after next, so a copy never reads a buffer
  // being rewritten.
  Status stage(const Batch& batch, int64_t T, int64_t n_rows, bool eager) {
    const int64_t S = static_cast<int64_t>(batch.sequences.size()), bs = options.block_size;
    host_parity ^= 1;
    const StepLayout layout(T, max_blocks_per_seq);
    uint8_t* host = host_steps[host_parity].data();
    int32_t *h_ids = layout.ids(host), *h_positions = layout.positions(host), *h_token_seq = layout.token_seq(host);
    int32_t *h_block_tables = layout.block_tables(host), *h_rows = layout.rows(host), *h_decode_rows = layout.decode_rows(host);
    int64_t* h_slots = layout.slots(host);
    int4* h_items = layout.items(host);
    ids = layout.ids(step_block), positions = layout.positions(step_block), token_seq = layout.token_seq(step_block);
    block_tables = layout.block_tables(step_block), rows = layout.rows(step_block), decode_rows = layout.decode_rows(step_block);
    slots = layout.slots(step_block), items = layout.items(step_block);
    const int64_t G = config.num_attention_heads / config.num_key_value_heads;
    int64_t t = 0;
    step_max_keys = 0;
    // Prefill chunks go to the tensor-core attention in items; decode tokens to the per-token
    // split-KV kernel, or (from tensor_core_decode_min_rows of them) one item each, graph padding
    // included. A graph's choice depends on its size only (its rows are all decode or padding).
    const bool supported = cuda::prefill_attention_supported(config.head_dim, G);
    int64_t decode_count = T - static_cast<int64_t>(batch.token_ids.size());
    for (const BatchSequence& seq : batch.sequences) decode_count += seq.n_tokens == 1;
    // Decode-only steps (graph padding rows are decode rows) of few rows: the one-launch kernel.
    step_one_launch = T <= one_launch_max_rows;
    for (const BatchSequence& seq : batch.sequences) step_one_launch &= seq.n_tokens == 1;
    // Else FlashInfer takes the whole step, graph padding included (one key in the trash block each).
    if (flashinfer && !step_one_launch) {
      flashinfer->clear();
      for (const BatchSequence& seq : batch.sequences)
        NIB_RETURN_IF_ERROR(flashinfer->add(seq.n_tokens, seq.start_position + seq.n_tokens, seq.block_table.data()));
      for (int64_t row = static_cast<int64_t>(batch.token_ids.size()); row < T; ++row)
        NIB_RETURN_IF_ERROR(flashinfer->add(1, 1, &trash_block));
      NIB_RETURN_IF_ERROR(flashinfer->plan(!eager, stream()));
    }
    const bool decode_items = !flashinfer && supported && decode_count >= options.tensor_core_decode_min_rows;
    step_lists = !flashinfer && supported && (eager || decode_items);
    step_items = step_decode = 0;
    if (step_lists) {
      const int64_t per_item = cuda::prefill_item_tokens(G);
      int64_t row = 0;
      for (int64_t s = 0; s < S; ++s) {
        const BatchSequence& seq = batch.sequences[static_cast<size_t>(s)];
        if (seq.n_tokens == 1 && !decode_items) h_decode_rows[step_decode++] = static_cast<int32_t>(row);
        else
          for (int64_t i = 0; i < seq.n_tokens; i += per_item)
            h_items[step_items++] = make_int4(static_cast<int>(s), static_cast<int>(row + i),
                                              static_cast<int>(std::min(per_item, seq.n_tokens - i)),
                                              static_cast<int>(seq.start_position + i));
        row += seq.n_tokens;
      }
      if (decode_items)  // padding rows: the trash sequence S, one key at position 0
        for (; row < T; ++row) h_items[step_items++] = make_int4(static_cast<int>(S), static_cast<int>(row), 1, 0);
    }
    // Only the native attention kernels and the one-launch decode attention read the block tables;
    // FlashInfer reads the page indices its plan uploaded. A table row is max_position_embeddings /
    // block_size entries (10 KB for Qwen3's 40,960 positions): 2.6 MB a 256-sequence step, copied
    // ahead of the step's kernels, for nothing on FlashInfer's steps.
    const bool tables_read = !flashinfer || step_one_launch;
    for (int64_t s = 0; s < S; ++s) {
      const BatchSequence& seq = batch.sequences[static_cast<size_t>(s)];
      const int32_t* table = seq.block_table.data();
      if (tables_read) std::copy(seq.block_table.begin(), seq.block_table.end(), h_block_tables + s * max_blocks_per_seq);
      for (int64_t i = 0; i < seq.n_tokens; ++i, ++t) {
        const int64_t p = seq.start_position + i;
        step_max_keys = std::max(step_max_keys, p + 1);
        h_ids[t] = batch.token_ids[static_cast<size_t>(t)];
        h_positions[t] = static_cast<int32_t>(p);
        h_token_seq[t] = static_cast<int32_t>(s);
        h_slots[t] = int64_t{table[p / bs]} * bs + p % bs;
      }
    }
    if (tables_read) h_block_tables[S * max_blocks_per_seq] = trash_block;
    for (; t < T; ++t) h_ids[t] = 0, h_positions[t] = 0, h_token_seq[t] = static_cast<int32_t>(S), h_slots[t] = int64_t{trash_block} * bs;
    // Rows past the batch's own (graph padding) read their own token.
    const int64_t R = static_cast<int64_t>(batch.logits_rows.size());
    for (int64_t r = 0; r < n_rows; ++r) h_rows[r] = r < R ? static_cast<int32_t>(batch.logits_rows[static_cast<size_t>(r)]) : static_cast<int32_t>(r);
    return cuda::cuda_status(cudaMemcpyAsync(step_block, host, layout.bytes(S, tables_read), cudaMemcpyHostToDevice, stream()), "step metadata");
  }

  Status check_batch(const Batch& batch) const {
    const int64_t T = static_cast<int64_t>(batch.token_ids.size());
    if (T < 1 || T > options.max_tokens)
      return Status::error("batch: " + std::to_string(T) + " tokens (this runner takes 1 to " + std::to_string(options.max_tokens) + ")");
    if (static_cast<int64_t>(batch.logits_rows.size()) > std::min(options.max_rows, T))
      return Status::error("batch: more than " + std::to_string(std::min(options.max_rows, T)) + " rows want logits");
    if (static_cast<int64_t>(batch.sequences.size()) > options.max_seqs)
      return Status::error("batch: more than " + std::to_string(options.max_seqs) + " sequences");
    int64_t total = 0;
    for (const BatchSequence& s : batch.sequences) {
      if (s.n_tokens <= 0 || s.start_position < 0) return Status::error("batch: a sequence has no tokens");
      if (s.start_position + s.n_tokens > static_cast<int64_t>(s.block_table.size()) * options.block_size)
        return Status::error("batch: a sequence's block table is too short for its positions");
      if (static_cast<int64_t>(s.block_table.size()) > max_blocks_per_seq)
        return Status::error("batch: a block table is longer than max_position_embeddings allows");
      for (int32_t block : s.block_table)
        if (block < 0 || block >= n_blocks) return Status::error("batch: block id out of range");
      total += s.n_tokens;
    }
    if (total != T) return Status::error("batch: sequence token counts do not add up to the token ids");
    for (int32_t id : batch.token_ids)
      if (is_pending_token(id) ? pending_row(id) >= options.max_rows : id >= config.vocab_size)
        return Status::error("token id " + std::to_string(id) + " is outside the vocabulary (size " +
                             std::to_string(config.vocab_size) + ") and names no row a step draws");
    for (int64_t r : batch.logits_rows)
      if (r < 0 || r >= T) return Status::error("batch: logits row out of range");
    return Status::ok();
  }

  // A layer's attention half as a kernel chain: q/k/v, q/k norm + RoPE + KV store, attention, o
  // projection into delta.
  Status attention_chain(const DeviceLayer& w, int64_t T, void* kc, void* vc, const cuda::QkvLayout& qkv,
                         const cuda::AttentionBatch& att, const cuda::DecodeAttentionBatch& one_launch, bool qkv_quantized) {
    const float eps = static_cast<float>(config.rms_norm_eps);
    const cudaStream_t s = stream();
    const ActQuant dense = options.act_quant_dense;
    for (int i = 0; i < cuda::op_repeats("qkv"); ++i) NIB_RETURN_IF_ERROR(run_qkv(w, h, T, dense, qkv_quantized));
    profiler.mark("q/k/v projections");
    const bool o_quantized = flashinfer && step_one_launch && dense == ActQuant::STATIC && w.o.nvfp4 && gemm.act_workspace;
    if (flashinfer) {
      for (int i = 0; i < cuda::op_repeats("qk_rope_store"); ++i)
        NIB_RETURN_IF_ERROR(cuda::qk_norm_rope_store(qkv_out, qkv, w.q_norm, w.k_norm, eps, nullptr, kc, vc, s, q_bf16,
                                                     options.kv_fp8 ? cuda::KvFormat::FP8 : cuda::KvFormat::BF16,
                                                     w.k.kv_scale, w.v.kv_scale));
      profiler.mark("q/k norm, RoPE, KV store");
      // Static W4A4: the one-launch kernel writes the o projection's x̂ too (no quantize launch).
      cuda::DecodeAttentionBatch layer_launch = one_launch;
      if (o_quantized) layer_launch.x_hat = gemm.act_workspace, layer_launch.x_hat_global = 1.0f / w.o.input_scale;
      for (int i = 0; i < cuda::op_repeats("attention"); ++i)
        NIB_RETURN_IF_ERROR(step_one_launch ? cuda::decode_attention(q_bf16, static_cast<uint16_t*>(kc), static_cast<uint16_t*>(vc),
                                                                     layer_launch, attn, s)
                                            : flashinfer->run(q_bf16, kc, vc, attn, s, w.k.kv_scale, w.v.kv_scale));
    } else {
      for (int i = 0; i < cuda::op_repeats("qk_rope_store"); ++i)
        NIB_RETURN_IF_ERROR(cuda::qk_norm_rope_store(qkv_out, qkv, w.q_norm, w.k_norm, eps, q_rot, kc, vc, s));
      profiler.mark("q/k norm, RoPE, KV store");
      for (int i = 0; i < cuda::op_repeats("attention"); ++i)
        NIB_RETURN_IF_ERROR(
            cuda::paged_attention(q_rot, static_cast<uint16_t*>(kc), static_cast<uint16_t*>(vc), att, attn, s, attention_ws));
    }
    profiler.mark("attention");
    // Per-token on cuBLAS: delta's row scales are applied by the norm that adds it (delta_row_scales).
    for (int i = 0; i < cuda::op_repeats("o_proj"); ++i)
      NIB_RETURN_IF_ERROR(run_linear(w.o, attn, T, dense, delta, o_quantized, &delta_row_scales));
    profiler.mark("o projection");
    return Status::ok();
  }

  // The layers over T staged tokens; logits for the first R staged rows. No host synchronization:
  // a decode step of each padded size is captured once as a CUDA graph and replayed.
  Status run(int64_t T, int64_t R, int64_t splits) {
    const int64_t H = config.hidden_size, D = config.head_dim, NH = config.num_attention_heads, NKV = config.num_key_value_heads;
    const float eps = static_cast<float>(config.rms_norm_eps);
    const cudaStream_t s = stream();
    const size_t layer_kv = static_cast<size_t>((n_blocks + 1) * options.block_size * NKV * D * kv_element_bytes());  // bytes
    NIB_RETURN_IF_ERROR(cuda::embedding_gather(ids, T, embed, H, x, s, drawn));
    profiler.mark("embedding");
    const cuda::QkvLayout qkv{T, NH, NKV, D, positions, slots, inv_freq, config.rope_style == io::RopeStyle::INTERLEAVED};
    cuda::AttentionBatch att{T, NH, NKV, D, options.block_size, token_seq, positions, block_tables,
                             max_blocks_per_seq, splits};
    const cuda::DecodeAttentionBatch one_launch{T, NH, NKV, D, options.block_size, token_seq, positions, block_tables,
                                                max_blocks_per_seq, cuda::decode_attention_splits(T, NKV, ctx->sms)};
    if (step_lists) {
      att.prefill_items = items, att.n_items = step_items;
      att.decode_tokens = decode_rows, att.n_decode = step_decode;
    }
    bool normed = false;  // whether h already holds this layer's input norm (fused into the MoE combine)
    for (size_t l = 0; l < layers.size(); ++l) {
      const DeviceLayer& w = layers[l];
      // x += the previous layer's MLP output, then the input norm.
      const cuda::NormActQuant qkv_in = qkv_quant(w);  // written by whichever norm makes h
      if (!normed)
        NIB_RETURN_IF_ERROR(cuda::add_rmsnorm(x, l == 0 ? nullptr : delta, T, H, w.input_norm, eps, h, s, nullptr, qkv_in));
      profiler.mark("norms");
      uint8_t* kc = k_cache + l * layer_kv;
      uint8_t* vc = v_cache + l * layer_kv;
      NIB_RETURN_IF_ERROR(attention_chain(w, T, kc, vc, qkv, att, one_launch, qkv_in.x_hat != nullptr));
      const cuda::NormActQuant moe_in = moe_quant(w);
      // A MoE block without shared experts (which read h before it) runs its own input norm: inside
      // its router's launch for small batches, one launch fewer a decode step.
      const bool block_norm = w.is_moe && !w.has_shared;
      if (!block_norm)
        for (int i = 0; i < cuda::op_repeats("post_norm"); ++i)
          NIB_RETURN_IF_ERROR(cuda::add_rmsnorm(x, delta, T, H, w.post_norm, eps, h, s, nullptr, moe_in, delta_row_scales));
      profiler.mark("norms");
      normed = w.is_moe;
      if (w.is_moe) {
        // x += the block's output and the next norm (the next layer's, or the final one) in its combine.
        const bool last = l + 1 == layers.size();
        const cuda::ResidualNorm next{x, last ? final_norm : layers[l + 1].input_norm, eps, h,
                                      last ? cuda::NormActQuant{} : qkv_quant(layers[l + 1])};
        if (w.has_shared) {
          NIB_RETURN_IF_ERROR(swiglu_mlp(w.shared_gate, w.shared_up, w.shared_down, h, T, shared_out));
          profiler.mark("shared experts");
        }
        const cuda::InputNorm input{x, delta, w.post_norm, eps, h, moe_in, delta_row_scales};
        NIB_RETURN_IF_ERROR(cuda::moe_forward(h, T, w.moe, options.act_quant_moe, options.moe, *moe_ws, delta, s,
                                              ctx->cublas, &next, w.has_shared ? shared_out : nullptr, moe_in.x_hat != nullptr,
                                              block_norm ? &input : nullptr));
        profiler.mark("MoE block");
      } else {
        NIB_RETURN_IF_ERROR(swiglu_mlp(w.gate, w.up, w.down, h, T, delta));
        profiler.mark("dense MLP");
      }
    }
    if (R == 0) return Status::ok();
    // x += the last MLP output (the normed copy in h is unused), then the final norm of the rows
    // that need logits, then the lm_head (W4A16 when it is NVFP4, as the CPU reference runs it).
    if (!normed) NIB_RETURN_IF_ERROR(cuda::add_rmsnorm(x, delta, T, H, final_norm, eps, h, s));
    NIB_RETURN_IF_ERROR(cuda::add_rmsnorm(x, nullptr, R, H, final_norm, eps, final_rows, s, rows));
    profiler.mark("norms");
    NIB_RETURN_IF_ERROR(run_linear(lm_head, final_rows, R, ActQuant::NONE, logits));
    profiler.mark("lm_head");
    return Status::ok();
  }

  // The graph size a decode batch of B sequences replays, or 0 for an eager step.
  int64_t graph_size(const Batch& batch) const {
    const int64_t B = static_cast<int64_t>(batch.sequences.size());
    if (graphs.empty() || static_cast<int64_t>(batch.token_ids.size()) != B || static_cast<int64_t>(batch.logits_rows.size()) != B)
      return 0;
    for (int64_t r = 0; r < B; ++r)
      if (batch.logits_rows[static_cast<size_t>(r)] != r) return 0;
    auto it = graphs.lower_bound(B);
    return it == graphs.end() ? 0 : it->first;
  }

  Status forward(const Batch& batch) {
    if (!k_cache) return Status::error("the KV cache is not allocated");
    NIB_RETURN_IF_ERROR(check_batch(batch));
    const int64_t T = static_cast<int64_t>(batch.token_ids.size()), R = static_cast<int64_t>(batch.logits_rows.size());
    if (const int64_t padded = graph_size(batch)) {
      NIB_RETURN_IF_ERROR(stage(batch, padded, padded, false));
      // FlashInfer's graph plans depend on the request count only; should one ever differ from the
      // captured launch shape, the step runs eagerly (after this step's copies, so nothing overlaps).
      auto captured = graph_plans.find(padded);
      if (!flashinfer || step_one_launch || (captured != graph_plans.end() && captured->second == flashinfer->plan_info())) {
        if (cuda::kernel_trace_active())
          cuda::kernel_trace_label("decode graph of " + std::to_string(padded) + " (" + std::to_string(T) + " sequences)");
        return cuda::cuda_status(cudaGraphLaunch(graphs.at(padded), stream()), "replaying the decode graph");
      }
      log_warn("FlashInfer's plan for a decode batch of " + std::to_string(padded) + " differs from its graph's: running eagerly");
      NIB_RETURN_IF_ERROR(ctx->synchronize());
    }
    NIB_RETURN_IF_ERROR(stage(batch, T, R, true));
    // A kind per step size: a mixed step's ops apart from a prompt's alone at the same size (the names
    // built only when profiling or tracing: this is every step's path).
    const bool decode_only = static_cast<int64_t>(batch.sequences.size()) == T;
    if (profiler.enabled())
      profiler.begin(stream(), (decode_only ? "decode of " : "prefill/mixed of ") + std::to_string(T) + " tokens");
    if (cuda::kernel_trace_active())
      cuda::kernel_trace_label((decode_only ? "eager decode of " : "prefill/mixed of ") + std::to_string(T) + " tokens (" +
                               std::to_string(batch.sequences.size()) + " sequences)");
    const int64_t per_token = step_lists ? step_decode : T;  // tokens of the per-token kernel
    NIB_RETURN_IF_ERROR(run(T, R, cuda::attention_splits(per_token, config.num_key_value_heads, step_max_keys)));
    return profiler.finish();
  }

  // Captures the decode step for each batch size (vLLM's list: 1, 2, 4, then every 8) up to max_batch.
  Status capture_graphs(int64_t max_batch) {
    std::vector<int64_t> sizes = {1, 2, 4};
    for (int64_t b = 8; b <= max_batch; b += 8) sizes.push_back(b);
    std::string captured;
    for (int64_t B : sizes) {
      if (B > max_batch || B > options.max_tokens || B > options.max_rows || B > options.max_seqs) break;
      Batch dummy;  // all padding: staged buffers get valid contents for the capture
      NIB_RETURN_IF_ERROR(stage(dummy, B, B, false));
      NIB_RETURN_IF_ERROR(ctx->synchronize());
      if (flashinfer && !step_one_launch) graph_plans[B] = flashinfer->plan_info();
      cudaGraph_t graph = nullptr;
      NIB_RETURN_IF_ERROR(cuda::cuda_status(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal), "graph capture"));
      const Status ran = run(B, B, cuda::attention_splits(B, config.num_key_value_heads, 0));
      const cudaError_t ended = cudaStreamEndCapture(stream(), &graph);
      if (!ran || ended != cudaSuccess) {
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError();
        log_warn("decode graphs stop at batch " + std::to_string(B) + ": " +
                 (!ran ? ran.message() : std::string(cudaGetErrorString(ended))) + " (larger batches run eagerly)");
        break;
      }
      cudaGraphExec_t exec = nullptr;
      const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
      cudaGraphDestroy(graph);
      NIB_RETURN_IF_ERROR(cuda::cuda_status(made, "instantiating a decode graph"));
      graphs[B] = exec;
      captured += (captured.empty() ? "" : ",") + std::to_string(B);
    }
    log_info("CUDA graphs captured for decode batch sizes " + (captured.empty() ? std::string("(none)") : captured));
    return ctx->synchronize();
  }
};

Status cuda_model_supports(const io::BoundCheckpoint& b) {
  const io::ModelConfig& c = b.config;
  const auto& archs = io::supported_architectures();
  if (std::find(archs.begin(), archs.end(), c.architecture) == archs.end())
    return Status::error("the CUDA runner does not run architecture '" + c.architecture + "'");
  const bool moe = c.num_experts > 0;
  if (c.hidden_size % 64 != 0 || (moe && c.moe_intermediate_size % 64 != 0))
    return Status::error("the GPU kernels need hidden_size and moe_intermediate_size to be multiples of 64 (this "
                         "checkpoint: " + std::to_string(c.hidden_size) + ", " + std::to_string(c.moe_intermediate_size) + ")");
  if (c.head_dim % 2 != 0 || c.head_dim > 256 || c.num_attention_heads % c.num_key_value_heads != 0 ||
      c.num_attention_heads / c.num_key_value_heads > 16)
    return Status::error("the GPU attention needs an even head_dim ≤ 256 and at most 16 query heads per KV head");
  for (const io::ModuleSpec& m : b.modules)
    if ((m.role == io::ModuleRole::EXPERT_GATE || m.role == io::ModuleRole::EXPERT_UP || m.role == io::ModuleRole::EXPERT_DOWN) &&
        !m.quantized)
      return Status::error(m.name + " is BF16: the GPU MoE runs NVFP4 experts only");
  return Status::ok();
}

CudaModel::CudaModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaModel::~CudaModel() {
  if (!cuda::kernel_trace_active()) return;
  (void)impl_->ctx->synchronize();
  if (Status written = cuda::kernel_trace_finish(); !written) log_warn(written.message());
}

Result<std::unique_ptr<CudaModel>> CudaModel::create(std::shared_ptr<const io::LoadedCheckpoint> checkpoint,
                                                     const CudaModelOptions& options, cuda::DeviceContext& ctx) {
  const io::ModelConfig& c = checkpoint->bound.config;
  NIB_RETURN_IF_ERROR(cuda_model_supports(checkpoint->bound));
  // Before the upload: only FlashInfer's FA2 kernels read an FP8 cache.
  if (options.kv_fp8 && !(options.flashinfer && cuda::flashinfer_attention_supported(c.head_dim, true)))
    return Status::error("--kv-cache-dtype fp8 needs FlashInfer attention with head_dim 128 (this model: head_dim " +
                         std::to_string(c.head_dim) + (options.flashinfer ? ")" : ", --attention-backend native)"));
  auto impl = std::make_unique<Impl>();
  impl->checkpoint = checkpoint;
  impl->config = c;
  impl->options = options;
  impl->ctx = &ctx;
  if (env_flag("NIBBLE_DIAG_PROFILE_STEPS")) impl->profiler.enable();
  NIB_RETURN_IF_ERROR(impl->upload(checkpoint->bound, true));
  NIB_RETURN_IF_ERROR(impl->workspaces());
  // After the upload (its copies are not of interest), before the decode graphs are captured.
  if (Status traced = cuda::kernel_trace_start_from_env(); !traced) log_warn(traced.message());
  return std::unique_ptr<CudaModel>(new CudaModel(std::move(impl)));
}

const io::ModelConfig& CudaModel::config() const { return impl_->config; }

int64_t CudaModel::kv_bytes_per_block() const {
  const io::ModelConfig& c = impl_->config;
  return 2 * c.num_hidden_layers * impl_->options.block_size * c.num_key_value_heads * c.head_dim * impl_->kv_element_bytes();
}

Status CudaModel::allocate_kv_cache(int64_t n_blocks) {
  if (impl_->k_cache) return Status::error("the KV cache is already allocated");
  // One more block than the engine sees: where padding tokens of a replayed graph write.
  const size_t bytes = static_cast<size_t>(kv_bytes_per_block() / 2) * static_cast<size_t>(n_blocks + 1);  // K, and V
  NIB_RETURN_IF_ERROR(impl_->ctx->arena.alloc(impl_->k_cache, bytes, "the KV cache (K)"));
  NIB_RETURN_IF_ERROR(impl_->ctx->arena.alloc(impl_->v_cache, bytes, "the KV cache (V)"));
  impl_->n_blocks = n_blocks;
  impl_->trash_block = static_cast<int32_t>(n_blocks);
  return Status::ok();
}

Status CudaModel::capture_decode_graphs(int64_t max_batch) {
  if (impl_->profiler.enabled()) {
    log_info("NIBBLE_DIAG_PROFILE_STEPS=1: every step runs eagerly, timed op by op");
    return Status::ok();
  }
  return impl_->capture_graphs(max_batch);
}

std::string CudaModel::profile_report() const { return impl_->profiler.report(); }

int64_t CudaModel::n_kv_blocks() const { return impl_->n_blocks; }

Status CudaModel::reload(std::shared_ptr<const io::LoadedCheckpoint> checkpoint) {
  NIB_RETURN_IF_ERROR(impl_->ctx->synchronize());
  NIB_RETURN_IF_ERROR(impl_->upload(checkpoint->bound, false));
  impl_->checkpoint = std::move(checkpoint);
  return Status::ok();
}

Status CudaModel::forward(const Batch& batch) { return impl_->forward(batch); }

const float* CudaModel::logits() const { return impl_->logits; }

int32_t* CudaModel::drawn_tokens() { return impl_->drawn; }

}  // namespace nibble::models

// The decoder's forward on the GPU (reads like decoder_cpu.cpp): embed → per layer (RMSNorm → q/k/v →
// q/k norm + RoPE + KV store → paged attention → o_proj → residual + RMSNorm → MoE or dense SwiGLU
// MLP) → final RMSNorm of the rows that need logits → lm_head. Residual stream fp32, GEMM inputs
// BF16, every op the twin of a ref:: op; ERNIE-4.5-MoE's features (fp32 router with a correction
// bias, shared experts, interleaved RoPE without q/k norm) are config switches.
#include "models/decoder_cuda.h"
#include "models/rope.h"

#include <algorithm>

#include "core/env.h"
#include "core/log.h"
#include "cuda/attention/attention.cuh"
#include "cuda/common/check.cuh"
#include "cuda/diagnostics/kernel_trace.h"
#include "cuda/gemm/skinny_qkv_rope.cuh"
#include "cuda/nvfp4/quantize_nvfp4.cuh"
#include "ref/ops.h"

namespace nibble::models {

using formats::ActQuant;

Result<std::unique_ptr<CudaModel>> CudaDecoder::create(std::shared_ptr<const io::LoadedCheckpoint> checkpoint,
                                                       const CudaModelOptions& options, cuda::DeviceContext& ctx) {
  const io::ModelConfig& c = checkpoint->bound.config;
  NIB_RETURN_IF_ERROR(supports(checkpoint->bound));
  // Before the upload: only FlashInfer's FA2 kernels read an FP8 cache.
  if (options.kv_fp8 && !(options.flashinfer && cuda::flashinfer_attention_supported(c.head_dim, true)))
    return Status::error("--kv-cache-dtype fp8 needs FlashInfer attention with head_dim 128 (this model: head_dim " +
                         std::to_string(c.head_dim) + (options.flashinfer ? ")" : ", --attention-backend native)"));
  std::unique_ptr<CudaDecoder> m(new CudaDecoder());
  m->checkpoint = checkpoint;
  m->config_ = rank_config(checkpoint->bound);
  if (auto it = checkpoint->rank_modules.find("model.embed_tokens"); it != checkpoint->rank_modules.end())
    m->vocab_begin = it->second.begin;
  m->options = options;
  m->ctx = &ctx;
  if (env_flag("NIBBLE_DIAG_PROFILE_STEPS")) m->profiler.enable();
  NIB_RETURN_IF_ERROR(m->upload(*checkpoint, true));
  NIB_RETURN_IF_ERROR(m->workspaces());
  // After the upload (its copies are not of interest), before the decode graphs are captured.
  if (Status traced = cuda::kernel_trace_start_from_env(); !traced) log_warn(traced.message());
  return std::unique_ptr<CudaModel>(std::move(m));
}

CudaDecoder::~CudaDecoder() {
  if (!cuda::kernel_trace_active()) return;
  (void)ctx->synchronize();
  if (Status written = cuda::kernel_trace_finish(); !written) log_warn(written.message());
}

int64_t CudaDecoder::kv_bytes_per_block() const {
  const io::ModelConfig& c = config_;
  return 2 * c.num_hidden_layers * options.block_size * c.num_key_value_heads * c.head_dim * kv_element_bytes();
}

Status CudaDecoder::allocate_kv_cache(int64_t n_kv_blocks) {
  if (k_cache) return Status::error("the KV cache is already allocated");
  // One more block than the engine sees: where padding tokens of a replayed graph write.
  const size_t bytes =
      static_cast<size_t>(kv_bytes_per_block() / 2) * static_cast<size_t>(n_kv_blocks + 1);  // K, and V
  NIB_RETURN_IF_ERROR(ctx->arena.alloc(k_cache, bytes, "the KV cache (K)"));
  NIB_RETURN_IF_ERROR(ctx->arena.alloc(v_cache, bytes, "the KV cache (V)"));
  n_blocks = n_kv_blocks;
  step.set_kv_blocks(n_kv_blocks);
  return Status::ok();
}

Status CudaDecoder::reload(std::shared_ptr<const io::LoadedCheckpoint> next) {
  NIB_RETURN_IF_ERROR(ctx->synchronize());
  NIB_RETURN_IF_ERROR(upload(*next, false));
  checkpoint = std::move(next);
  return Status::ok();
}

Status CudaDecoder::workspaces() {
  const int64_t T = options.max_tokens, R = options.max_rows, H = config_.hidden_size, D = config_.head_dim;
  const int64_t NH = config_.num_attention_heads, NKV = config_.num_key_value_heads, V = config_.vocab_size;
  const int64_t I = config_.intermediate_size;
  cuda::DeviceArena& a = ctx->arena;
  NIB_RETURN_IF_ERROR(a.alloc(x, T * H, "the residual stream"));
  NIB_RETURN_IF_ERROR(a.alloc(delta, T * H, "the layer output"));
  NIB_RETURN_IF_ERROR(a.alloc(h, T * H, "the normed activations"));
  // q, k and v apart ([T, width] each) or as one GEMM's rows [T, (NH + 2·NKV)·D]: the same floats.
  NIB_RETURN_IF_ERROR(a.alloc(q, T * (NH + 2 * NKV) * D, "q, k and v"));
  k = q + T * NH * D, v = k + T * NKV * D;
  NIB_RETURN_IF_ERROR(a.alloc(q_rot, T * NH * D, "q after RoPE"));
  NIB_RETURN_IF_ERROR(a.alloc(attn, T * NH * D, "the attention output"));
  const ref::Rope rope = rope_for(config_);
  const std::vector<float>& freq = rope.inv_freq;
  rope_scaling = rope.attention_scaling;
  NIB_RETURN_IF_ERROR(a.alloc(inv_freq, freq.size(), "the RoPE frequencies"));
  NIB_RETURN_IF_ERROR(cuda::cuda_status(
      cudaMemcpy(inv_freq, freq.data(), freq.size() * sizeof(float), cudaMemcpyHostToDevice), "the RoPE frequencies"));
  NIB_RETURN_IF_ERROR(a.alloc(final_rows, R * H, "the final norm rows"));
  NIB_RETURN_IF_ERROR(a.alloc(logits_, R * V, "the logits"));
  if (parallel()) {
    const int64_t n = options.collectives->size();
    NIB_RETURN_IF_ERROR(a.alloc(logits_part, R * vocab_rows, "the rank's logits"));
    NIB_RETURN_IF_ERROR(a.alloc(logits_gathered, n * R * vocab_rows, "every rank's logits"));
    NIB_RETURN_IF_ERROR(a.alloc(row_amax, T, "the rows' amax"));
  }
  bool any_dense_mlp = false, any_moe = false;
  bool any_shared = false;
  for (const DeviceLayer& l : layers) (l.is_moe ? any_moe : any_dense_mlp) = true, any_shared |= l.has_shared;
  if (any_dense_mlp || any_shared) {  // the shared experts run as a dense MLP of their own width
    const int64_t width =
        std::max(any_dense_mlp ? I : 0, config_.moe_intermediate_size * config_.moe_num_shared_experts);
    NIB_RETURN_IF_ERROR(a.alloc(mlp_gate, T * width, "the MLP gate"));
    NIB_RETURN_IF_ERROR(a.alloc(mlp_up, T * width, "the MLP up"));
    NIB_RETURN_IF_ERROR(a.alloc(mlp_act, T * width, "the MLP activation"));
  }
  if (any_shared) NIB_RETURN_IF_ERROR(a.alloc(shared_out, T * H, "the shared experts' output"));
  if (any_moe) {
    const DeviceLayer& first =
        *std::find_if(layers.begin(), layers.end(), [](const DeviceLayer& l) { return l.is_moe; });
    auto ws = cuda::MoeWorkspace::create(first.moe, T, options.moe == MoeKernel::CUBLAS);
    if (!ws) return ws.status();
    moe_ws = std::move(ws.value());
  }
  // Dense NVFP4 GEMMs: the largest weight cublas must dequantize per call (those without a
  // BF16 copy, see linear()), the largest input for W4A4.
  int64_t max_weight = 0, max_in = 0;
  auto note = [&](const DeviceLinear& l) {
    if (!l.nvfp4) return;
    if (!l.q.bf16) max_weight = std::max(max_weight, l.out * l.in);
    max_in = std::max(max_in, l.in);
  };
  note(lm_head);
  for (const DeviceLayer& l : layers)
    for (const DeviceLinear* d :
         {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down, &l.shared_gate, &l.shared_up, &l.shared_down})
      note(*d);
  gemm.stream = stream();
  gemm.cublas = ctx->cublas;
  if (max_weight > 0 && options.gemm != DenseKernel::GEMV) {
    NIB_RETURN_IF_ERROR(a.alloc(gemm.workspace, static_cast<size_t>(max_weight), "the dequantized weight"));
    gemm.workspace_elements = static_cast<size_t>(max_weight);
  }
  if (max_in > 0) {
    NIB_RETURN_IF_ERROR(a.alloc(gemm.act_workspace, static_cast<size_t>(T * max_in), "the quantized activations"));
    NIB_RETURN_IF_ERROR(a.alloc(gemm.row_scales, static_cast<size_t>(T), "the activation row scales"));
    gemm.act_workspace_elements = static_cast<size_t>(T * max_in);
  }
  max_blocks_per_seq = (config_.context_length() + options.block_size - 1) / options.block_size;
  NIB_RETURN_IF_ERROR(a.alloc(drawn, R, "drawn tokens"));
  NIB_RETURN_IF_ERROR(cuda::cuda_status(cudaMemset(drawn, 0, static_cast<size_t>(R) * 4), "drawn tokens"));
  // Split-KV steps have fewer than 528 / NKV tokens (cuda::attention_splits), at most 32 splits.
  const int64_t split_tokens = std::min<int64_t>(T, 528);
  NIB_RETURN_IF_ERROR(a.alloc(attention_ws,
                              static_cast<size_t>(cuda::attention_workspace_floats(split_tokens, NH, D, 32)),
                              "the split-KV attention scratch"));
  if (options.flashinfer && cuda::flashinfer_attention_supported(D)) {
    const int64_t S = options.max_seqs;  // decode graphs pad to at most max_seqs requests
    auto fi = cuda::FlashInferAttention::create({NH, NKV, D, options.block_size, options.kv_fp8}, T, S,
                                                S * max_blocks_per_seq + S, a);
    if (!fi) return fi.status();
    flashinfer = std::move(fi.value());
    NIB_RETURN_IF_ERROR(a.alloc(q_bf16, T * NH * D, "q after RoPE (BF16)"));
  }
  StepLimits limits{T, R, options.max_seqs, options.block_size, max_blocks_per_seq, NH / NKV, D, config_.vocab_size};
  if (flashinfer && cuda::decode_attention_supported(NH, NKV, D, options.block_size) && !options.kv_fp8)
    limits.one_launch_max_rows = std::min({options.one_launch_decode_max_rows, options.max_seqs, T});
  limits.one_launch_max_keys = options.one_launch_decode_max_keys;
  limits.tensor_core_decode_min_rows = options.tensor_core_decode_min_rows;
  return step.init(limits, a);
}

Status CudaDecoder::run_linear(const DeviceLinear& l, const uint16_t* in, int64_t M, ActQuant mode, float* out,
                               bool in_quantized, const float** deferred_row_scales) {
  if (deferred_row_scales) *deferred_row_scales = nullptr;
  if (!l.nvfp4) return cuda::linear_bf16(in, M, l.bf16, l.out, l.in, out, ctx->cublas);
  const DenseKernel backend =
      options.gemm == DenseKernel::GEMV && M > cuda::GEMV_MAX_M ? DenseKernel::CUBLAS : options.gemm;
  if (backend == DenseKernel::CUBLAS && !gemm.workspace)
    return Status::error("--gemm-backend gemv: this step has more than " + std::to_string(cuda::GEMV_MAX_M) + " rows");
  return cuda::linear_nvfp4(in, M, l.q, mode, l.input_scale, out, backend, gemm, in_quantized, deferred_row_scales);
}

// out = down(silu(gate(in)) · up(in)) in the dense activation mode (dense layers, shared experts).
Status CudaDecoder::swiglu_mlp(const DeviceLinear& gate, const DeviceLinear& up, const DeviceLinear& down,
                               const uint16_t* in, int64_t T, float* out) {
  const ActQuant mode = options.act_quant_dense;
  const DeviceLinear* gate_up[2] = {&gate, &up};
  float* outputs[2] = {mlp_gate, mlp_up};
  NIB_RETURN_IF_ERROR(run_shared_input(gate_up, outputs, 2, in, T, mode));
  NIB_RETURN_IF_ERROR(cuda::silu_mul_bf16(mlp_gate, mlp_up, T * gate.out, mlp_act, stream()));
  bool quantized = false;
  NIB_RETURN_IF_ERROR(row_parallel_input(down, mlp_act, T, mode, quantized));
  return run_linear(down, mlp_act, T, mode, out, quantized);
}

// Linears that share their input (and their static input scale, the maximum of theirs: q/k/v,
// gate/up): one launch where the skinny kernels run.
Status CudaDecoder::run_shared_input(const DeviceLinear* const* linears, float* const* outputs, int count,
                                     const uint16_t* in, int64_t M, ActQuant mode, bool in_quantized) {
  const bool all_nvfp4 = std::all_of(linears, linears + count, [](const DeviceLinear* l) { return l->nvfp4; });
  if (!all_nvfp4 || options.gemm == DenseKernel::GEMV) {
    for (int i = 0; i < count; ++i) NIB_RETURN_IF_ERROR(run_linear(*linears[i], in, M, mode, outputs[i], in_quantized));
    return Status::ok();
  }
  const cuda::DeviceNvfp4Weight* weights[3];
  for (int i = 0; i < count; ++i) weights[i] = &linears[i]->q;
  return cuda::linear_nvfp4_shared_input(in, M, weights, outputs, count, mode, linears[0]->input_scale, options.gemm,
                                         gemm, in_quantized);
}

// q/k/v of `in` into qkv_out: apart, or where batches run the BF16 copies and those are one weight,
// as one cuBLAS GEMM whose scales (as the GEMM epilogues apply them) qk_norm_rope_store applies.
Status CudaDecoder::run_qkv(const DeviceLayer& w, const uint16_t* in, int64_t M, ActQuant mode, bool in_quantized) {
  const int64_t K = w.q.in, rows = w.q.out + w.k.out + w.v.out;
  if (w.qkv_bf16 && cuda::resolve_dense_kernel(options.gemm, M, K) == DenseKernel::CUBLAS) {
    const DeviceLinear* qkv[3] = {&w.q, &w.k, &w.v};
    const uint16_t* x = in;
    if (mode != ActQuant::NONE) {  // x̂ and its row scales (static: each row's is input_scale)
      if (!in_quantized)
        NIB_RETURN_IF_ERROR(cuda::quantize_dequantize_activation_bf16(in, M, K,
                                                                      mode == ActQuant::STATIC ? w.q.input_scale : 0.0f,
                                                                      gemm.act_workspace, gemm.row_scales, stream()));
      x = gemm.act_workspace;
    }
    NIB_RETURN_IF_ERROR(cuda::linear_bf16(x, M, w.qkv_bf16, rows, K, q, ctx->cublas));
    qkv_out = {q,    q + w.q.out, q + w.q.out + w.k.out,
               rows, {},          mode == ActQuant::PER_TOKEN ? gemm.row_scales : nullptr};
    for (int i = 0; i < 3; ++i)  // static: the input scale folded in as linear_nvfp4 folds it into alpha
      qkv_out.scale[i] =
          mode == ActQuant::STATIC ? qkv[i]->q.weight_scale_2 * w.q.input_scale : qkv[i]->q.weight_scale_2;
    return Status::ok();
  }
  const DeviceLinear* qkv[3] = {&w.q, &w.k, &w.v};
  float* outputs[3] = {q, k, v};
  qkv_out = {q, k, v};
  return run_shared_input(qkv, outputs, 3, in, M, mode, in_quantized);
}

// W4A4: the norms before q/k/v and before the MoE write x̂ and the row scales beside h (their
// CTAs hold whole rows), so those GEMMs need no quantize launch; {} where nothing consumes it.
cuda::NormActQuant CudaDecoder::qkv_quant(const DeviceLayer& w) const {
  const ActQuant mode = options.act_quant_dense;
  if (mode == ActQuant::NONE || !w.q.nvfp4 || !w.k.nvfp4 || !w.v.nvfp4 || !gemm.act_workspace) return {};
  return {mode == ActQuant::STATIC ? w.q.input_scale : 0.0f, gemm.act_workspace, gemm.row_scales};
}
cuda::NormActQuant CudaDecoder::moe_quant(const DeviceLayer& w) const {
  const ActQuant mode = options.act_quant_moe;
  if (mode == ActQuant::NONE || !w.is_moe) return {};
  return {mode == ActQuant::STATIC ? w.moe.gate_up_input_scale : 0.0f, moe_ws->x_hat, moe_ws->x_row_scales};
}

// Whether this step's q/k/v run as one skinny launch with the q/k norm, RoPE and KV store in its
// epilogue (skinny_qkv_rope_store): few tokens on the skinny kernel, FlashInfer's BF16 q, and in W4A4
// x̂ already made by the norm before it.
bool CudaDecoder::qkv_rope_in_gemm(const DeviceLayer& w, int64_t T, ActQuant mode, bool qkv_quantized) const {
  return flashinfer && w.q.nvfp4 && w.k.nvfp4 && w.v.nvfp4 && (mode == ActQuant::NONE || qkv_quantized) &&
         cuda::skinny_qkv_rope_supported(T, w.q.in, config_.head_dim) &&
         cuda::resolve_dense_kernel(options.gemm, T, w.q.in) == DenseKernel::SKINNY;
}

// A layer's attention half as a kernel chain: q/k/v, q/k norm + RoPE + KV store, attention, o
// projection into delta.
Status CudaDecoder::attention_chain(const DeviceLayer& w, int64_t T, void* kc, void* vc, const cuda::QkvLayout& qkv,
                                    const cuda::AttentionBatch& att, const cuda::DecodeAttentionBatch& one_launch,
                                    bool qkv_quantized) {
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const cudaStream_t s = stream();
  const ActQuant dense = options.act_quant_dense;
  const cuda::KvFormat kv_format = options.kv_fp8 ? cuda::KvFormat::FP8 : cuda::KvFormat::BF16;
  const bool rope_in_gemm = qkv_rope_in_gemm(w, T, dense, qkv_quantized);
  if (rope_in_gemm) {
    const cuda::DeviceNvfp4Weight* weights[3] = {&w.q.q, &w.k.q, &w.v.q};
    const bool w4a4 = dense != ActQuant::NONE;  // x̂ and its row scales from the norm (qkv_quant)
    const cuda::QkvRopeStore out{qkv, w.q_norm, w.k_norm, eps, q_bf16, kc, vc, kv_format, w.k.kv_scale, w.v.kv_scale};
    for (int i = 0; i < cuda::op_repeats("qkv"); ++i)
      NIB_RETURN_IF_ERROR(cuda::skinny_qkv_rope_store(w4a4 ? gemm.act_workspace : h, T, weights,
                                                      w4a4 ? gemm.row_scales : nullptr, out, s));
    profiler.mark("q/k/v projections, q/k norm, RoPE, KV store");
  } else {
    for (int i = 0; i < cuda::op_repeats("qkv"); ++i) NIB_RETURN_IF_ERROR(run_qkv(w, h, T, dense, qkv_quantized));
    profiler.mark("q/k/v projections");
  }
  const bool o_quantized =
      flashinfer && step.staged().one_launch && dense == ActQuant::STATIC && w.o.nvfp4 && gemm.act_workspace;
  if (flashinfer) {
    if (!rope_in_gemm) {
      for (int i = 0; i < cuda::op_repeats("qk_rope_store"); ++i)
        NIB_RETURN_IF_ERROR(cuda::qk_norm_rope_store(qkv_out, qkv, w.q_norm, w.k_norm, eps, nullptr, kc, vc, s, q_bf16,
                                                     kv_format, w.k.kv_scale, w.v.kv_scale));
      profiler.mark("q/k norm, RoPE, KV store");
    }
    // Static W4A4: the one-launch kernel writes the o projection's x̂ too (no quantize launch).
    cuda::DecodeAttentionBatch layer_launch = one_launch;
    if (o_quantized) layer_launch.x_hat = gemm.act_workspace, layer_launch.x_hat_global = 1.0f / w.o.input_scale;
    for (int i = 0; i < cuda::op_repeats("attention"); ++i)
      NIB_RETURN_IF_ERROR(step.staged().one_launch
                              ? cuda::decode_attention(q_bf16, static_cast<uint16_t*>(kc), static_cast<uint16_t*>(vc),
                                                       layer_launch, attn, s)
                              : flashinfer->run(q_bf16, kc, vc, attn, s, w.k.kv_scale, w.v.kv_scale));
  } else {
    for (int i = 0; i < cuda::op_repeats("qk_rope_store"); ++i)
      NIB_RETURN_IF_ERROR(cuda::qk_norm_rope_store(qkv_out, qkv, w.q_norm, w.k_norm, eps, q_rot, kc, vc, s));
    profiler.mark("q/k norm, RoPE, KV store");
    for (int i = 0; i < cuda::op_repeats("attention"); ++i)
      NIB_RETURN_IF_ERROR(cuda::paged_attention(q_rot, static_cast<uint16_t*>(kc), static_cast<uint16_t*>(vc), att,
                                                attn, s, attention_ws));
  }
  profiler.mark("attention");
  bool exchanged = false;  // a tensor-parallel rank's per-token x̂ of the whole rows' amax
  NIB_RETURN_IF_ERROR(row_parallel_input(w.o, attn, T, dense, exchanged));
  // Per-token on cuBLAS: delta's row scales are applied by the norm that adds it (delta_row_scales);
  // on tensor-parallel ranks they are the same on every rank, so the unscaled partials sum as well.
  for (int i = 0; i < cuda::op_repeats("o_proj"); ++i)
    NIB_RETURN_IF_ERROR(run_linear(w.o, attn, T, dense, delta, o_quantized || exchanged, &delta_row_scales));
  profiler.mark("o projection");
  return Status::ok();
}

// The layers over T staged tokens; logits_ for the first R staged rows. No host synchronization:
// a decode step of each padded size is captured once as a CUDA graph and replayed.
Status CudaDecoder::run(int64_t T, int64_t R, int64_t splits) {
  const int64_t H = config_.hidden_size, D = config_.head_dim, NH = config_.num_attention_heads,
                NKV = config_.num_key_value_heads;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const cudaStream_t s = stream();
  const size_t layer_kv =
      static_cast<size_t>((n_blocks + 1) * options.block_size * NKV * D * kv_element_bytes());  // bytes
  const StagedStep& st = step.staged();
  // Rank 0's sampler drew the pending ids: every rank reads them (on the device, in the graphs too).
  if (parallel()) NIB_RETURN_IF_ERROR(options.collectives->broadcast(drawn, options.max_rows * 4, s));
  NIB_RETURN_IF_ERROR(cuda::embedding_gather(st.ids, T, embed, H, x, s, drawn, vocab_begin, vocab_rows));
  NIB_RETURN_IF_ERROR(all_reduce(x, T * H));
  profiler.mark("embedding");
  const cuda::QkvLayout qkv{
      T, NH, NKV, D, st.positions, st.slots, inv_freq, config_.rope_style == io::RopeStyle::INTERLEAVED, rope_scaling};
  cuda::AttentionBatch att{
      T, NH, NKV, D, options.block_size, st.token_seq, st.positions, st.block_tables, max_blocks_per_seq, splits};
  const cuda::DecodeAttentionBatch one_launch{T,
                                              NH,
                                              NKV,
                                              D,
                                              options.block_size,
                                              st.token_seq,
                                              st.positions,
                                              st.block_tables,
                                              max_blocks_per_seq,
                                              cuda::decode_attention_splits(T, NKV, ctx->sms)};
  if (st.lists) {
    att.prefill_items = st.items, att.n_items = st.n_items;
    att.decode_tokens = st.decode_rows, att.n_decode = st.n_decode;
  }
  bool normed = false;  // whether h already holds this layer's input norm (fused into the MoE combine)
  for (size_t l = 0; l < layers.size(); ++l) {
    const DeviceLayer& w = layers[l];
    // x += the previous layer's MLP output, then the input norm.
    const cuda::NormActQuant qkv_in = qkv_quant(w);  // written by whichever norm makes h
    if (!normed)
      NIB_RETURN_IF_ERROR(
          cuda::add_rmsnorm(x, l == 0 ? nullptr : delta, T, H, w.input_norm, eps, h, s, nullptr, qkv_in));
    profiler.mark("norms");
    uint8_t* kc = k_cache + l * layer_kv;
    uint8_t* vc = v_cache + l * layer_kv;
    NIB_RETURN_IF_ERROR(attention_chain(w, T, kc, vc, qkv, att, one_launch, qkv_in.x_hat != nullptr));
    NIB_RETURN_IF_ERROR(all_reduce(delta, T * H));
    const cuda::NormActQuant moe_in = moe_quant(w);
    // A MoE block without shared experts (which read h before it) runs its own input norm: inside
    // its router's launch for small batches, one launch fewer a decode step. Not on tensor-parallel
    // ranks: their block output is a partial sum, all-reduced before the residual takes it.
    const bool block_norm = w.is_moe && !w.has_shared && !parallel();
    if (!block_norm)
      for (int i = 0; i < cuda::op_repeats("post_norm"); ++i)
        NIB_RETURN_IF_ERROR(
            cuda::add_rmsnorm(x, delta, T, H, w.post_norm, eps, h, s, nullptr, moe_in, delta_row_scales));
    profiler.mark("norms");
    normed = w.is_moe && !parallel();
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
      NIB_RETURN_IF_ERROR(cuda::moe_forward(w.moe, *moe_ws,
                                            {.x = h,
                                             .tokens = T,
                                             .mode = options.act_quant_moe,
                                             .kernel = options.moe,
                                             .out = delta,
                                             .stream = s,
                                             .cublas = ctx->cublas,
                                             .norm = parallel() ? nullptr : &next,
                                             .add = w.has_shared ? shared_out : nullptr,
                                             .x_quantized = moe_in.x_hat != nullptr,
                                             .input_norm = block_norm ? &input : nullptr}));
      profiler.mark("MoE block");
    } else {
      NIB_RETURN_IF_ERROR(swiglu_mlp(w.gate, w.up, w.down, h, T, delta));
      profiler.mark("dense MLP");
    }
    NIB_RETURN_IF_ERROR(all_reduce(delta, T * H));  // routed and shared experts' partial sums together
  }
  if (R == 0) return Status::ok();
  // x += the last MLP output (the normed copy in h is unused), then the final norm of the rows
  // that need logits_, then the lm_head (W4A16 when it is NVFP4, as the CPU reference runs it).
  if (!normed) NIB_RETURN_IF_ERROR(cuda::add_rmsnorm(x, delta, T, H, final_norm, eps, h, s));
  NIB_RETURN_IF_ERROR(cuda::add_rmsnorm(x, nullptr, R, H, final_norm, eps, final_rows, s, st.rows));
  profiler.mark("norms");
  NIB_RETURN_IF_ERROR(run_linear(lm_head, final_rows, R, ActQuant::NONE, parallel() ? logits_part : logits_));
  if (parallel()) NIB_RETURN_IF_ERROR(gather_logits(R));
  profiler.mark("lm_head");
  return Status::ok();
}

Status CudaDecoder::all_reduce(float* data, int64_t count) {
  return parallel() ? options.collectives->all_reduce_sum(data, count, stream()) : Status::ok();
}

Status CudaDecoder::row_parallel_input(const DeviceLinear& l, const uint16_t* in, int64_t M, ActQuant mode,
                                       bool& quantized) {
  quantized = false;
  if (!parallel() || mode != ActQuant::PER_TOKEN || !l.nvfp4 || !gemm.act_workspace) return Status::ok();
  NIB_RETURN_IF_ERROR(cuda::row_amax_bf16(in, M, l.in, row_amax, stream()));
  NIB_RETURN_IF_ERROR(options.collectives->all_reduce_max(row_amax, M, stream()));
  NIB_RETURN_IF_ERROR(
      cuda::quantize_dequantize_activation_bf16_of_amax(in, M, l.in, row_amax, gemm.act_workspace, gemm.row_scales,
                                                        stream()));
  quantized = true;
  return Status::ok();
}

// Each rank's [R, vocab_rows] gathered as [rank, R, vocab_rows], then laid out as [R, vocab] (exact:
// each logit is computed whole on one rank).
Status CudaDecoder::gather_logits(int64_t R) {
  const int64_t n = options.collectives->size(), V = config_.vocab_size, Vr = vocab_rows;
  NIB_RETURN_IF_ERROR(options.collectives->all_gather(logits_part, logits_gathered, R * Vr * 4, stream()));
  for (int64_t r = 0; r < n; ++r)
    NIB_RETURN_IF_ERROR(cuda::cuda_status(
        cudaMemcpy2DAsync(logits_ + r * Vr, static_cast<size_t>(V) * 4, logits_gathered + r * R * Vr,
                          static_cast<size_t>(Vr) * 4, static_cast<size_t>(Vr) * 4, static_cast<size_t>(R),
                          cudaMemcpyDeviceToDevice, stream()),
        "laying out the gathered logits"));
  return Status::ok();
}

std::vector<int64_t> CudaDecoder::attention_plan() const {
  return flashinfer && !step.staged().one_launch ? flashinfer->plan_info() : std::vector<int64_t>{};
}

Status CudaDecoder::forward(const Batch& batch) {
  if (!k_cache) return Status::error("the KV cache is not allocated");
  NIB_RETURN_IF_ERROR(step.check(batch));
  const int64_t T = static_cast<int64_t>(batch.token_ids.size()), R = static_cast<int64_t>(batch.logits_rows.size());
  if (const int64_t padded = graphs.size_for(batch)) {
    NIB_RETURN_IF_ERROR(step.stage(batch, padded, padded, false, flashinfer.get(), stream()));
    // FlashInfer's graph plans depend on the request count only; should one ever differ from the
    // captured launch shape, the step runs eagerly (after this step's copies, so nothing overlaps).
    const std::vector<int64_t> plan = attention_plan();
    if (graphs.has(padded, plan)) {
      if (cuda::kernel_trace_active())
        cuda::kernel_trace_label("decode graph of " + std::to_string(padded) + " (" + std::to_string(T) +
                                 " sequences)");
      return graphs.replay(padded, plan, stream());
    }
    log_warn("FlashInfer's plan for a decode batch of " + std::to_string(padded) +
             " differs from its graph's: running eagerly");
    NIB_RETURN_IF_ERROR(ctx->synchronize());
  }
  NIB_RETURN_IF_ERROR(step.stage(batch, T, R, true, flashinfer.get(), stream()));
  // A kind per step size: a mixed step's ops apart from a prompt's alone at the same size (the names
  // built only when profiling or tracing: this is every step's path).
  const bool decode_only = static_cast<int64_t>(batch.sequences.size()) == T;
  if (profiler.enabled())
    profiler.begin(stream(), (decode_only ? "decode of " : "prefill/mixed of ") + std::to_string(T) + " tokens");
  if (cuda::kernel_trace_active())
    cuda::kernel_trace_label((decode_only ? "eager decode of " : "prefill/mixed of ") + std::to_string(T) +
                             " tokens (" + std::to_string(batch.sequences.size()) + " sequences)");
  const StagedStep& st = step.staged();
  const int64_t per_token = st.lists ? st.n_decode : T;  // tokens of the per-token kernel
  NIB_RETURN_IF_ERROR(run(T, R, cuda::attention_splits(per_token, config_.num_key_value_heads, st.max_keys)));
  return profiler.finish();
}

Status CudaDecoder::capture_decode_graphs(int64_t max_batch) {
  if (profiler.enabled()) {
    log_info("NIBBLE_DIAG_PROFILE_STEPS=1: every step runs eagerly, timed op by op");
    return Status::ok();
  }
  if (parallel() && !options.collectives->capturable()) return Status::ok();  // ranks sharing a GPU: eager
  const int64_t limit = std::min({max_batch, options.max_tokens, options.max_rows, options.max_seqs});
  // Sizes that run the one-launch attention also get a graph of FlashInfer's for long contexts.
  const int64_t long_limit = flashinfer ? std::min(limit, options.one_launch_decode_max_rows) : 0;
  return graphs.capture(
      limit, long_limit, stream(),
      [&](int64_t B, bool long_context) {
        Batch padding;  // all padding: staged buffers get valid contents for the capture
        return step.stage(padding, B, B, false, flashinfer.get(), stream(), long_context);
      },
      [&] { return attention_plan(); },
      [&](int64_t B) { return run(B, B, cuda::attention_splits(B, config_.num_key_value_heads, 0)); });
}

}  // namespace nibble::models

// The decoder's weights to the GPU (decoder_cuda.h): dense linears repacked into the GPU NVFP4 layout
// (with BF16 copies where large batches run cuBLAS), experts stacked per layer, norms and the router
// as they are; a reload copies a checkpoint of the same layout into the same buffers.
#include <algorithm>
#include <chrono>

#include "core/log.h"
#include "cuda/common/check.cuh"
#include "cuda/attention/flashinfer_attention.cuh"
#include "cuda/nvfp4/nvfp4_layout.h"
#include "models/decoder_cuda.h"

namespace nibble::models {

io::ModelConfig rank_config(const io::BoundCheckpoint& b) {
  io::ModelConfig c = b.config;
  const auto rows = [&](const std::string& name) {
    const auto it = b.linears.find(name);
    return it == b.linears.end() ? int64_t(-1) : it->second.module.shape[0];
  };
  if (const int64_t q = rows("model.layers.0.self_attn.q_proj"); q > 0) c.num_attention_heads = q / c.head_dim;
  if (const int64_t k = rows("model.layers.0.self_attn.k_proj"); k > 0) c.num_key_value_heads = k / c.head_dim;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".mlp.";
    if (const int64_t e = rows(p + "experts.0.gate_proj"); e > 0 && c.is_moe_layer(l)) c.moe_intermediate_size = e;
    if (const int64_t d = rows(p + "gate_proj"); d > 0 && !c.is_moe_layer(l)) c.intermediate_size = d;
  }
  return c;
}

Status CudaDecoder::supports(const io::BoundCheckpoint& b) {
  const io::ModelConfig c = rank_config(b);
  const bool moe = c.num_experts > 0;
  const bool rank = c.moe_intermediate_size != b.config.moe_intermediate_size;
  if (c.hidden_size % 64 != 0 || (moe && c.moe_intermediate_size % 64 != 0))
    return Status::error("the GPU kernels need hidden_size and moe_intermediate_size to be multiples of 64 (this " +
                         std::string(rank ? "tensor-parallel rank's share" : "checkpoint") + ": " +
                         std::to_string(c.hidden_size) + ", " + std::to_string(c.moe_intermediate_size) + ")" +
                         (rank ? "; --enable-expert-parallel keeps the experts whole" : ""));
  if (c.head_dim % 2 != 0 || c.head_dim > 256 || c.num_attention_heads % c.num_key_value_heads != 0 ||
      c.num_attention_heads / c.num_key_value_heads > 16)
    return Status::error("the GPU attention needs an even head_dim ≤ 256 and at most 16 query heads per KV head");
  for (const io::ModuleSpec& m : b.modules)
    if ((m.role == io::ModuleRole::EXPERT_GATE || m.role == io::ModuleRole::EXPERT_UP ||
         m.role == io::ModuleRole::EXPERT_DOWN) &&
        !m.quantized)
      return Status::error(m.name + " is BF16: the GPU MoE runs NVFP4 experts only");
  return Status::ok();
}

// Copies `bytes` of host memory to *dst (allocated first when `allocate`).
template <class T>
Status CudaDecoder::copy(T*& dst, const void* src, size_t bytes, bool allocate, const std::string& what) {
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

Status CudaDecoder::tensor(uint16_t*& dst, const io::BoundCheckpoint& b, const std::string& name, bool allocate) {
  const io::TensorRef& t = b.tensors.at(name);
  size_t n = 1;
  for (int64_t d : t.shape) n *= static_cast<size_t>(d);
  return copy(dst, t.data, n * 2, allocate, name);
}

// Whether dense NVFP4 weights get BF16 copies (the backends that run batches over
// AUTO_SKINNY_MAX_M rows on cuBLAS).
bool CudaDecoder::bf16_copies() const {
  return options.gemm == DenseKernel::AUTO || options.gemm == DenseKernel::CUBLAS;
}

// dense_at: where the BF16 copy goes on the first load (null: an allocation of its own).
Status CudaDecoder::linear(DeviceLinear& l, const io::BoundCheckpoint& b, const std::string& name, bool allocate,
                           uint16_t* dense_at) {
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
    if (allocate && dense_at)
      dense = dense_at;
    else if (allocate)
      NIB_RETURN_IF_ERROR(ctx->arena.alloc(dense, n, name + " (BF16 for large batches)"));
    l.q.bf16 = dense;
    NIB_RETURN_IF_ERROR(cuda::dequantize_nvfp4_bf16(l.q, dense, nullptr));  // after the repack, on its stream
    bf16_copy_bytes += n * 2;
  }
  l.input_scale = lw.input_scale;
  return Status::ok();
}

// q, k and v; their BF16 copies (when made) side by side in one allocation when all three are NVFP4
// of one in_features, so that large batches run them as one GEMM.
Status CudaDecoder::qkv_linears(DeviceLayer& w, const io::BoundCheckpoint& b, const std::string& prefix,
                                bool allocate) {
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
    if (mergeable)
      NIB_RETURN_IF_ERROR(
          ctx->arena.alloc(merged, static_cast<size_t>(rows * in), prefix + "qkv (BF16 for large batches)"));
  }
  int64_t offset = 0;
  for (int i = 0; i < 3; ++i) {
    NIB_RETURN_IF_ERROR(linear(*linears[i], b, names[i], allocate, merged ? merged + offset : nullptr));
    offset += linears[i]->out * linears[i]->in;
  }
  w.qkv_bf16 = merged;
  return Status::ok();
}

// One projection of experts [begin, begin + count) (every expert, or a rank's under expert
// parallelism), stacked [count, rows, cols]; `kind` is gate_proj, up_proj or down_proj.
Status CudaDecoder::experts(cuda::DeviceNvfp4Experts& d, std::vector<float>& host_scales, float& input_scale,
                            const io::BoundCheckpoint& b, const std::string& prefix, const char* kind, int64_t begin,
                            int64_t count, bool allocate) {
  const int64_t E = count;
  const io::LinearWeights& first = b.linears.at(prefix + std::to_string(begin) + "." + kind);
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
    const io::LinearWeights& lw = b.linears.at(prefix + std::to_string(begin + e) + "." + kind);
    uint8_t* p = packed + packed_bytes * e;
    uint8_t* s = scales + scale_bytes * e;
    NIB_RETURN_IF_ERROR(copy(p, lw.weight.data, packed_bytes, false, lw.module.name));
    NIB_RETURN_IF_ERROR(copy(s, lw.weight_scale.data, scale_bytes, false, lw.module.name + ".weight_scale"));
    host_scales[static_cast<size_t>(e)] = lw.weight_scale_2;
    input_scale = std::max(input_scale, lw.input_scale);
  }
  // after the copies, on their stream
  NIB_RETURN_IF_ERROR(cuda::repack_nvfp4(packed, scales, scale_bytes * E, nullptr, cuda::expert_line_order(cols)));
  NIB_RETURN_IF_ERROR(cuda::cuda_status(
      cudaMemcpy(global, host_scales.data(), E * sizeof(float), cudaMemcpyHostToDevice), "expert global scales"));
  d = {packed, scales, global, E, rows, cols};
  return Status::ok();
}

// Every weight to the device in a fixed order; `allocate` on the first load, in place on reloads.
Status CudaDecoder::upload(const io::LoadedCheckpoint& c, bool allocate) {
  const io::BoundCheckpoint& b = c.bound;
  bytes_uploaded = 0, bf16_copy_bytes = 0;
  next_quarter = 1;
  bytes_total = 0;
  for (const io::ModuleSpec& m : b.modules) bytes_total += m.nbytes();
  upload_start = std::chrono::steady_clock::now();
  NIB_RETURN_IF_ERROR(tensor(embed, b, "model.embed_tokens.weight", allocate));
  vocab_rows = b.tensors.at("model.embed_tokens.weight").shape[0];  // the rank's rows (all on one GPU)
  NIB_RETURN_IF_ERROR(tensor(final_norm, b, "model.norm.weight", allocate));
  if (config_.tie_word_embeddings)
    lm_head = {vocab_rows, config_.hidden_size, false, {}, embed, 0.0f};
  else
    NIB_RETURN_IF_ERROR(linear(lm_head, b, "lm_head", allocate));
  if (allocate) layers.resize(static_cast<size_t>(config_.num_hidden_layers));
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    DeviceLayer& w = layers[static_cast<size_t>(l)];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    NIB_RETURN_IF_ERROR(tensor(w.input_norm, b, p + "input_layernorm.weight", allocate));
    NIB_RETURN_IF_ERROR(tensor(w.post_norm, b, p + "post_attention_layernorm.weight", allocate));
    if (config_.qk_norm) {
      NIB_RETURN_IF_ERROR(tensor(w.q_norm, b, p + "self_attn.q_norm.weight", allocate));
      NIB_RETURN_IF_ERROR(tensor(w.k_norm, b, p + "self_attn.k_norm.weight", allocate));
    }
    NIB_RETURN_IF_ERROR(qkv_linears(w, b, p + "self_attn.", allocate));
    NIB_RETURN_IF_ERROR(linear(w.o, b, p + "self_attn.o_proj", allocate));
    // q/k/v read one input: static mode quantizes it once with the largest of their scales.
    w.q.input_scale = w.k.input_scale = w.v.input_scale = std::max({w.q.input_scale, w.k.input_scale, w.v.input_scale});
    w.is_moe = config_.is_moe_layer(l);
    if (w.is_moe) {
      cuda::DeviceMoeWeights& m = w.moe;
      const io::LinearWeights& r = b.linears.at(p + "mlp.gate");
      const size_t router_values = static_cast<size_t>(config_.num_experts * config_.hidden_size);
      if (r.weight.dtype == DType::F32) {  // ERNIE-4.5 keeps it in fp32
        float* router = const_cast<float*>(m.router_f32);
        NIB_RETURN_IF_ERROR(copy(router, r.weight.data, router_values * 4, allocate, p + "mlp.gate.weight"));
        m.router_f32 = router;
      } else {
        uint16_t* router = const_cast<uint16_t*>(m.router);
        NIB_RETURN_IF_ERROR(copy(router, r.weight.data, router_values * 2, allocate, p + "mlp.gate.weight"));
        m.router = router;
      }
      if (config_.router_score_bias) {  // fp32 on the device whatever the checkpoint stores
        const std::vector<float> bias =
            io::read_f32_values(b.tensors.at(p + "mlp.moe_statics.e_score_correction_bias"));
        float* d = const_cast<float*>(m.score_bias);
        NIB_RETURN_IF_ERROR(
            copy(d, bias.data(), bias.size() * 4, allocate, p + "mlp.moe_statics.e_score_correction_bias"));
        m.score_bias = d;
      }
      m.norm_min = static_cast<float>(config_.moe_norm_min);
      m.experts = config_.num_experts;
      m.top_k = config_.num_experts_per_tok;
      m.hidden = config_.hidden_size;
      m.intermediate = config_.moe_intermediate_size;
      m.norm_topk_prob = config_.norm_topk_prob;
      m.gate_up_input_scale = m.down_input_scale = 0.0f;
      const std::string x = p + "mlp.experts.";
      // The rank's experts: all, or under expert parallelism a contiguous share (the others' absent).
      int64_t begin = 0, count = 0;
      for (int64_t e = 0; e < config_.num_experts; ++e)
        if (b.linears.count(x + std::to_string(e) + ".gate_proj")) begin = count ? begin : e, ++count;
      if (count == 0) return Status::error(x + "*: no expert of this layer in the checkpoint");
      m.expert_begin = begin;
      NIB_RETURN_IF_ERROR(experts(m.gate, m.gate_scales, m.gate_up_input_scale, b, x, "gate_proj", begin, count,
                                  allocate));
      NIB_RETURN_IF_ERROR(experts(m.up, m.up_scales, m.gate_up_input_scale, b, x, "up_proj", begin, count, allocate));
      NIB_RETURN_IF_ERROR(
          experts(m.down, m.down_scales, m.down_input_scale, b, x, "down_proj", begin, count, allocate));
      // Static W4A4 under expert parallelism: every rank quantizes with the maxima over all the
      // layer's experts, as one GPU does.
      if (auto it = c.all_experts_input_scales.find(l); it != c.all_experts_input_scales.end())
        m.gate_up_input_scale = it->second.gate_up, m.down_input_scale = it->second.down;
      w.has_shared = config_.moe_num_shared_experts > 0;
      if (w.has_shared) {
        NIB_RETURN_IF_ERROR(linear(w.shared_gate, b, p + "mlp.shared_experts.gate_proj", allocate));
        NIB_RETURN_IF_ERROR(linear(w.shared_up, b, p + "mlp.shared_experts.up_proj", allocate));
        NIB_RETURN_IF_ERROR(linear(w.shared_down, b, p + "mlp.shared_experts.down_proj", allocate));
        w.shared_gate.input_scale = w.shared_up.input_scale =
            std::max(w.shared_gate.input_scale, w.shared_up.input_scale);
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
           std::to_string(s).substr(0, 5) + " s (" +
           std::to_string(s > 0 ? bytes_uploaded / 1e9 / s : 0.0).substr(0, 5) + " GB/s)" +
           (bf16_copy_bytes ? ", and " + std::to_string(bf16_copy_bytes / 1e9).substr(0, 5) +
                                  " GB of dense NVFP4 weights in BF16 for batches over " +
                                  std::to_string(cuda::AUTO_SKINNY_MAX_M) + " rows"
                            : std::string()));
  return Status::ok();
}

}  // namespace nibble::models

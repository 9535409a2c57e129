// The decoder (Qwen3, Qwen3-MoE, ERNIE-4.5-MoE) on the CPU reference ops; reads like transformers'
// modeling_qwen3_moe.py:
// embed → per layer (RMSNorm → attention with q/k norm and RoPE → residual → RMSNorm → MoE or
// dense SwiGLU MLP → residual) → final RMSNorm → lm_head. Weight views are prepared once at load.
// ERNIE-4.5-MoE (modeling_ernie4_5_moe.py) runs through the same code with its config's features:
// no q/k norm, interleaved RoPE, an fp32 router with a score-correction bias, shared experts.
#include "models/decoder_cpu.h"

#include <algorithm>

#include "formats/bf16.h"
#include "ref/attention.h"
#include "ref/moe.h"
#include "models/rope.h"
#include "ref/ops.h"

namespace nibble::models {
namespace {

using formats::ActQuant;

struct Linear {
  std::string name;
  ref::LinearWeight weight;
  float input_scale = 0.0f;  // the checkpoint's (static mode); shared inputs use the max
  float kv_scale = 1.0f;     // k_proj / v_proj: the FP8 KV cache's calibrated scale (io::LinearWeights)
};

struct LayerWeights {
  int64_t index = 0;
  const uint16_t* input_norm = nullptr;
  const uint16_t* post_attention_norm = nullptr;
  const uint16_t* q_norm = nullptr;
  const uint16_t* k_norm = nullptr;
  Linear q, k, v, o;
  bool is_moe = false;
  ref::MoeWeights moe;
  std::vector<float> score_bias;  // ERNIE's correction bias as fp32 (it may be stored in BF16)
  bool has_shared = false;
  Linear shared_gate, shared_up, shared_down;  // ERNIE's shared experts: one SwiGLU MLP
  std::vector<std::string> expert_names;       // "…mlp.experts.E." per expert, for the input observer
  Linear gate, up, down;                       // dense MLP
  std::vector<uint16_t> placed_router;         // ModelOptions::router_placer's rows (BF16 routers) ...
  std::vector<float> placed_router_f32;        // ... or fp32 ones
};

const uint16_t* bf16_data(const io::BoundCheckpoint& b, const std::string& tensor) {
  return reinterpret_cast<const uint16_t*>(b.tensors.at(tensor).data);
}

Linear make_linear(const io::BoundCheckpoint& b, const std::string& name) {
  const io::LinearWeights& lw = b.linears.at(name);
  Linear l;
  l.name = name;
  l.kv_scale = lw.kv_scale;
  l.weight.out_features = lw.module.shape[0];
  l.weight.in_features = lw.module.shape[1];
  if (lw.module.quantized) {
    l.weight.nvfp4 = {lw.weight.data, lw.weight_scale.data, l.weight.out_features, l.weight.in_features,
                      lw.weight_scale_2};
    l.input_scale = lw.input_scale;
  } else {
    l.weight.bf16 = reinterpret_cast<const uint16_t*>(lw.weight.data);
  }
  return l;
}

class DecoderCpu final : public Model {
 public:
  DecoderCpu(std::shared_ptr<const io::LoadedCheckpoint> checkpoint, const ModelOptions& options)
      : checkpoint_(std::move(checkpoint)),
        config_(checkpoint_->bound.config),
        rope_(rope_for(config_)),
        options_(options) {
    const io::BoundCheckpoint& b = checkpoint_->bound;
    embed_ = bf16_data(b, "model.embed_tokens.weight");
    const io::TensorRef& embed = b.tensors.at("model.embed_tokens.weight");
    vocab_rows_ = embed.shape[0];
    if (auto it = checkpoint_->rank_modules.find("model.embed_tokens"); it != checkpoint_->rank_modules.end())
      vocab_begin_ = it->second.begin;
    final_norm_ = bf16_data(b, "model.norm.weight");
    if (config_.tie_word_embeddings) {
      lm_head_.name = "lm_head";
      lm_head_.weight = {vocab_rows_, config_.hidden_size, embed_, {}};
    } else {
      lm_head_ = make_linear(b, "lm_head");
    }
    layers_.reserve(static_cast<size_t>(config_.num_hidden_layers));  // (moe.score_bias points into its layer)
    for (int64_t l = 0; l < config_.num_hidden_layers; ++l) layers_.push_back(load_layer(b, l));
  }

  const io::ModelConfig& config() const override { return config_; }

  Status forward(const Batch& batch, KvCache& cache, std::vector<float>& logits) override {
    NIB_RETURN_IF_ERROR(check_batch(batch, cache));
    const int64_t T = static_cast<int64_t>(batch.token_ids.size()), H = config_.hidden_size;
    std::vector<int64_t> positions;
    std::vector<ref::AttentionSequence> seqs;
    for (const BatchSequence& s : batch.sequences) {
      seqs.push_back({s.block_table.data(), static_cast<int64_t>(s.block_table.size()), s.start_position, s.n_tokens,
                      static_cast<int64_t>(positions.size())});
      for (int64_t i = 0; i < s.n_tokens; ++i) positions.push_back(s.start_position + i);
    }
    std::vector<float> x(static_cast<size_t>(T * H)), h(x.size()), delta(x.size());  // [T, H]
    NIB_RETURN_IF_ERROR(embedding(batch.token_ids, x));
    for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
      LayerWeights& w = layers_[l];
      ref::rmsnorm(x.data(), T, H, w.input_norm, eps(), h.data());
      ref::PagedKvLayer kv = cache.layer(l);
      kv.k_scale = w.k.kv_scale, kv.v_scale = w.v.kv_scale;  // used by an FP8 cache only
      NIB_RETURN_IF_ERROR(attention(w, h, T, positions, seqs, kv, delta));
      ref::add_inplace(x.data(), delta.data(), T * H);
      ref::rmsnorm(x.data(), T, H, w.post_attention_norm, eps(), h.data());
      NIB_RETURN_IF_ERROR(w.is_moe ? moe(w, h, T, delta) : mlp(w, h, T, delta));
      ref::add_inplace(x.data(), delta.data(), T * H);
    }
    const int64_t R = static_cast<int64_t>(batch.logits_rows.size());
    std::vector<float> rows(static_cast<size_t>(R * H));  // [R, H]
    for (int64_t r = 0; r < R; ++r)
      ref::rmsnorm(x.data() + batch.logits_rows[r] * H, 1, H, final_norm_, eps(), rows.data() + r * H);
    logits.assign(static_cast<size_t>(R * config_.vocab_size), 0.0f);  // [R, vocab]
    if (!parallel()) return run_linear(lm_head_, rows.data(), R, ActQuant::NONE, logits.data());
    // Vocabulary-parallel lm_head: each rank's [R, V/n] logits, gathered as [rank, R, V/n] and laid out
    // as [R, V] (exact: each logit is computed whole on one rank).
    std::vector<float> part(static_cast<size_t>(R * vocab_rows_)), all(logits.size());
    NIB_RETURN_IF_ERROR(run_linear(lm_head_, rows.data(), R, ActQuant::NONE, part.data()));
    NIB_RETURN_IF_ERROR(collectives()->all_gather(as_bytes(part), as_writable_bytes(all)));
    const int64_t n = collectives()->size();
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < R; ++i)
        std::copy_n(all.data() + (r * R + i) * vocab_rows_, vocab_rows_,
                    logits.data() + i * config_.vocab_size + r * vocab_rows_);
    return Status::ok();
  }

 private:
  float eps() const { return static_cast<float>(config_.rms_norm_eps); }
  Collectives* collectives() const { return options_.collectives; }
  bool parallel() const { return collectives() && collectives()->size() > 1; }
  static std::span<const uint8_t> as_bytes(const std::vector<float>& v) {
    return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)};
  }
  static std::span<uint8_t> as_writable_bytes(std::vector<float>& v) {
    return {reinterpret_cast<uint8_t*>(v.data()), v.size() * sizeof(float)};
  }
  // A row-parallel linear's partial sums, summed over the ranks (in place).
  Status all_reduce(std::vector<float>& partial) const {
    return parallel() ? collectives()->all_reduce_sum(partial) : Status::ok();
  }
  // Per-token mode over a row-parallel linear's input slice: the whole row's amax from every rank.
  ref::RowAmaxReduce whole_row_amax() const {
    if (!parallel()) return {};
    return [this](std::span<float> amax) { return collectives()->all_reduce_max(amax); };
  }

  // Vocabulary-parallel on a rank: rows of its vocabulary range, zeros elsewhere, summed over the ranks
  // (exact: one rank contributes each row).
  Status embedding(const std::vector<int32_t>& ids, std::vector<float>& x) const {
    const int64_t T = static_cast<int64_t>(ids.size()), H = config_.hidden_size;
    if (!parallel()) {
      ref::embedding(ids.data(), T, embed_, H, x.data());
      return Status::ok();
    }
    std::fill(x.begin(), x.end(), 0.0f);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t local = ids[t] - vocab_begin_;
      if (local >= 0 && local < vocab_rows_) {
        const int32_t id = static_cast<int32_t>(local);
        ref::embedding(&id, 1, embed_, H, x.data() + t * H);
      }
    }
    return all_reduce(x);
  }

  LayerWeights load_layer(const io::BoundCheckpoint& b, int64_t l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerWeights w;
    w.index = l;
    w.input_norm = bf16_data(b, p + "input_layernorm.weight");
    w.post_attention_norm = bf16_data(b, p + "post_attention_layernorm.weight");
    if (config_.qk_norm) {
      w.q_norm = bf16_data(b, p + "self_attn.q_norm.weight");
      w.k_norm = bf16_data(b, p + "self_attn.k_norm.weight");
    }
    w.q = make_linear(b, p + "self_attn.q_proj");
    w.k = make_linear(b, p + "self_attn.k_proj");
    w.v = make_linear(b, p + "self_attn.v_proj");
    w.o = make_linear(b, p + "self_attn.o_proj");
    // q/k/v read one input: static mode quantizes it once with the largest of their scales.
    const float qkv_scale = std::max({w.q.input_scale, w.k.input_scale, w.v.input_scale});
    w.q.input_scale = w.k.input_scale = w.v.input_scale = qkv_scale;
    w.is_moe = config_.is_moe_layer(l);
    if (w.is_moe) {
      ref::MoeWeights& m = w.moe;
      const io::TensorRef& router = b.linears.at(p + "mlp.gate").weight;
      if (router.dtype == DType::F32)
        m.router_f32 = reinterpret_cast<const float*>(router.data);
      else
        m.router = reinterpret_cast<const uint16_t*>(router.data);
      if (config_.router_score_bias) {
        w.score_bias = io::read_f32_values(b.tensors.at(p + "mlp.moe_statics.e_score_correction_bias"));
        m.score_bias = w.score_bias.data();
      }
      m.norm_min = static_cast<float>(config_.moe_norm_min);
      m.n_experts = config_.num_experts;
      m.top_k = config_.num_experts_per_tok;
      m.hidden = config_.hidden_size;
      m.intermediate = config_.moe_intermediate_size;
      m.norm_topk_prob = config_.norm_topk_prob;
      m.bf16_intermediates = options_.gpu_rounding;
      for (int64_t e = 0; e < m.n_experts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        w.expert_names.push_back(x);
        if (!b.linears.count(x + "gate_proj")) {  // another rank's expert (expert parallelism)
          m.experts.push_back({{}, {}, {}, false});
          continue;
        }
        const Linear gate = make_linear(b, x + "gate_proj"), up = make_linear(b, x + "up_proj"),
                     down = make_linear(b, x + "down_proj");
        m.intermediate = gate.weight.out_features;  // the rank's part of the width under tensor parallelism
        m.experts.push_back({gate.weight, up.weight, down.weight});
        m.gate_up_input_scale = std::max({m.gate_up_input_scale, gate.input_scale, up.input_scale});
        m.down_input_scale = std::max(m.down_input_scale, down.input_scale);
      }
      if (auto all = checkpoint_->all_experts_input_scales.find(l); all != checkpoint_->all_experts_input_scales.end())
        // Over every rank's experts, not only this rank's.
        m.gate_up_input_scale = all->second.gate_up, m.down_input_scale = all->second.down;
      if (config_.moe_num_shared_experts > 0) {
        w.has_shared = true;
        w.shared_gate = make_linear(b, p + "mlp.shared_experts.gate_proj");
        w.shared_up = make_linear(b, p + "mlp.shared_experts.up_proj");
        w.shared_down = make_linear(b, p + "mlp.shared_experts.down_proj");
        w.shared_gate.input_scale = w.shared_up.input_scale =
            std::max(w.shared_gate.input_scale, w.shared_up.input_scale);
      }
    } else {
      w.gate = make_linear(b, p + "mlp.gate_proj");
      w.up = make_linear(b, p + "mlp.up_proj");
      w.down = make_linear(b, p + "mlp.down_proj");
      w.gate.input_scale = w.up.input_scale = std::max(w.gate.input_scale, w.up.input_scale);
    }
    return w;
  }

  Status check_batch(const Batch& batch, const KvCache& cache) const {
    int64_t total = 0;
    for (const BatchSequence& s : batch.sequences) {
      if (s.n_tokens <= 0 || s.start_position < 0) return Status::error("batch: a sequence has no tokens");
      if (s.start_position + s.n_tokens > static_cast<int64_t>(s.block_table.size()) * cache.block_size())
        return Status::error("batch: a sequence's block table is too short for its positions");
      for (int32_t block : s.block_table)
        if (block < 0 || block >= cache.n_blocks()) return Status::error("batch: block id out of range");
      total += s.n_tokens;
    }
    if (total != static_cast<int64_t>(batch.token_ids.size()))
      return Status::error("batch: sequence token counts do not add up to the token ids");
    for (int32_t id : batch.token_ids)
      if (id < 0 || id >= config_.vocab_size)
        return Status::error("token id " + std::to_string(id) + " is outside the vocabulary (size " +
                             std::to_string(config_.vocab_size) + ")");
    for (int64_t r : batch.logits_rows)
      if (r < 0 || r >= total) return Status::error("batch: logits row out of range");
    return Status::ok();
  }

  Status run_linear(const Linear& l, const float* x, int64_t rows, ActQuant mode, float* y,
                    const ref::RowAmaxReduce& reduce_amax = {}) const {
    if (options_.input_observer) options_.input_observer(l.name, x, rows, l.weight.in_features);
    if (options_.gpu_rounding) {
      std::vector<float> rounded(x, x + rows * l.weight.in_features);
      for (float& v : rounded) v = formats::bf16_round(v);
      return ref::linear(rounded.data(), rows, l.weight, mode, l.input_scale, y, reduce_amax);
    }
    return ref::linear(x, rows, l.weight, mode, l.input_scale, y, reduce_amax);
  }

  // [T, H] → [T, H]: q/k/v projections, per-head q/k RMSNorm, RoPE, paged attention, o_proj.
  Status attention(const LayerWeights& w, const std::vector<float>& h, int64_t T, const std::vector<int64_t>& positions,
                   const std::vector<ref::AttentionSequence>& seqs, ref::PagedKvLayer kv,
                   std::vector<float>& out) const {
    // The rank's heads (all of them on one rank).
    const int64_t D = config_.head_dim, NH = w.q.weight.out_features / D, NKV = w.k.weight.out_features / D;
    const ActQuant mode = options_.act_quant_dense;
    std::vector<float> q(static_cast<size_t>(T * NH * D)), k(static_cast<size_t>(T * NKV * D)), v(k.size()),
        o(q.size());
    NIB_RETURN_IF_ERROR(run_linear(w.q, h.data(), T, mode, q.data()));  // [T, NH·D]
    NIB_RETURN_IF_ERROR(run_linear(w.k, h.data(), T, mode, k.data()));  // [T, NKV·D]
    NIB_RETURN_IF_ERROR(run_linear(w.v, h.data(), T, mode, v.data()));
    if (config_.qk_norm) {
      ref::rmsnorm(q.data(), T * NH, D, w.q_norm, eps(), q.data());
      ref::rmsnorm(k.data(), T * NKV, D, w.k_norm, eps(), k.data());
    }
    const auto rope = config_.rope_style == io::RopeStyle::INTERLEAVED ? ref::rope_interleaved : ref::rope_neox;
    rope(q.data(), T, NH, D, positions.data(), rope_);
    rope(k.data(), T, NKV, D, positions.data(), rope_);
    for (const ref::AttentionSequence& s : seqs)
      ref::kv_store(kv, s, k.data() + s.token_offset * NKV * D, v.data() + s.token_offset * NKV * D);
    ref::paged_attention(q.data(), NH, kv, seqs.data(), static_cast<int64_t>(seqs.size()), o.data());
    NIB_RETURN_IF_ERROR(run_linear(w.o, o.data(), T, mode, out.data(), whole_row_amax()));
    return all_reduce(out);
  }

  Status moe(LayerWeights& w, const std::vector<float>& h, int64_t T, std::vector<float>& out) {
    ref::MoeInputObserver observer;
    if (options_.input_observer) {
      observer = [&](int64_t e, const char* stage, const float* x, int64_t rows, int64_t width) {
        const std::string& prefix = w.expert_names[e];
        if (std::string(stage) == "down") {
          options_.input_observer(prefix + "down_proj", x, rows, width);
        } else {
          options_.input_observer(prefix + "gate_proj", x, rows, width);
          options_.input_observer(prefix + "up_proj", x, rows, width);
        }
      };
    }
    std::vector<float> rounded;
    if (options_.gpu_rounding) {  // (the weights round their intermediates: bf16_intermediates, set at load)
      rounded = h;
      for (float& v : rounded) v = formats::bf16_round(v);
    }
    const float* x = options_.gpu_rounding ? rounded.data() : h.data();
    if (options_.router_placer) place_router(w, x, T);
    // Experts sliced by width (tensor parallelism) need the down rows' whole amax; whole experts do not.
    const bool sliced = parallel() && !checkpoint_->parallel.expert_parallel;
    const int64_t K = w.moe.top_k;
    std::vector<int32_t> ids(static_cast<size_t>(T * K));
    std::vector<float> route_weights(ids.size());
    ref::route(x, T, w.moe, ids.data(), route_weights.data());
    if (options_.routing_observer) options_.routing_observer(w.index, ids.data(), T, K);
    NIB_RETURN_IF_ERROR(ref::moe_experts(x, T, w.moe, options_.act_quant_moe, ids.data(), route_weights.data(),
                                         out.data(), observer, sliced ? whole_row_amax() : ref::RowAmaxReduce()));
    if (w.has_shared) {
      // Ernie4_5_MoeSparseMoeBlock: routed output + shared_experts(x), the shared MLP in the dense mode.
      std::vector<float> shared(out.size());
      NIB_RETURN_IF_ERROR(swiglu_mlp(w.shared_gate, w.shared_up, w.shared_down, h, T, shared));
      ref::add_inplace(out.data(), shared.data(), T * config_.hidden_size);
    }
    return all_reduce(out);  // one exchange for the block: routed and shared partial sums together
  }

  // Replaces the layer's router with the rows ModelOptions::router_placer gives for these inputs.
  void place_router(LayerWeights& w, const float* x, int64_t T) {
    std::vector<float> rows = options_.router_placer(w.index, x, T, config_.hidden_size);
    if (rows.empty()) return;
    if (w.moe.router_f32) {
      w.placed_router_f32 = std::move(rows);
      w.moe.router_f32 = w.placed_router_f32.data();
      return;
    }
    w.placed_router.resize(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) w.placed_router[i] = formats::bf16_encode(rows[i]);
    w.moe.router = w.placed_router.data();
  }

  Status mlp(const LayerWeights& w, const std::vector<float>& h, int64_t T, std::vector<float>& out) const {
    NIB_RETURN_IF_ERROR(swiglu_mlp(w.gate, w.up, w.down, h, T, out));
    return all_reduce(out);
  }

  // down(silu(gate(h)) · up(h)) in the dense activation mode.
  Status swiglu_mlp(const Linear& gate_proj, const Linear& up_proj, const Linear& down_proj,
                    const std::vector<float>& h, int64_t T, std::vector<float>& out) const {
    const int64_t I = gate_proj.weight.out_features;
    const ActQuant mode = options_.act_quant_dense;
    std::vector<float> gate(static_cast<size_t>(T * I)), up(gate.size()), act(gate.size());
    NIB_RETURN_IF_ERROR(run_linear(gate_proj, h.data(), T, mode, gate.data()));
    NIB_RETURN_IF_ERROR(run_linear(up_proj, h.data(), T, mode, up.data()));
    ref::silu_mul(gate.data(), up.data(), T * I, act.data());
    return run_linear(down_proj, act.data(), T, mode, out.data(), whole_row_amax());  // (a partial sum on a rank)
  }

  std::shared_ptr<const io::LoadedCheckpoint> checkpoint_;
  io::ModelConfig config_;
  ref::Rope rope_;
  ModelOptions options_;
  const uint16_t* embed_ = nullptr;
  int64_t vocab_begin_ = 0, vocab_rows_ = 0;  // the rank's vocabulary rows (all of them on one rank)
  const uint16_t* final_norm_ = nullptr;
  Linear lm_head_;
  std::vector<LayerWeights> layers_;
};

}  // namespace

Result<std::unique_ptr<Model>> create_decoder_cpu(std::shared_ptr<const io::LoadedCheckpoint> checkpoint,
                                                  const ModelOptions& options) {
  return std::unique_ptr<Model>(new DecoderCpu(std::move(checkpoint), options));
}

}  // namespace nibble::models

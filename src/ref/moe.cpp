// Reference MoE: tokens grouped by expert, each expert's projections run on its tokens, results
// summed per token in top-k order, so a token's output does not depend on the other tokens.
#include "ref/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/parallel.h"
#include "formats/bf16.h"
#include "formats/nvfp4.h"
#include "ref/dot.h"

namespace nibble::ref {

void route(const float* x, int64_t n_tokens, const MoeWeights& w, int32_t* expert_ids, float* weights) {
  std::vector<float> logits(static_cast<size_t>(n_tokens * w.n_experts));
  if (w.router_f32) {
    for (int64_t t = 0; t < n_tokens; ++t)
      for (int64_t e = 0; e < w.n_experts; ++e)
        logits[t * w.n_experts + e] = dot(x + t * w.hidden, w.router_f32 + e * w.hidden, w.hidden);
  } else {
    linear_bf16(x, n_tokens, w.router, w.n_experts, w.hidden, logits.data());
  }
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* l = logits.data() + t * w.n_experts;
    const float m = *std::max_element(l, l + w.n_experts);
    float sum = 0.0f;
    for (int64_t e = 0; e < w.n_experts; ++e) sum += (l[e] = std::exp(l[e] - m));
    for (int64_t e = 0; e < w.n_experts; ++e) l[e] /= sum;
    // torch.topk order: descending score; equal scores keep the lower expert first. The score is the
    // probability, plus the correction bias where the checkpoint has one (it chooses; it does not weigh).
    std::vector<float> score(l, l + w.n_experts);
    if (w.score_bias)
      for (int64_t e = 0; e < w.n_experts; ++e) score[e] += w.score_bias[e];
    std::vector<int32_t> order(static_cast<size_t>(w.n_experts));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return score[a] > score[b]; });
    float top_sum = 0.0f;
    for (int64_t k = 0; k < w.top_k; ++k) top_sum += l[order[k]];
    top_sum = std::max(top_sum, w.norm_min);
    for (int64_t k = 0; k < w.top_k; ++k) {
      expert_ids[t * w.top_k + k] = order[k];
      weights[t * w.top_k + k] = w.norm_topk_prob ? l[order[k]] / top_sum : l[order[k]];
    }
  }
}

Status moe(const float* x, int64_t n_tokens, const MoeWeights& w, formats::ActQuant mode, float* out,
           const MoeInputObserver& observer, const RowAmaxReduce& reduce_down_amax) {
  std::vector<int32_t> ids(static_cast<size_t>(n_tokens * w.top_k));
  std::vector<float> route_weights(ids.size());
  route(x, n_tokens, w, ids.data(), route_weights.data());
  return moe_experts(x, n_tokens, w, mode, ids.data(), route_weights.data(), out, observer, reduce_down_amax);
}

Status moe_experts(const float* x, int64_t n_tokens, const MoeWeights& w, formats::ActQuant mode, const int32_t* ids,
                   const float* route_weights, float* out, const MoeInputObserver& observer,
                   const RowAmaxReduce& reduce_down_amax) {
  const int64_t H = w.hidden, I = w.intermediate, K = w.top_k;

  // (token, slot) pairs of each expert, in token order.
  std::vector<std::vector<int64_t>> assigned(static_cast<size_t>(w.n_experts));
  for (int64_t i = 0; i < n_tokens * K; ++i) assigned[ids[i]].push_back(i);
  auto here = [&](size_t e) { return !assigned[e].empty() && w.experts[e].present; };

  // gate/up and SwiGLU of every expert first, then (per-token mode over a sliced width) each down row's
  // whole amax in one exchange, then down.
  std::vector<std::vector<float>> acts(static_cast<size_t>(w.n_experts));
  std::vector<Status> statuses(static_cast<size_t>(w.n_experts));
  parallel_for(static_cast<size_t>(w.n_experts), [&](size_t e) {
    if (!here(e)) return;
    const auto& pairs = assigned[e];
    const int64_t rows = static_cast<int64_t>(pairs.size());
    const ExpertWeights& ew = w.experts[e];
    std::vector<float> xs(static_cast<size_t>(rows * H)), gate(static_cast<size_t>(rows * I)), up(gate.size());
    std::vector<float>& act = acts[e];
    act.resize(gate.size());
    for (int64_t r = 0; r < rows; ++r) std::copy_n(x + (pairs[r] / K) * H, H, xs.data() + r * H);
    if (observer) observer(static_cast<int64_t>(e), "gate_up", xs.data(), rows, H);
    Status s = linear(xs.data(), rows, ew.gate, mode, w.gate_up_input_scale, gate.data());
    if (s) s = linear(xs.data(), rows, ew.up, mode, w.gate_up_input_scale, up.data());
    statuses[e] = s;
    if (!s) return;
    silu_mul(gate.data(), up.data(), rows * I, act.data());
    if (w.bf16_intermediates && mode == formats::ActQuant::NONE)
      for (float& a : act) a = formats::bf16_round(a);
  });
  for (const Status& s : statuses) NIB_RETURN_IF_ERROR(s);
  std::vector<float> down_amax;  // [token, slot]: the whole row's amax of each down input
  if (mode == formats::ActQuant::PER_TOKEN && reduce_down_amax) {
    down_amax.assign(static_cast<size_t>(n_tokens * K), 0.0f);
    for (size_t e = 0; e < assigned.size(); ++e) {
      if (!here(e)) continue;
      const std::vector<float> a = formats::row_amax(acts[e], static_cast<int64_t>(assigned[e].size()), I);
      for (size_t r = 0; r < a.size(); ++r) down_amax[assigned[e][r]] = a[r];
    }
    NIB_RETURN_IF_ERROR(reduce_down_amax(down_amax));
  }

  std::vector<float> expert_out(static_cast<size_t>(n_tokens * K * H), 0.0f);  // [token, slot, H]
  parallel_for(static_cast<size_t>(w.n_experts), [&](size_t e) {
    if (!here(e)) return;
    const auto& pairs = assigned[e];
    const int64_t rows = static_cast<int64_t>(pairs.size());
    std::vector<float> y(static_cast<size_t>(rows * H));
    if (observer) observer(static_cast<int64_t>(e), "down", acts[e].data(), rows, I);
    RowAmaxReduce whole_rows;
    if (!down_amax.empty())
      whole_rows = [&](std::span<float> amax) {
        for (int64_t r = 0; r < rows; ++r) amax[r] = down_amax[pairs[r]];
        return Status::ok();
      };
    statuses[e] = linear(acts[e].data(), rows, w.experts[e].down, mode, w.down_input_scale, y.data(), whole_rows);
    if (w.bf16_intermediates)
      for (float& v : y) v = formats::bf16_round(v);
    for (int64_t r = 0; r < rows; ++r) std::copy_n(y.data() + r * H, H, expert_out.data() + pairs[r] * H);
  });
  for (const Status& s : statuses) NIB_RETURN_IF_ERROR(s);
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc += route_weights[t * K + k] * expert_out[(t * K + k) * H + h];
      out[t * H + h] = acc;
    }
  }
  return Status::ok();
}

}  // namespace nibble::ref

// Reference op implementations. Parallel over independent output rows only, so every result is
// computed by the same sequence of fp32 operations whatever the thread count or batch makeup.
#include "ref/ops.h"

#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "formats/bf16.h"
#include "ref/dot.h"

namespace nibble::ref {

using formats::bf16_decode;

void embedding(const int32_t* ids, int64_t n_tokens, const uint16_t* table, int64_t hidden, float* out) {
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t h = 0; h < hidden; ++h) out[t * hidden + h] = bf16_decode(table[ids[t] * hidden + h]);
}

void rmsnorm(const float* x, int64_t n_rows, int64_t width, const uint16_t* weight, float eps, float* out) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* row = x + r * width;
    float sum_sq = 0.0f;
    for (int64_t i = 0; i < width; ++i) sum_sq += row[i] * row[i];
    const float inv = 1.0f / std::sqrt(sum_sq / static_cast<float>(width) + eps);
    for (int64_t i = 0; i < width; ++i) out[r * width + i] = row[i] * inv * bf16_decode(weight[i]);
  }
}

std::vector<float> rope_inv_freq(double theta, int64_t head_dim) {
  std::vector<float> inv_freq(static_cast<size_t>(head_dim / 2));
  for (size_t i = 0; i < inv_freq.size(); ++i)
    inv_freq[i] = static_cast<float>(1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(head_dim)));
  return inv_freq;
}

void rope_neox(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const int64_t* positions,
               const Rope& rope) {
  const int64_t half = head_dim / 2;
  const std::vector<float>& inv_freq = rope.inv_freq;
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(positions[t]) * inv_freq[i];
      const float c = std::cos(angle) * rope.attention_scaling, s = std::sin(angle) * rope.attention_scaling;
      for (int64_t h = 0; h < n_heads; ++h) {
        float* v = x + (t * n_heads + h) * head_dim;
        const float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;  // x·cos + rotate_half(x)·sin, rotate_half = (-x2, x1)
        v[i + half] = b * c + a * s;
      }
    }
  }
}

void rope_interleaved(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const int64_t* positions,
                      const Rope& rope) {
  const std::vector<float>& inv_freq = rope.inv_freq;
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t i = 0; i < head_dim / 2; ++i) {
      const float angle = static_cast<float>(positions[t]) * inv_freq[i];
      const float c = std::cos(angle) * rope.attention_scaling, s = std::sin(angle) * rope.attention_scaling;
      for (int64_t h = 0; h < n_heads; ++h) {
        float* v = x + (t * n_heads + h) * head_dim;
        const float a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * c - b * s;  // x·cos + rotate_half(x)·sin, rotate_half pairs = (-x_odd, x_even)
        v[2 * i + 1] = b * c + a * s;
      }
    }
  }
}

void linear_bf16(const float* x, int64_t n_tokens, const uint16_t* w, int64_t out_features, int64_t in_features,
                 float* y) {
  parallel_for(static_cast<size_t>(out_features), [&](size_t n) {
    std::vector<float> row(in_features);
    for (int64_t k = 0; k < in_features; ++k) row[k] = bf16_decode(w[n * in_features + k]);
    for (int64_t t = 0; t < n_tokens; ++t) y[t * out_features + n] = dot(x + t * in_features, row.data(), in_features);
  });
}

Status linear_nvfp4(const float* x, int64_t n_tokens, const formats::Nvfp4WeightView& w, formats::ActQuant mode,
                    float input_scale, float* y, const RowAmaxReduce& reduce_amax) {
  const int64_t K = w.cols, N = w.rows;
  std::vector<float> xq;  // activations as the tensor cores see them (NONE: x itself)
  std::vector<float> row_scale(static_cast<size_t>(n_tokens), w.weight_scale_2);
  const float* a = x;
  if (mode != formats::ActQuant::NONE) {
    std::span<const float> xs(x, static_cast<size_t>(n_tokens * K));
    std::vector<float> amax;
    if (mode == formats::ActQuant::PER_TOKEN && reduce_amax) {
      amax = formats::row_amax(xs, n_tokens, K);
      NIB_RETURN_IF_ERROR(reduce_amax(amax));
    }
    Result<formats::Nvfp4Matrix> q =
        mode == formats::ActQuant::STATIC
            ? formats::quantize_activation_static(xs, n_tokens, K, input_scale, "linear input")
            : formats::quantize_activation_per_token(xs, n_tokens, K, "linear input", amax);
    if (!q) return q.status();
    const formats::Nvfp4WeightView view{q->packed.data(), q->block_scales.data(), n_tokens, K, 1.0f};
    xq.resize(static_cast<size_t>(n_tokens * K));
    for (int64_t t = 0; t < n_tokens; ++t) {
      formats::decode_row_unscaled(view, t, xq.data() + t * K);
      row_scale[t] = q->row_scale(t) * w.weight_scale_2;
    }
    a = xq.data();
  }
  parallel_for(static_cast<size_t>(N), [&](size_t n) {
    std::vector<float> row(K);
    formats::decode_row_unscaled(w, static_cast<int64_t>(n), row.data());
    for (int64_t t = 0; t < n_tokens; ++t) y[t * N + n] = dot(a + t * K, row.data(), K) * row_scale[t];
  });
  return Status::ok();
}

Status linear(const float* x, int64_t n_tokens, const LinearWeight& w, formats::ActQuant mode, float input_scale,
              float* y, const RowAmaxReduce& reduce_amax) {
  if (!w.is_nvfp4()) {
    linear_bf16(x, n_tokens, w.bf16, w.out_features, w.in_features, y);
    return Status::ok();
  }
  return linear_nvfp4(x, n_tokens, w.nvfp4, mode, input_scale, y, reduce_amax);
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void add_inplace(float* out, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] += x[i];
}

}  // namespace nibble::ref

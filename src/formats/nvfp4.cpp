// Host NVFP4 quantizers. Weights follow nvidia-modelopt 0.47 qtensor/nvfp4_tensor.py line by line
// (same fp32 operations in the same order, so results are bit-identical); activations use the
// shared block routine of nvfp4_block.h with exact reciprocals.
#include "formats/nvfp4.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "formats/bf16.h"
#include "formats/e2m1.h"
#include "formats/e4m3.h"
#include "formats/nvfp4_block.h"

namespace nibble::formats {
namespace {

void reset_matrix(Nvfp4Matrix& m, int64_t rows, int64_t cols) {
  m.rows = rows;
  m.cols = cols;
  m.packed.resize(static_cast<size_t>(rows * cols / 2));  // every byte is written by the quantizer
  m.block_scales.resize(static_cast<size_t>(rows * cols / NVFP4_BLOCK));
  m.scale = 0.0f;
  m.row_scales.clear();
}

Nvfp4Matrix empty_matrix(int64_t rows, int64_t cols) {
  Nvfp4Matrix m;
  reset_matrix(m, rows, cols);
  return m;
}

void store_codes(Nvfp4Matrix& m, int64_t row, int64_t block, const uint8_t* codes) {
  uint8_t* out = m.packed.data() + row * (m.cols / 2) + block * (NVFP4_BLOCK / 2);
  for (int j = 0; j < NVFP4_BLOCK / 2; ++j) out[j] = e2m1_pack(codes[2 * j], codes[2 * j + 1]);
}

// Blackwell activation quantization of every row with per-row global scales G[r].
Nvfp4Matrix quantize_rows(std::span<const float> x, int64_t rows, int64_t cols,
                          const std::vector<float>& global_per_row) {
  Nvfp4Matrix m = empty_matrix(rows, cols);
  const int64_t n_blocks = cols / NVFP4_BLOCK;
  uint8_t codes[NVFP4_BLOCK];
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < n_blocks; ++b) {
      const float* block = x.data() + r * cols + b * NVFP4_BLOCK;
      m.block_scales[r * n_blocks + b] = quantize_activation_block(block, global_per_row[r], codes);
      store_codes(m, r, b, codes);
    }
  }
  return m;
}

// The weight quantizer over whole rows, built for AVX2 too (picked at run time) so the block
// routine's loops vectorize. False when a value is not finite.
__attribute__((target_clones("avx2", "default"))) bool quantize_weight_rows(const float* w, int64_t rows, int64_t cols,
                                                                            float scale_2, uint8_t* packed,
                                                                            uint8_t* block_scales) {
  const int64_t n_blocks = cols / NVFP4_BLOCK;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < n_blocks; ++b) {
      const float* block = w + r * cols + b * NVFP4_BLOCK;
      float nonfinite = 0.0f;
      for (int i = 0; i < NVFP4_BLOCK; ++i) nonfinite += block[i] - block[i];  // NaN once any is NaN or ±inf
      if (!(nonfinite == 0.0f)) return false;
      block_scales[r * n_blocks + b] =
          quantize_weight_block(block, scale_2, packed + r * (cols / 2) + b * (NVFP4_BLOCK / 2));
    }
  }
  return true;
}

}  // namespace

const char* act_quant_name(ActQuant mode) {
  switch (mode) {
    case ActQuant::STATIC:
      return "static";
    case ActQuant::PER_TOKEN:
      return "per-token";
    case ActQuant::NONE:
      break;
  }
  return "none";
}

std::optional<ActQuant> parse_act_quant(std::string_view name) {
  for (ActQuant mode : {ActQuant::NONE, ActQuant::STATIC, ActQuant::PER_TOKEN})
    if (name == act_quant_name(mode)) return mode;
  return std::nullopt;
}

uint8_t Nvfp4Matrix::code(int64_t r, int64_t c) const {
  return e2m1_unpack(packed[r * (cols / 2) + c / 2], static_cast<int>(c % 2));
}

void decode_row_unscaled(const Nvfp4WeightView& w, int64_t r, float* out) {
  const uint8_t* packed = w.packed + r * (w.cols / 2);
  const uint8_t* scales = w.block_scales + r * (w.cols / NVFP4_BLOCK);
  for (int64_t b = 0; b < w.cols / NVFP4_BLOCK; ++b) {
    const float sf = e4m3_decode(scales[b]);
    for (int j = 0; j < NVFP4_BLOCK / 2; ++j) {
      const uint8_t byte = packed[b * (NVFP4_BLOCK / 2) + j];
      out[b * NVFP4_BLOCK + 2 * j] = e2m1_decode(byte & 0xF) * sf;
      out[b * NVFP4_BLOCK + 2 * j + 1] = e2m1_decode(byte >> 4) * sf;
    }
  }
}

namespace {

Status check_shape(std::span<const float> x, int64_t rows, int64_t cols, std::string_view name) {
  const std::string tensor(name);
  if (rows < 0 || cols <= 0) {
    return Status::error(tensor + ": invalid shape [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
  }
  if (cols % NVFP4_BLOCK != 0) {
    return Status::error(tensor + ": K = " + std::to_string(cols) + " is not a multiple of the NVFP4 block size 16");
  }
  if (static_cast<int64_t>(x.size()) != rows * cols) {
    return Status::error(tensor + ": has " + std::to_string(x.size()) + " values, shape [" + std::to_string(rows) +
                         ", " + std::to_string(cols) + "] needs " + std::to_string(rows * cols));
  }
  return Status::ok();
}

}  // namespace

Status check_quantizable(std::span<const float> x, int64_t rows, int64_t cols, std::string_view name) {
  NIB_RETURN_IF_ERROR(check_shape(x, rows, cols, name));
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) {
      return Status::error(std::string(name) + ": non-finite value " + std::to_string(x[i]) + " at [" +
                           std::to_string(static_cast<int64_t>(i) / cols) + ", " +
                           std::to_string(static_cast<int64_t>(i) % cols) + "]");
    }
  }
  return Status::ok();
}

float weight_scale_2(std::span<const float> w) {
  float amax = 0.0f;
  for (float v : w) amax = std::max(amax, std::fabs(v));
  return amax / NVFP4_SCALE_RANGE;  // get_weights_scaling_factor_2: amax / (E2M1_MAX · E4M3_MAX)
}

Result<Nvfp4Matrix> quantize_weight(std::span<const float> w, int64_t rows, int64_t cols, std::string_view name,
                                    std::optional<float> shared_weight_scale_2) {
  Nvfp4Matrix m;
  NIB_RETURN_IF_ERROR(quantize_weight_into(w, rows, cols, name, shared_weight_scale_2, m));
  return m;
}

Status quantize_weight_into(std::span<const float> w, int64_t rows, int64_t cols, std::string_view name,
                            std::optional<float> shared_weight_scale_2, Nvfp4Matrix& m) {
  // Non-finite values are caught inside the block loop (one pass over the data, not two); only
  // then does check_quantizable scan again to name the first bad position.
  NIB_RETURN_IF_ERROR(check_shape(w, rows, cols, name));
  const float scale_2 = shared_weight_scale_2 ? *shared_weight_scale_2 : weight_scale_2(w);  // value_or would scan w
  if (!std::isfinite(scale_2)) NIB_RETURN_IF_ERROR(check_quantizable(w, rows, cols, name));
  if (!(scale_2 > 0.0f) || !std::isfinite(scale_2)) {
    // ModelOpt divides 0 by 0 here and exports NaN scales; nibble refuses instead.
    return Status::error(std::string(name) + ": weight_scale_2 is " + std::to_string(scale_2) +
                         " (an all-zero weight or a non-positive shared scale) - cannot quantize");
  }
  reset_matrix(m, rows, cols);
  m.scale = scale_2;
  if (!quantize_weight_rows(w.data(), rows, cols, scale_2, m.packed.data(), m.block_scales.data()))
    return check_quantizable(w, rows, cols, name);  // names the first non-finite value
  return Status::ok();
}

Result<Nvfp4Matrix> quantize_activation_static(std::span<const float> x, int64_t rows, int64_t cols, float input_scale,
                                               std::string_view name) {
  NIB_RETURN_IF_ERROR(check_quantizable(x, rows, cols, name));
  if (!(input_scale > 0.0f) || !std::isfinite(input_scale)) {
    return Status::error(std::string(name) + ": input_scale must be a positive finite number, got " +
                         std::to_string(input_scale));
  }
  Nvfp4Matrix m = quantize_rows(x, rows, cols, std::vector<float>(rows, 1.0f / input_scale));
  m.scale = input_scale;
  return m;
}

std::vector<float> row_amax(std::span<const float> x, int64_t rows, int64_t cols) {
  std::vector<float> amax(static_cast<size_t>(rows), 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) amax[r] = std::max(amax[r], std::fabs(x[r * cols + c]));
  return amax;
}

Result<Nvfp4Matrix> quantize_activation_per_token(std::span<const float> x, int64_t rows, int64_t cols,
                                                  std::string_view name, std::span<const float> given_amax) {
  NIB_RETURN_IF_ERROR(check_quantizable(x, rows, cols, name));
  if (!given_amax.empty() && given_amax.size() != static_cast<size_t>(rows))
    return Status::error(std::string(name) + ": " + std::to_string(given_amax.size()) + " row amaxes for " +
                         std::to_string(rows) + " rows");
  const std::vector<float> amax = given_amax.empty() ? row_amax(x, rows, cols) : std::vector<float>();
  std::vector<float> token_scales(rows), globals(rows);
  for (int64_t r = 0; r < rows; ++r) {
    token_scales[r] = per_token_scale(given_amax.empty() ? amax[r] : given_amax[r]);
    globals[r] = per_token_global(token_scales[r]);
  }
  Nvfp4Matrix m = quantize_rows(x, rows, cols, globals);
  m.row_scales = std::move(token_scales);
  return m;
}

namespace {

// e2m1 · (e4m3 · scale) for every element, scale being the row's scale or 1 (unscaled).
std::vector<float> element_values(const Nvfp4Matrix& m, bool with_scale) {
  std::vector<float> out(static_cast<size_t>(m.rows * m.cols));
  const int64_t n_blocks = m.cols / NVFP4_BLOCK;
  for (int64_t r = 0; r < m.rows; ++r) {
    const float scale = with_scale ? m.row_scale(r) : 1.0f;
    for (int64_t c = 0; c < m.cols; ++c) {
      const float block_scale = e4m3_decode(m.block_scales[r * n_blocks + c / NVFP4_BLOCK]);
      out[r * m.cols + c] = e2m1_decode(m.code(r, c)) * (block_scale * scale);
    }
  }
  return out;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& values) {
  std::vector<uint16_t> out(values.size());
  std::transform(values.begin(), values.end(), out.begin(), bf16_encode);
  return out;
}

}  // namespace

std::vector<float> dequantize(const Nvfp4Matrix& m) { return element_values(m, true); }
std::vector<uint16_t> dequantize_bf16(const Nvfp4Matrix& m) { return to_bf16(element_values(m, true)); }
std::vector<uint16_t> dequantize_unscaled_bf16(const Nvfp4Matrix& m) { return to_bf16(element_values(m, false)); }

Result<std::vector<float>> fake_quantize_activation(std::span<const float> x, int64_t rows, int64_t cols, ActQuant mode,
                                                    float input_scale, std::string_view name) {
  if (mode == ActQuant::NONE) return std::vector<float>(x.begin(), x.end());
  Result<Nvfp4Matrix> q = mode == ActQuant::STATIC ? quantize_activation_static(x, rows, cols, input_scale, name)
                                                   : quantize_activation_per_token(x, rows, cols, name);
  if (!q) return q.status();
  return dequantize(*q);
}

}  // namespace nibble::formats

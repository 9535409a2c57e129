// NVFP4 quantization and dequantization of whole [rows, cols] matrices on the host: weights exactly
// as nvidia-modelopt's NVFP4QTensor does it, activations as the Blackwell kernels do (static and
// per-token). The CPU reference for every CUDA quantizer; no model knowledge here.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace nibble::formats {

// An NVFP4 matrix. Value of element (r, c):
//   e2m1(code[r, c]) · e4m3(block_scales[r, c/16]) · (row_scales.empty() ? scale : row_scales[r])
// scale is weight_scale_2 for weights and input_scale for static activations; row_scales holds the
// per-token scales (amax(row)/2688) of per-token activations.
struct Nvfp4Matrix {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> packed;        // [rows, cols/2]: element 2j in the low nibble
  std::vector<uint8_t> block_scales;  // [rows, cols/16] E4M3 bits, row-major
  float scale = 0.0f;
  std::vector<float> row_scales;  // [rows] for per-token activations, else empty

  uint8_t code(int64_t r, int64_t c) const;
  float row_scale(int64_t r) const { return row_scales.empty() ? scale : row_scales[r]; }
};

// A non-owning view of an NVFP4 weight [rows = out features, cols = in features] as a checkpoint
// stores it: packed codes [rows, cols/2], E4M3 block scales [rows, cols/16], weight_scale_2.
struct Nvfp4WeightView {
  const uint8_t* packed = nullptr;
  const uint8_t* block_scales = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  float weight_scale_2 = 1.0f;
};

// Row r of a view decoded to e2m1 · e4m3 values (unscaled: weight_scale_2 not applied), exact.
void decode_row_unscaled(const Nvfp4WeightView& w, int64_t r, float* out);

// How activations entering a quantized linear are treated (docs/numerics.md).
enum class ActQuant { NONE, STATIC, PER_TOKEN };
// The command-line name: "none", "static", "per-token".
const char* act_quant_name(ActQuant mode);
// From the command-line name; nullopt for anything else.
std::optional<ActQuant> parse_act_quant(std::string_view name);

// Checks that x is [rows, cols] with cols a multiple of 16 and every value finite; the error names
// the tensor and the first bad position.
Status check_quantizable(std::span<const float> x, int64_t rows, int64_t cols, std::string_view name);

// weight_scale_2 as ModelOpt computes it: amax(|W|)/(6·448).
float weight_scale_2(std::span<const float> w);

// ModelOpt NVFP4QTensor.quantize on a [rows, cols] weight (bf16 weights widened to float first, which
// is exact). weight_scale_2 defaults to weight_scale_2(w); pass it to share one global scale between
// modules (gate/up, q/k/v), as ModelOpt's export does.
Result<Nvfp4Matrix> quantize_weight(std::span<const float> w, int64_t rows, int64_t cols, std::string_view name,
                                    std::optional<float> shared_weight_scale_2 = std::nullopt);
// The same into `out`, reusing its buffers (no allocation once they are large enough).
Status quantize_weight_into(std::span<const float> w, int64_t rows, int64_t cols, std::string_view name,
                            std::optional<float> shared_weight_scale_2, Nvfp4Matrix& out);

// Blackwell activation quantization with the checkpoint's input_scale (G = 1/input_scale).
Result<Nvfp4Matrix> quantize_activation_static(std::span<const float> x, int64_t rows, int64_t cols, float input_scale,
                                               std::string_view name);

// Blackwell per-token activation quantization: each row gets token_scale = amax(row)/2688. row_amax,
// when given, is each row's amax over the whole row where x holds a slice of its columns (a
// row-parallel linear's shard: its ranks agree on the whole row's scale, so each 16-value block
// quantizes as on one GPU).
Result<Nvfp4Matrix> quantize_activation_per_token(std::span<const float> x, int64_t rows, int64_t cols,
                                                  std::string_view name, std::span<const float> row_amax = {});

// Each row's amax (max |x|) of [rows, cols].
std::vector<float> row_amax(std::span<const float> x, int64_t rows, int64_t cols);

// Element values as fp32: e2m1 · (e4m3 · scale), in ModelOpt's dequantize order.
std::vector<float> dequantize(const Nvfp4Matrix& m);
// The same rounded to BF16 (round to nearest even).
std::vector<uint16_t> dequantize_bf16(const Nvfp4Matrix& m);
// e2m1 · e4m3 without the per-tensor/per-row scale, as BF16: exact (at most 6 significant bits),
// the form Hopper kernels feed to BF16 tensor cores, with the scale applied in the epilogue.
std::vector<uint16_t> dequantize_unscaled_bf16(const Nvfp4Matrix& m);

// Quantize then dequantize (to fp32) in the given activation mode; NONE returns x unchanged.
Result<std::vector<float>> fake_quantize_activation(std::span<const float> x, int64_t rows, int64_t cols, ActQuant mode,
                                                    float input_scale, std::string_view name);

}  // namespace nibble::formats

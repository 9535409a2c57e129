// Names of the runner option enums, as the command-line flags spell them.
#include "engine/runner_options.h"

namespace nibble::engine {

std::optional<Backend> parse_backend(std::string_view name) {
  if (name == "auto") return Backend::AUTO;
  if (name == "cpu") return Backend::CPU;
  if (name == "cuda") return Backend::CUDA;
  return std::nullopt;
}

std::optional<KvCacheDtype> parse_kv_cache_dtype(std::string_view name) {
  if (name == "auto") return KvCacheDtype::AUTO;
  if (name == "bf16") return KvCacheDtype::BF16;
  if (name == "fp32") return KvCacheDtype::FP32;
  if (name == "fp8" || name == "fp8_e4m3") return KvCacheDtype::FP8;
  return std::nullopt;
}

std::optional<DecodeAttention> parse_decode_attention(std::string_view name) {
  if (name == "auto") return DecodeAttention::AUTO;
  if (name == "split-kv") return DecodeAttention::SPLIT_KV;
  if (name == "tensor-core") return DecodeAttention::TENSOR_CORE;
  return std::nullopt;
}

std::optional<AttentionBackend> parse_attention_backend(std::string_view name) {
  if (name == "auto") return AttentionBackend::AUTO;
  if (name == "flashinfer") return AttentionBackend::FLASHINFER;
  if (name == "native") return AttentionBackend::NATIVE;
  return std::nullopt;
}

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::AUTO:
      return "auto";
    case Backend::CPU:
      return "cpu";
    case Backend::CUDA:
      return "cuda";
  }
  return "?";
}

}  // namespace nibble::engine

// Element types of tensors nibble reads, writes and computes with, named as safetensors names them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace nibble {

enum class DType : uint8_t {
  BF16,
  F16,
  F32,
  F64,
  U8,
  I8,
  I16,
  I32,
  I64,
  BOOL,
  F8_E4M3,
  F8_E5M2,
};

// Bytes per element.
size_t dtype_size(DType dtype);
// The safetensors spelling ("BF16", "F8_E4M3", ...).
std::string_view dtype_name(DType dtype);
// Inverse of dtype_name; nullopt for a name nibble does not know.
std::optional<DType> dtype_from_name(std::string_view name);

}  // namespace nibble

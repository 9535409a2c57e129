// libFuzzer target: parse_safetensors must return (ok or a clear error) on any input, never crash,
// hang or read out of bounds. Build with scripts/fuzz.sh (clang, -fsanitize=fuzzer,address); the
// normal build links tests/fuzz/replay_main.cpp instead, which runs it over seeded random inputs.
#include <cstddef>
#include <cstdint>

#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parsed = nibble::io::parse_safetensors({data, size}, "fuzz.safetensors");
  if (parsed.is_ok()) {
    for (const auto& t : parsed->tensors) {
      if (t.data_begin + t.nbytes > size) __builtin_trap();  // validation let an overrun through
    }
  }
  return 0;
}

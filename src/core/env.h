// Integer experiment switches from the environment (NIBBLE_* variables the device scripts set for
// A/B runs): one reading rule for all of them.
#pragma once

#include <cstdint>
#include <cstdlib>

namespace nibble {

// The variable's value as std::atoll reads it (0 for text that is not a number), or `fallback` when unset.
inline int64_t env_int(const char* name, int64_t fallback) {
  const char* value = std::getenv(name);
  return value ? std::atoll(value) : fallback;
}

}  // namespace nibble

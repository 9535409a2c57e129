// Fresh seed per test run, printed so a failure can be replayed with NIBBLE_TEST_SEED=<seed>.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace nibble::test {

inline uint64_t test_seed(const char* what) {
  const char* env = std::getenv("NIBBLE_TEST_SEED");
  const uint64_t seed =
      env ? std::stoull(env) : static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  std::printf("[seed] %s: NIBBLE_TEST_SEED=%llu\n", what, static_cast<unsigned long long>(seed));
  return seed;
}

}  // namespace nibble::test

// The checkpoint a GPU model test runs on: NIBBLE_TEST_MODEL when set (the device scripts point it at
// the 4-layer slice of Qwen3-30B-A3B), else a synthetic `preset` written once per process.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include "tools/synth.h"

namespace nibble::test {

inline std::string synth_test_model(const std::string& preset, uint64_t seed) {
  if (const char* env = std::getenv("NIBBLE_TEST_MODEL")) return env;
  static std::map<std::string, std::string> written;
  auto it = written.find(preset);
  if (it != written.end()) return it->second;
  const std::filesystem::path d =
      std::filesystem::temp_directory_path() / ("nibble_cuda_" + preset + "_" + std::to_string(getpid()));
  tools::SynthOptions o;
  o.preset = preset;
  o.out_dir = d.string();
  o.seed = seed;
  auto r = tools::synth_checkpoint(o);
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  return written[preset] = d.string();
}

}  // namespace nibble::test

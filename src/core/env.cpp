// The environment variable table and its readers.
#include "core/env.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace nibble {
namespace {

constexpr EnvVar VARS[] = {
    {"NIBBLE_LOG", "name", "info", "log level: debug | info | warn | error"},
    {"NIBBLE_THREADS", "int", "all cores", "CPU threads of the reference backend and the tools"},
    {"NIBBLE_DATA_DIR", "path", "the source tree's data/", "where the default model and the tokenizers are"},
    {"NIBBLE_DIAG_KERNEL_TRACE", "path", "off",
     "write every GPU kernel's device start/end (CUDA graphs too) to this CSV (CUPTI)"},
    {"NIBBLE_DIAG_CUPTI_LIBRARY", "path", "libcupti.so.13", "the CUPTI library NIBBLE_DIAG_KERNEL_TRACE loads"},
    {"NIBBLE_DIAG_PROFILE_STEPS", "flag", "off", "time every op of eager GPU steps; the report prints at exit"},
    {"NIBBLE_DIAG_PHASE_TIMING", "flag", "off",
     "SM-clock phase stamps of the one-launch MoE block, router and sampler"},
    {"NIBBLE_DIAG_REPEAT_OP", "name", "off", "run this op twice a step (its cost inside the decode graph)"},
    {"NIBBLE_DIAG_NO_PDL", "flag", "off", "launch every kernel without programmatic dependent launch"},
    {"NIBBLE_DIAG_NO_AVX2", "flag", "off", "take the scalar path of the synthetic weights' generator"},
    {"NIBBLE_DIAG_FAIL_ENGINE", "ENGINE:LAUNCH", "off",
     "data-parallel engine ENGINE's model steps fail from its LAUNCH-th on (a replica failing, in tests)"},
};

const EnvVar* find(const char* name) {
  for (const EnvVar& v : VARS)
    if (std::strcmp(v.name, name) == 0) return &v;
  return nullptr;
}

}  // namespace

std::span<const EnvVar> env_vars() { return VARS; }

const char* env_value(const char* name) {
  if (!find(name)) {
    std::fprintf(stderr, "nibble: %s is read but not in the environment table (src/core/env.cpp)\n", name);
    std::abort();
  }
  return std::getenv(name);
}

int64_t env_int(const char* name, int64_t fallback) {
  const char* value = env_value(name);
  return value ? std::atoll(value) : fallback;
}

bool env_flag(const char* name) {
  const char* value = env_value(name);
  return value && std::strcmp(value, "1") == 0;
}

std::string env_help() {
  std::string out =
      "Environment variables (every `nibble serve` flag is also NIBBLE_<FLAG>, e.g. NIBBLE_MAX_MODEL_LEN):\n";
  for (const EnvVar& v : VARS) {
    char line[512];
    std::snprintf(line, sizeof line, "  %-26s %-5s default: %s\n      %s\n", v.name, v.type, v.default_value, v.doc);
    out += line;
  }
  return out;
}

}  // namespace nibble

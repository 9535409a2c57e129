// Every NIBBLE_* environment variable nibble reads, in one typed table (`nibble --help-env` prints
// it): a few product settings beside the flags, and diagnostics, which all start NIBBLE_DIAG_.
// Each `nibble serve` flag is also read as NIBBLE_<FLAG> (tools/cmd_serve.cpp), not listed here.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace nibble {

struct EnvVar {
  const char* name;
  const char* type;           // "int", "path", "name", "flag" (set to 1 to turn on)
  const char* default_value;  // what unset means
  const char* doc;            // one line
};

std::span<const EnvVar> env_vars();

// The variable's value, or null when unset. Reading a name the table does not list is a bug: it
// aborts, so a new variable cannot ship undocumented.
const char* env_value(const char* name);
// As an integer (std::atoll's reading), or `fallback` when unset.
int64_t env_int(const char* name, int64_t fallback);
// A "flag" variable: set to 1.
bool env_flag(const char* name);

// The table as `nibble --help-env` prints it.
std::string env_help();

}  // namespace nibble

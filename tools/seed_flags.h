// The launch settings of the seeds nibble's users come from (FastDeploy, SGLang) that have no
// nibble name: their environment variables and SGLang's --moe-runner-backend, mapped onto serve's
// options with one start-up line each saying what they became (docs/api.md has the table).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "server/server.h"

namespace nibble::tools {

struct ExplicitServeFlags {  // nibble's own settings, which win over a seed's
  bool moe_backend = false, gemm_backend = false, act_quant_moe = false;
};

// Applies what `getenv` finds and moe_runner_backend (SGLang's flag; "" when not given) to options;
// returns the lines to log.
std::vector<std::string> apply_seed_flags(server::ServerOptions& options, const ExplicitServeFlags& explicit_flags,
                                          const std::string& moe_runner_backend,
                                          const std::function<const char*(const char*)>& getenv);

}  // namespace nibble::tools

// Parsing comma-separated token ids from the command line ("1,2,3").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace nibble::tools {

Result<std::vector<int32_t>> parse_token_ids(const std::string& text, const std::string& option);

}  // namespace nibble::tools

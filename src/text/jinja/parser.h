// Jinja template parsing with the options transformers uses for chat templates (trim_blocks,
// lstrip_blocks, the loopcontrols extension). Errors name the line.
#pragma once

#include <string>

#include "text/jinja/ast.h"

namespace nibble::text::jinja {

Result<NodeList> parse_template(const std::string& source);

// The name a filter block's or filtered set block's captured output is bound to while its filter
// expression (BLOCK_INPUT | f | g(...)) is evaluated.
inline constexpr const char* BLOCK_INPUT = "__block_input__";

}  // namespace nibble::text::jinja

// Jinja template parsing with the options transformers uses for chat templates (trim_blocks,
// lstrip_blocks, the loopcontrols extension). Errors name the line.
#pragma once

#include <string>

#include "text/jinja/ast.h"

namespace nibble::text::jinja {

Result<NodeList> parse_template(const std::string& source);

}  // namespace nibble::text::jinja

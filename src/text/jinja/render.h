// Renders a parsed Jinja template with Python/jinja2 semantics: the filters, tests, string/dict
// methods and globals chat templates use (transformers' environment: tojson, raise_exception,
// strftime_now, loop controls).
#pragma once

#include <string>

#include "text/jinja/ast.h"

namespace nibble::text::jinja {

// variables: the top-level names (messages, tools, add_generation_prompt, bos_token, ...).
Result<std::string> render(const NodeList& nodes, const Dict& variables);

}  // namespace nibble::text::jinja

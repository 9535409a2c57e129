// Structured output's request fields, one reader for every API: OpenAI's response_format and
// tool_choice ("required", a named function), vLLM's structured_outputs and guided_* fields, SGLang's
// json_schema / regex / ebnf sampling params; and the compilation that turns the constraint into the
// engine request's grammar (an invalid constraint is a 400 naming its field).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "engine/request.h"
#include "grammar/grammar.h"
#include "server/api_error.h"
#include "text/tokenizer.h"

namespace nibble::server {

struct LoadedModel;

// A constraint and the request field it came from (what a 400 names).
struct ConstraintField {
  grammar::Constraint constraint;
  std::string field;
  // Where the JSON schema (an object) is in the body, as a JSON pointer: nibble's json sorts object
  // keys, and a schema's properties come out in the order it names them, so keep_key_order takes
  // the schema again from the body as written. Empty: the text is as the client wrote it.
  std::string schema_pointer;
};

// The constraint's schema in the key order of the request body `raw` (see schema_pointer).
void keep_key_order(const std::string& raw, ConstraintField& c);

// Reads OpenAI's response_format, vLLM's structured_outputs and guided_json / guided_regex /
// guided_choice / guided_grammar, and SGLang's json_schema / regex / ebnf from `f` (a body, or
// /generate's sampling_params): at most one may constrain. False with f.error set on a bad field.
bool read_constraint(RequestFields& f, std::optional<ConstraintField>& out);

// tool_choice "required" (some tool) or {"type": "function", "function": {"name": …}} (that one) over
// `tools`: the output is tool calls in the chat template's format (Qwen3's <tool_call> JSON), their
// arguments following each tool's parameter schema; `parallel`: one or more calls, else one. A
// tool_choice of "auto" or "none" constrains nothing. False with f.error set on a bad field.
// `raw`: the request body as written (the tools' parameter schemas keep their key order).
bool read_tool_constraint(RequestFields& f, const json& tools, const json& tool_choice, bool parallel,
                          const std::string& raw, std::optional<ConstraintField>& out);

// Compiles the constraint (cached by the model's grammar compiler) into r.grammar; `reasoning`: the
// model may think first (a chat whose prompt leaves thinking open), so the grammar starts after its
// </think>. False with `error` set (400 on the constraint's field) when the constraint is invalid.
bool compile_constraint(const LoadedModel& model, const ConstraintField& c, bool reasoning,
                        engine::GenerationRequest& r, ApiError& error);

// Whether a reasoning model's chat prompt leaves thinking open (no </think> among its last tokens:
// enable_thinking false renders an empty, closed block).
bool prompt_leaves_thinking_open(const LoadedModel& model, const std::vector<int32_t>& prompt);

// The grammar vocabulary of a model: each id's decoded bytes ("" for special tokens and ids past
// the tokenizer), its EOS ids as the stop tokens.
grammar::Vocabulary grammar_vocabulary(const text::Tokenizer& tokenizer, int64_t vocab_size,
                                       const std::vector<int32_t>& eos_ids);

}  // namespace nibble::server

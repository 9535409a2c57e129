// The structured-output fields of every API into one grammar::Constraint, and its compilation.
// Field shapes: OpenAI's response_format and tool_choice (platform.openai.com/docs/api-reference/chat),
// vLLM's structured_outputs / guided_* (vllm/sampling_params.py StructuredOutputsParams), SGLang's
// sampling_params json_schema / regex / ebnf (sglang docs, "Structured Outputs").
#include "server/structured_output.h"

#include "server/context.h"

namespace nibble::server {
namespace {

using grammar::ConstraintKind;

// A JSON schema given as an object, or as a string holding one (vLLM and SGLang take both); an
// object's place in the body (`place`, a JSON pointer) goes to `pointer` (keep_key_order).
bool schema_text(RequestFields& f, const char* key, const json& value, std::string& out, std::string* pointer = nullptr,
                 const std::string& place = "") {
  if (value.is_object() || value.is_boolean()) {
    out = value.dump();
    if (pointer) *pointer = place;
    return true;
  }
  if (value.is_string()) {
    out = value.get<std::string>();
    return true;
  }
  return f.fail(key, "must be a JSON schema (an object, or a string holding one)");
}

bool string_value(RequestFields& f, const char* key, const json& value, std::string& out) {
  if (!value.is_string() || value.get<std::string>().empty()) return f.fail(key, "must be a non-empty string");
  out = value.get<std::string>();
  return true;
}

bool choice_list(RequestFields& f, const char* key, const json& value, std::vector<std::string>& out) {
  if (!value.is_array() || value.empty()) return f.fail(key, "must be a non-empty list of strings");
  for (const json& c : value) {
    if (!c.is_string()) return f.fail(key, "must be a non-empty list of strings");
    out.push_back(c.get<std::string>());
  }
  return true;
}

// Sets `out` from one field; a second constraining field is an error naming both.
bool take(RequestFields& f, std::optional<ConstraintField>& out, const std::string& field, grammar::Constraint c,
          std::string pointer = "") {
  if (out)
    return f.fail(field.c_str(), "cannot be combined with '" + out->field + "' (one structured-output constraint)");
  out = ConstraintField{std::move(c), field, std::move(pointer)};
  return true;
}

bool read_response_format(RequestFields& f, std::optional<ConstraintField>& out) {
  const json& rf = f.at("response_format");
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
    return f.fail("response_format", "must be an object with a 'type'");
  const std::string type = rf["type"];
  if (type == "text") return true;
  if (type == "json_object") return take(f, out, "response_format", {ConstraintKind::JSON_OBJECT, "", {}});
  if (type != "json_schema")
    return f.fail("response_format", "type must be 'text', 'json_object' or 'json_schema', got '" + type + "'");
  if (!rf.contains("json_schema") || !rf["json_schema"].is_object())
    return f.fail("response_format", "json_schema must be an object with the schema in 'schema'");
  const json& js = rf["json_schema"];
  if (js.contains("name") && !js["name"].is_string())
    return f.fail("response_format", "json_schema.name must be a string");
  if (js.contains("strict") && !js["strict"].is_boolean() && !js["strict"].is_null())
    return f.fail("response_format", "json_schema.strict must be a boolean");
  // OpenAI's schema lives in json_schema.schema (vLLM also reads json_schema.json_schema's older spelling).
  const char* key = js.contains("schema") ? "schema" : "json_schema";
  grammar::Constraint c{ConstraintKind::JSON_SCHEMA, "", {}};
  if (!js.contains(key)) return f.fail("response_format", "json_schema.schema is required");
  std::string pointer;
  if (!schema_text(f, "response_format", js[key], c.text, &pointer, std::string("/response_format/json_schema/") + key))
    return false;
  return take(f, out, "response_format", std::move(c), std::move(pointer));
}

bool read_vllm_object(RequestFields& f, std::optional<ConstraintField>& out) {
  const json& so = f.at("structured_outputs");
  if (!so.is_object()) return f.fail("structured_outputs", "must be an object");
  for (const auto& [key, value] : so.items()) {
    if (value.is_null()) continue;
    const std::string field = "structured_outputs." + key;
    grammar::Constraint c;
    std::string pointer;
    if (key == "json") {
      c.kind = ConstraintKind::JSON_SCHEMA;
      if (!schema_text(f, "structured_outputs", value, c.text, &pointer, "/structured_outputs/json")) return false;
    } else if (key == "regex") {
      c.kind = ConstraintKind::REGEX;
      if (!string_value(f, "structured_outputs", value, c.text)) return false;
    } else if (key == "choice") {
      c.kind = ConstraintKind::CHOICE;
      if (!choice_list(f, "structured_outputs", value, c.choices)) return false;
    } else if (key == "grammar") {
      c.kind = ConstraintKind::EBNF;
      if (!string_value(f, "structured_outputs", value, c.text)) return false;
    } else if (key == "json_object") {
      if (!value.is_boolean()) return f.fail("structured_outputs", "json_object must be a boolean");
      if (!value.get<bool>()) continue;
      c.kind = ConstraintKind::JSON_OBJECT;
    } else if (key == "disable_any_whitespace" || key == "disable_fallback" || key == "disable_additional_properties" ||
               key == "whitespace_pattern") {
      continue;  // options of vLLM's backends; nibble's JSON is compact, never falls back
    } else {
      return f.fail("structured_outputs", "'" + key + "' is not supported (json, regex, choice, grammar, json_object)");
    }
    if (!take(f, out, field, std::move(c), std::move(pointer))) return false;
  }
  return true;
}

// A tool's parameter schema as the body wrote it (key order kept), or any object when it has none;
// false (f.error set) when the tool is malformed.
bool tool_parameters(RequestFields& f, const json& tools, size_t i, const nlohmann::ordered_json& ordered,
                     std::string& name, std::string& parameters) {
  const json& tool = tools[i];
  if (!tool.is_object() || !tool.contains("function") || !tool["function"].is_object() ||
      !tool["function"].contains("name") || !tool["function"]["name"].is_string())
    return f.fail("tools", "each tool must be {\"type\": \"function\", \"function\": {\"name\": …}}");
  const json& fn = tool["function"];
  name = fn["name"];
  const bool given = fn.contains("parameters") && !fn["parameters"].is_null();
  if (given && !fn["parameters"].is_object())
    return f.fail("tools", "function '" + name + "': parameters must be a JSON schema");
  const nlohmann::ordered_json::json_pointer at("/tools/" + std::to_string(i) + "/function/parameters");
  parameters = !given                                            ? std::string(R"({"type":"object"})")
               : ordered.is_discarded() || !ordered.contains(at) ? fn["parameters"].dump()
                                                                 : ordered[at].dump();
  return true;
}

// tool_choice "auto" with a tool marked "strict": true — free text, but each <tool_call> that
// the model opens must name a tool, and a strict tool's arguments follow its parameter schema
// (the others' any JSON object): an xgrammar structural tag triggered by <tool_call>. Its JSON
// takes any whitespace, capped at one character a gap (a random model would fill it forever).
bool read_strict_tools(RequestFields& f, const json& tools, const std::string& raw,
                       std::optional<ConstraintField>& out) {
  if (!tools.is_array()) return true;
  bool any_strict = false;
  for (const json& tool : tools)
    any_strict |= tool.is_object() && tool.contains("function") && tool["function"].is_object() &&
                  tool["function"].value("strict", false) == true;
  if (!any_strict) return true;
  const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(raw, nullptr, false);
  std::string tags;
  for (size_t i = 0; i < tools.size(); ++i) {
    std::string name, parameters;
    if (!tool_parameters(f, tools, i, ordered, name, parameters)) return false;
    if (!tools[i]["function"].value("strict", false)) parameters = R"({"type":"object"})";
    tags += std::string(tags.empty() ? "" : ",") + R"({"type":"tag","begin":)" +
            json("<tool_call>\n{\"name\": " + json(name).dump() + ", \"arguments\": ").dump() +
            R"(,"content":{"type":"json_schema","max_whitespace_cnt":1,"json_schema":)" + parameters +
            R"(},"end":"}\n</tool_call>"})";
  }
  grammar::Constraint c{ConstraintKind::STRUCTURAL_TAG,
                        R"({"type":"structural_tag","format":{"type":"triggered_tags","triggers":["<tool_call>"],)"
                        R"("tags":[)" +
                            tags + "]}}",
                        {}};
  return take(f, out, "tools", std::move(c));
}

}  // namespace

bool read_constraint(RequestFields& f, std::optional<ConstraintField>& out) {
  if (f.has("response_format") && !read_response_format(f, out)) return false;
  if (f.has("structured_outputs") && !read_vllm_object(f, out)) return false;
  struct Plain {
    const char* key;
    ConstraintKind kind;
  };
  // vLLM's older guided_* fields and SGLang's sampling params: one key, one kind.
  static constexpr Plain PLAIN[] = {
      {"guided_json", ConstraintKind::JSON_SCHEMA},
      {"guided_regex", ConstraintKind::REGEX},
      {"guided_choice", ConstraintKind::CHOICE},
      {"guided_grammar", ConstraintKind::EBNF},
      {"json_schema", ConstraintKind::JSON_SCHEMA},
      {"regex", ConstraintKind::REGEX},
      {"ebnf", ConstraintKind::EBNF},
  };
  for (const Plain& p : PLAIN) {
    if (!f.has(p.key)) continue;
    grammar::Constraint c{p.kind, "", {}};
    const json& value = f.at(p.key);
    std::string pointer;
    const bool ok = p.kind == ConstraintKind::JSON_SCHEMA
                        ? schema_text(f, p.key, value, c.text, &pointer, std::string("/") + p.key)
                    : p.kind == ConstraintKind::CHOICE ? choice_list(f, p.key, value, c.choices)
                                                       : string_value(f, p.key, value, c.text);
    if (!ok || !take(f, out, p.key, std::move(c), std::move(pointer))) return false;
  }
  if (f.has("structural_tag")) return f.fail("structural_tag", "is not supported");
  return !f.error;
}

bool read_tool_constraint(RequestFields& f, const json& tools, const json& tool_choice, bool parallel,
                          const std::string& raw, std::optional<ConstraintField>& out) {
  std::string wanted;  // a named function; "" with "required"
  if (tool_choice.is_string()) {
    const std::string choice = tool_choice;
    if (choice == "none") return true;
    if (choice == "auto") return read_strict_tools(f, tools, raw, out);
    if (choice != "required")
      return f.fail("tool_choice",
                    "must be \"auto\", \"none\", \"required\" or a named function, got \"" + choice + "\"");
  } else if (tool_choice.is_object() && tool_choice.value("type", "") == "function" &&
             tool_choice.contains("function") && tool_choice["function"].is_object() &&
             tool_choice["function"].contains("name") && tool_choice["function"]["name"].is_string()) {
    wanted = tool_choice["function"]["name"];
  } else {
    return f.fail("tool_choice",
                  "must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": "
                  "{\"name\": …}}");
  }
  if (!tools.is_array() || tools.empty()) return f.fail("tool_choice", "needs a non-empty 'tools' list");
  // The calls' schemas as text, each tool's parameters in the key order the body wrote them.
  const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(raw, nullptr, false);
  std::vector<std::string> calls;
  for (size_t i = 0; i < tools.size(); ++i) {
    std::string name, parameters;
    if (!tool_parameters(f, tools, i, ordered, name, parameters)) return false;
    if (!wanted.empty() && name != wanted) continue;
    // Qwen3's call: {"name": <name>, "arguments": <the parameters' object>}, name first.
    calls.push_back(R"({"type":"object","properties":{"name":{"const":)" + json(name).dump() + R"(},"arguments":)" +
                    parameters + R"(},"required":["name","arguments"],"additionalProperties":false})");
  }
  if (calls.empty()) return f.fail("tool_choice", "names the function '" + wanted + "', which 'tools' does not have");
  std::string schema = calls[0];
  if (calls.size() > 1) {
    schema = R"({"anyOf":[)";
    for (size_t i = 0; i < calls.size(); ++i) schema += (i ? "," : "") + calls[i];
    schema += "]}";
  }
  grammar::Constraint c{ConstraintKind::TOOL_CALLS, std::move(schema), {}};
  c.call_begin = "<tool_call>\n";  // the Hermes / Qwen3 format the chat template renders and chat_output parses
  c.call_end = "\n</tool_call>";
  c.repeated_calls = parallel && wanted.empty();
  return take(f, out, "tool_choice", std::move(c));
}

void keep_key_order(const std::string& raw, ConstraintField& c) {
  if (c.schema_pointer.empty()) return;
  const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(raw, nullptr, false);
  const nlohmann::ordered_json::json_pointer at(c.schema_pointer);
  if (!ordered.is_discarded() && ordered.contains(at)) c.constraint.text = ordered[at].dump();
}

bool compile_constraint(const LoadedModel& model, const ConstraintField& c, bool reasoning,
                        engine::GenerationRequest& r, ApiError& error) {
  if (!model.grammar) {
    error = {400, "structured output needs the model's tokenizer", c.field};
    return false;
  }
  auto compiled = model.grammar->compile(c.constraint);
  if (!compiled) {
    error = {400, c.field + ": " + compiled.status().message(), c.field};
    return false;
  }
  r.grammar = std::move(compiled.value());
  if (reasoning) {
    r.think_start = model.tokenizer->token_to_id("<think>");
    r.think_end = model.tokenizer->token_to_id("</think>");
  }
  return true;
}

bool prompt_leaves_thinking_open(const LoadedModel& model, const std::vector<int32_t>& prompt) {
  if (!model.parse_reasoning) return false;
  const int32_t end = model.tokenizer->token_to_id("</think>");
  const size_t tail = std::min<size_t>(prompt.size(), 8);
  for (size_t i = prompt.size() - tail; i < prompt.size(); ++i)
    if (prompt[i] == end) return false;
  return true;
}

grammar::Vocabulary grammar_vocabulary(const text::Tokenizer& tokenizer, int64_t vocab_size,
                                       const std::vector<int32_t>& eos_ids) {
  grammar::Vocabulary v;
  v.token_bytes.resize(static_cast<size_t>(vocab_size));
  const int64_t known = std::min<int64_t>(vocab_size, static_cast<int64_t>(tokenizer.vocab_size()));
  for (int32_t id = 0; id < known; ++id)
    if (!tokenizer.is_special(id)) v.token_bytes[static_cast<size_t>(id)] = std::string(tokenizer.token_bytes(id));
  for (int32_t id : eos_ids)
    if (id >= 0 && id < vocab_size) v.stop_ids.push_back(id);
  return v;
}

}  // namespace nibble::server

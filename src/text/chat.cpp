// Chat template loading and rendering. transformers (chat_template_utils.render_jinja_template)
// calls template.render(messages=..., tools=..., documents=..., add_generation_prompt=...,
// **special_tokens_map, **chat_template_kwargs).
#include "text/chat.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "text/jinja/parser.h"
#include "text/jinja/render.h"

namespace nibble::text {

using json = nlohmann::ordered_json;

namespace {

// `x.content` or `x["content"]`, under any filters, tests and slices (`message.content | default([])`).
bool reads_content(const jinja::Expr& e) {
  using K = jinja::Expr::Kind;
  if ((e.kind == K::FILTER || e.kind == K::TEST || e.kind == K::SLICE) && !e.children.empty() && e.children[0])
    return reads_content(*e.children[0]);
  if (e.kind == K::ATTR) return e.name == "content";
  return e.kind == K::ITEM && e.children.size() == 2 && e.children[1] && e.children[1]->kind == K::LITERAL &&
         e.children[1]->literal.is_string() && e.children[1]->literal.as_string() == "content";
}

bool loops_over_content(const jinja::NodeList& nodes) {
  for (const auto& n : nodes) {
    if (!n) continue;
    if (n->kind == jinja::Node::Kind::FOR && n->expr && reads_content(*n->expr)) return true;
    if (loops_over_content(n->body) || loops_over_content(n->else_body)) return true;
    for (const auto& [condition, body] : n->branches)
      if (loops_over_content(body)) return true;
  }
  return false;
}

}  // namespace

Result<std::shared_ptr<const ChatTemplate>> ChatTemplate::from_source(const std::string& source, json special_tokens) {
  Result<jinja::NodeList> nodes = Status::error("");
  try {  // the parser reports errors as Status; this is the net under any slip (std::out_of_range)
    nodes = jinja::parse_template(source);
  } catch (const std::exception& e) {
    return Status::error(std::string("chat template: internal parser error: ") + e.what());
  }
  if (!nodes) return Status::error("chat template: " + nodes.status().message());
  auto t = std::shared_ptr<ChatTemplate>(new ChatTemplate());
  t->nodes_ = std::move(*nodes);
  t->takes_content_parts_ = loops_over_content(t->nodes_);
  t->special_tokens_ = std::move(special_tokens);
  return std::shared_ptr<const ChatTemplate>(t);
}

namespace {

Result<std::shared_ptr<const ChatTemplate>> load_unchecked(const std::string& model_dir) {
  const std::string config_path = model_dir + "/tokenizer_config.json";
  std::ifstream in(config_path);
  json config = json::object();
  if (in) {
    config = json::parse(in, nullptr, false);
    if (config.is_discarded() || !config.is_object()) return Status::error(config_path + ": not valid JSON");
  }
  std::string source;
  const std::string jinja_path = model_dir + "/chat_template.jinja";
  if (std::filesystem::exists(jinja_path)) {
    std::ifstream j(jinja_path);
    std::stringstream buf;
    buf << j.rdbuf();
    source = buf.str();
  } else if (config.contains("chat_template") && config["chat_template"].is_string()) {
    source = config["chat_template"].get<std::string>();
  } else if (config.contains("chat_template") && config["chat_template"].is_array()) {
    for (const auto& named : config["chat_template"])  // [{"name": "default", "template": ...}, ...]
      if (named.value("name", "") == "default") source = named.value("template", "");
  }
  if (source.empty())
    return Status::error(model_dir + ": no chat template (tokenizer_config.json or chat_template.jinja)");
  json special = json::object();
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    if (!config.contains(key) || config[key].is_null()) continue;
    const json& v = config[key];
    special[key] = v.is_object() ? json(v.value("content", "")) : v;  // AddedToken dicts carry "content"
  }
  return ChatTemplate::from_source(source, special);
}

}  // namespace

Result<std::string> ChatTemplate::render(const json& request) const {
  if (!request.is_object()) return Status::error("the request must be a JSON object");
  if (!request.contains("messages") || !request["messages"].is_array())
    return Status::error("'messages' must be a list of messages");
  for (const json& m : request["messages"]) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return Status::error("every message needs a string 'role'");
  }
  jinja::Dict vars;
  for (const auto& [k, v] : special_tokens_.items()) vars.emplace_back(k, jinja::Value::from_json(v));
  vars.emplace_back("messages", jinja::Value::from_json(request["messages"]));
  vars.emplace_back("tools", request.contains("tools") && !request["tools"].is_null()
                                 ? jinja::Value::from_json(request["tools"])
                                 : jinja::Value::none());
  vars.emplace_back("documents", request.contains("documents") && !request["documents"].is_null()
                                     ? jinja::Value::from_json(request["documents"])
                                     : jinja::Value::none());
  const json gen = request.value("add_generation_prompt", json(true));
  vars.emplace_back("add_generation_prompt", jinja::Value::from_json(gen));
  if (request.contains("chat_template_kwargs") && !request["chat_template_kwargs"].is_null()) {
    if (!request["chat_template_kwargs"].is_object()) return Status::error("'chat_template_kwargs' must be an object");
    for (const auto& [k, v] : request["chat_template_kwargs"].items()) {
      const std::string key = k;  // structured bindings cannot be captured by lambdas in clang 14
      auto it = std::find_if(vars.begin(), vars.end(), [&](const auto& kv) { return kv.first == key; });
      if (it != vars.end())
        it->second = jinja::Value::from_json(v);
      else
        vars.emplace_back(key, jinja::Value::from_json(v));
    }
  }
  try {  // rendering reports errors as Status; this is the net under any slip
    return jinja::render(nodes_, vars);
  } catch (const std::exception& e) {
    return Status::error(std::string("chat template: internal error while rendering: ") + e.what());
  }
}

Result<std::shared_ptr<const ChatTemplate>> ChatTemplate::load(const std::string& model_dir) {
  try {  // fields of unexpected JSON types throw in nlohmann's accessors
    return load_unchecked(model_dir);
  } catch (const nlohmann::json::exception& e) {
    return Status::error(model_dir + ": chat template config: " + e.what());
  }
}

}  // namespace nibble::text

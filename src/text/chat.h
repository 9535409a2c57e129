// Chat templates: the model's Jinja template (tokenizer_config.json "chat_template", or
// chat_template.jinja) rendered for an OpenAI-style request exactly as transformers'
// apply_chat_template renders it.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"
#include "text/jinja/ast.h"

namespace nibble::text {

class ChatTemplate {
 public:
  // Reads the template and special tokens from a model folder; a template that does not parse is
  // an error here, at load.
  static Result<std::shared_ptr<const ChatTemplate>> load(const std::string& model_dir);
  static Result<std::shared_ptr<const ChatTemplate>> from_source(const std::string& source,
                                                                 nlohmann::ordered_json special_tokens);

  // request: {"messages": [...], "tools"?: [...], "documents"?: [...], "add_generation_prompt"?:
  // bool (default true), "chat_template_kwargs"?: {...}}. Errors (bad messages, a
  // raise_exception in the template) are request errors.
  Result<std::string> render(const nlohmann::ordered_json& request) const;

  // Whether the template loops over a message's content (`for part in message.content`, filters
  // and slices around it allowed): it takes OpenAI content parts as a list, where other templates
  // take content as a string. vLLM decides its chat_template_content_format "auto" the same way.
  bool takes_content_parts() const { return takes_content_parts_; }

 private:
  jinja::NodeList nodes_;
  bool takes_content_parts_ = false;
  nlohmann::ordered_json special_tokens_;  // bos_token, eos_token, ... as transformers passes them
};

}  // namespace nibble::text

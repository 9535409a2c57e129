// OpenAI chat messages made ready for a model's chat template: content given as a list of parts
// ({"type": "text", "text": ...}, as the openai client and most apps send it) becomes the string a
// string template expects, or a list of text parts for a template that loops over them.
#pragma once

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace nibble::server {

// messages: the request's "messages" (a list). Each needs a string role; content a string, a list
// of "text" (or assistant "refusal") parts, or absent/null for an assistant message. Text parts
// join with "\n" for a string template, as vLLM joins them. Any other part (image_url, input_audio,
// file, ...) or shape is an error naming the message and part: these models take text only.
Result<nlohmann::json> chat_messages_for_template(const nlohmann::json& messages, bool template_takes_parts);

}  // namespace nibble::server

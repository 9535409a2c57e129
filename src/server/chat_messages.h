// OpenAI chat messages made ready for a model's chat template: content given as a list of parts
// ({"type": "text", "text": ...}, as the openai client and most apps send it) becomes the string a
// string template expects, or a list of text parts for a template that loops over them.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "core/status.h"
#include "text/chat.h"

namespace nibble::server {

// messages: the request's "messages" (a list). Each needs a string role; content a string, a list
// of "text" (or assistant "refusal") parts, or absent/null for an assistant message. Text parts
// join with "\n" for a string template, as vLLM joins them. Any other part (image_url, input_audio,
// file, ...) or shape is an error naming the message and part: these models take text only.
Result<nlohmann::json> chat_messages_for_template(const nlohmann::json& messages, bool template_takes_parts);

// The prompt text of a chat request body: its messages made ready for `chat` (above), rendered with
// add_generation_prompt, body's tools when with_tools, and its chat_template_kwargs. Errors (bad
// messages, the template's own) are the request's. The routes check the body's shapes first.
// continue_final_message (vLLM's, with add_generation_prompt false): the text ends where the final
// message's text ends, so the model continues it (assistant prefill).
Result<std::string> render_chat_request(const text::ChatTemplate& chat, const nlohmann::json& body,
                                        bool add_generation_prompt, bool with_tools,
                                        bool continue_final_message = false);

// transformers' apply_chat_template(continue_final_message=True): `rendered` cut after the last
// occurrence of the final message's text (stripped; its leading whitespace-stripped form when the
// template kept its trailing spaces), or an error when the template dropped it.
Result<std::string> cut_after_final_message(const std::string& rendered, const nlohmann::json& messages);

}  // namespace nibble::server

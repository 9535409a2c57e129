// chat_messages_for_template: the content rules of OpenAI's chat message types (system, developer,
// user, assistant, tool) with vLLM's handling of text parts (entrypoints/chat_utils.py).
#include "server/chat_messages.h"

#include <string>

namespace nibble::server {
namespace {

using json = nlohmann::json;

Status part_error(size_t m, size_t p, const std::string& what) {
  return Status::error("messages[" + std::to_string(m) + "].content[" + std::to_string(p) + "]: " + what);
}

// The text parts of message m's content list, each's text checked.
Result<std::vector<std::string>> part_texts(const json& parts, size_t m, const std::string& role) {
  std::vector<std::string> texts;
  for (size_t p = 0; p < parts.size(); ++p) {
    const json& part = parts[p];
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      return part_error(m, p, "a content part must be an object with a string 'type'");
    const std::string type = part["type"].get<std::string>();
    // An assistant's refusal part carries its text under "refusal" (ChatCompletionContentPartRefusalParam).
    const char* field = type == "text" ? "text" : type == "refusal" && role == "assistant" ? "refusal" : nullptr;
    if (!field) {
      const bool media = type == "image_url" || type == "input_audio" || type == "file" || type == "video_url" ||
                         type == "audio_url" || type == "image";
      return part_error(m, p,
                        media ? "'" + type + "' parts are not supported: the served model takes text only"
                              : "unknown content part type '" + type + "' (expected 'text')");
    }
    if (!part.contains(field) || !part[field].is_string())
      return part_error(m, p, "a '" + type + "' part needs a string '" + field + "'");
    texts.push_back(part[field].get<std::string>());
  }
  return texts;
}

}  // namespace

Result<json> chat_messages_for_template(const json& messages, bool template_takes_parts) {
  if (!messages.is_array()) return Status::error("'messages' must be a list of messages");
  json out = json::array();
  for (size_t m = 0; m < messages.size(); ++m) {
    const json& message = messages[m];
    const std::string where = "messages[" + std::to_string(m) + "]";
    if (!message.is_object()) return Status::error(where + " must be an object");
    if (!message.contains("role") || !message["role"].is_string())
      return Status::error(where + " needs a string 'role'");
    const std::string role = message["role"].get<std::string>();
    json copy = message;
    const bool has_content = message.contains("content") && !message["content"].is_null();
    if (!has_content) {
      // Only an assistant turn may leave content out (one that only calls tools, say). It reaches the
      // template as "", as vLLM gives it: templates concatenate content (Qwen3's fails on none).
      if (role != "assistant") return Status::error(where + ": 'content' is required for role '" + role + "'");
      copy["content"] = template_takes_parts ? json::array() : json("");
    } else if (message["content"].is_array()) {
      auto texts = part_texts(message["content"], m, role);
      if (!texts) return texts.status();
      if (template_takes_parts) {
        copy["content"] = json::array();
        for (std::string& t : *texts) copy["content"].push_back({{"type", "text"}, {"text", std::move(t)}});
      } else {
        std::string joined;
        for (size_t i = 0; i < texts->size(); ++i) joined += (i ? "\n" : "") + (*texts)[i];
        copy["content"] = std::move(joined);
      }
    } else if (!message["content"].is_string()) {
      return Status::error(where + ": 'content' must be a string or a list of content parts");
    }
    // Tool-call arguments arrive as JSON text (OpenAI's shape); templates expect an object, so text
    // that parses becomes one (vLLM's _postprocess_messages, per transformers' tool-use docs).
    if (role == "assistant" && copy.contains("tool_calls") && copy["tool_calls"].is_array())
      for (json& call : copy["tool_calls"])
        if (call.is_object() && call.contains("function") && call["function"].is_object() &&
            call["function"].contains("arguments") && call["function"]["arguments"].is_string()) {
          json parsed = json::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
          if (!parsed.is_discarded()) call["function"]["arguments"] = std::move(parsed);
        }
    out.push_back(std::move(copy));
  }
  return out;
}

namespace {

// The text a continued final message ends with: its content, or its last text part (transformers).
Result<std::string> final_message_text(const json& messages) {
  if (!messages.is_array() || messages.empty())
    return Status::error("continue_final_message needs a message to continue");
  const json& content = messages.back().contains("content") ? messages.back()["content"] : json();
  if (content.is_string()) return content.get<std::string>();
  if (content.is_array())
    for (auto part = content.rbegin(); part != content.rend(); ++part)
      if (part->is_object() && part->contains("text") && (*part)["text"].is_string())
        return (*part)["text"].get<std::string>();
  return Status::error("continue_final_message is set but the final message has no text to continue");
}

// Python's str.strip() (both sides) or str.lstrip(), over ASCII white space.
std::string strip(const std::string& s, bool right_too) {
  const char* ws = " \t\n\r\f\v";
  const size_t begin = s.find_first_not_of(ws);
  if (begin == std::string::npos) return "";
  const size_t end = right_too ? s.find_last_not_of(ws) + 1 : s.size();
  return s.substr(begin, end - begin);
}

}  // namespace

Result<std::string> cut_after_final_message(const std::string& rendered, const json& messages) {
  auto final_text = final_message_text(messages);
  if (!final_text) return final_text.status();
  const std::string& text = *final_text;
  const std::string stripped = strip(text, true);
  const size_t at = rendered.rfind(stripped);
  if (at == std::string::npos)
    return Status::error(
        "continue_final_message is set but the final message does not appear in the chat after "
        "applying the chat template");
  const std::string lstripped = strip(text, false);
  if (rendered.compare(at, lstripped.size(), text) == 0) return rendered.substr(0, at + lstripped.size());
  return rendered.substr(0, at + stripped.size());
}

Result<std::string> render_chat_request(const text::ChatTemplate& chat, const nlohmann::json& body,
                                        bool add_generation_prompt, bool with_tools, bool continue_final_message) {
  auto messages = chat_messages_for_template(body.at("messages"), chat.takes_content_parts());
  if (!messages) return messages.status();
  nlohmann::json request = {{"messages", std::move(*messages)}, {"add_generation_prompt", add_generation_prompt}};
  if (with_tools) request["tools"] = body.at("tools");
  if (body.contains("chat_template_kwargs") && !body.at("chat_template_kwargs").is_null())
    request["chat_template_kwargs"] = body.at("chat_template_kwargs");
  auto rendered = chat.render(nlohmann::ordered_json::parse(request.dump()));
  if (!rendered || !continue_final_message) return rendered;
  return cut_after_final_message(*rendered, body.at("messages"));
}

}  // namespace nibble::server

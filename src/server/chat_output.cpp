// ChatOutputParser: a small state machine over the text. Tags: Qwen3's <think>, </think> (vLLM's
// qwen3 reasoning parser), <tool_call>, </tool_call> (vLLM's hermes tool parser); a tool call whose
// JSON does not parse stays content, as vLLM leaves it.
#include "server/chat_output.h"

#include <random>

namespace nibble::server {
namespace {

const std::string THINK = "<think>", END_THINK = "</think>", TOOL = "<tool_call>", END_TOOL = "</tool_call>";

// Length of the longest suffix of `text` that is a proper prefix of `tag` (it may become the tag).
size_t partial_tag_suffix(const std::string& text, const std::string& tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n)
    if (text.compare(text.size() - n, n, tag, 0, n) == 0) return n;
  return 0;
}

std::string call_id() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* digits = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += digits[rng() % 62];
  return id;
}

// {"name": ..., "arguments": {...}} → an OpenAI tool call; null when it is not one.
nlohmann::json parse_tool_call(const std::string& body) {
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string()) return nullptr;
  const nlohmann::json arguments = j.contains("arguments") ? j["arguments"] : nlohmann::json::object();
  return {{"id", call_id()},
          {"type", "function"},
          {"function",
           {{"name", j["name"]},
            {"arguments", arguments.is_string()
                              ? arguments.get<std::string>()
                              : arguments.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)}}}};
}

}  // namespace

ChatDelta ChatOutputParser::add(const std::string& text) {
  pending_ += text;
  ChatDelta out;
  step(out, false);
  return out;
}

ChatDelta ChatOutputParser::finish() {
  ChatDelta out;
  step(out, true);
  return out;
}

void ChatOutputParser::emit_content(ChatDelta& out, const std::string& text) { out.content += text; }

void ChatOutputParser::step(ChatDelta& out, bool final) {
  for (;;) {
    switch (state_) {
      case START: {  // does the output open with <think>?
        if (pending_.compare(0, THINK.size(), THINK) == 0) {
          pending_.erase(0, THINK.size());
          state_ = REASONING;
          continue;
        }
        if (!final && pending_.size() < THINK.size() && THINK.compare(0, pending_.size(), pending_) == 0) return;
        state_ = CONTENT;
        continue;
      }
      case REASONING: {
        const size_t end = pending_.find(END_THINK);
        if (end != std::string::npos) {
          out.reasoning += pending_.substr(0, end);
          pending_.erase(0, end + END_THINK.size());
          state_ = CONTENT;
          continue;
        }
        const size_t keep = final ? 0 : partial_tag_suffix(pending_, END_THINK);
        out.reasoning += pending_.substr(0, pending_.size() - keep);
        pending_.erase(0, pending_.size() - keep);
        return;
      }
      case CONTENT: {
        if (!tools_) {
          emit_content(out, pending_);
          pending_.clear();
          return;
        }
        const size_t open = pending_.find(TOOL);
        if (open != std::string::npos) {
          emit_content(out, pending_.substr(0, open));
          pending_.erase(0, open + TOOL.size());
          state_ = TOOL_CALL;
          continue;
        }
        const size_t keep = final ? 0 : partial_tag_suffix(pending_, TOOL);
        emit_content(out, pending_.substr(0, pending_.size() - keep));
        pending_.erase(0, pending_.size() - keep);
        return;
      }
      case TOOL_CALL: {
        const size_t close = pending_.find(END_TOOL);
        if (close == std::string::npos && !final) return;
        const std::string body = pending_.substr(0, close);
        nlohmann::json call = parse_tool_call(body);
        if (call.is_null()) {
          emit_content(
              out, TOOL + pending_.substr(0, close == std::string::npos ? pending_.size() : close + END_TOOL.size()));
        } else if (n_tool_calls_ < max_tool_calls_) {
          out.tool_calls.push_back(std::move(call));
          ++n_tool_calls_;
        }  // else a call beyond the allowed count: dropped (vLLM keeps the first when parallel calls are off)
        pending_.erase(0, close == std::string::npos ? pending_.size() : close + END_TOOL.size());
        state_ = CONTENT;
        if (pending_.empty()) return;
        continue;
      }
    }
  }
}

}  // namespace nibble::server

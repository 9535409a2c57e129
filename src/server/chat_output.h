// Splits a chat completion's text into what OpenAI clients expect: Qwen3 reasoning
// (<think>…</think> → reasoning_content) and Hermes/Qwen3 tool calls (<tool_call>{json}</tool_call>
// → tool_calls), incrementally, so a stream and a whole response give the same result. Text that
// could still turn into a tag is held back until it is decided.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace nibble::server {

struct ChatDelta {
  std::string reasoning;
  std::string content;
  std::vector<nlohmann::json> tool_calls;  // {"id", "type": "function", "function": {"name", "arguments"}}
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

class ChatOutputParser {
 public:
  // Tool calls past max_tool_calls are dropped (parallel_tool_calls: false gives 1).
  ChatOutputParser(bool parse_reasoning, bool parse_tool_calls, int max_tool_calls = INT32_MAX)
      : reasoning_(parse_reasoning),
        tools_(parse_tool_calls),
        max_tool_calls_(max_tool_calls),
        state_(parse_reasoning ? START : CONTENT) {}
  ChatDelta add(const std::string& text);
  ChatDelta finish();  // the end of the output: whatever is held is decided now
  int tool_call_count() const { return n_tool_calls_; }

 private:
  enum State { START, REASONING, CONTENT, TOOL_CALL };
  void step(ChatDelta& out, bool final);
  void emit_content(ChatDelta& out, const std::string& text);

  bool reasoning_, tools_;
  int max_tool_calls_;
  State state_;
  std::string pending_;  // undecided text
  int n_tool_calls_ = 0;
};

}  // namespace nibble::server

// libFuzzer target: any template text must parse to a tree or a clear error, and any tree must
// render to text or a clear error: no crash, no unbounded recursion, no hang.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "text/chat.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  auto chat = nibble::text::ChatTemplate::from_source(source, {{"bos_token", "<s>"}});
  if (!chat) return 0;
  static const nlohmann::ordered_json request = nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"},
                 {"role": "assistant", "content": "<think>\nr\n</think>\n\nok",
                  "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]},
                 {"role": "tool", "content": "{\"x\": 2}"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
    "chat_template_kwargs": {"enable_thinking": false}})");
  (void)(*chat)->render(request);
  return 0;
}

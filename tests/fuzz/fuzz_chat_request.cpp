// libFuzzer target: any chat request body goes through what /v1/chat/completions does before it
// tokenizes — server::render_chat_request: `messages` made ready for the template, then the real
// Qwen3 chat template with the body's tools and chat_template_kwargs — and must give a prompt or a
// clear error: no crash, no unbounded recursion, no hang. Where jinja's target fuzzes template text, this one fuzzes the data a fixed template sees.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "server/chat_messages.h"
#include "text/chat.h"

namespace {

const nibble::text::ChatTemplate& qwen3_template() {
  static const auto chat = [] {
    std::ifstream in(NIBBLE_FUZZ_CHAT_TEMPLATE);
    const std::string source((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto t = nibble::text::ChatTemplate::from_source(source, {{"bos_token", ""}, {"eos_token", "<|im_end|>"}});
    if (!t) {
      std::fprintf(stderr, "fuzz_chat_request: %s: %s\n", NIBBLE_FUZZ_CHAT_TEMPLATE, t.status().message().c_str());
      std::abort();
    }
    return *t;
  }();
  return *chat;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json body = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  // The route's own checks before it renders (routes_generation.cpp): a non-empty list of messages,
  // tools a list, chat_template_kwargs an object.
  if (!body.is_object() || !body.contains("messages") || !body["messages"].is_array() || body["messages"].empty()) return 0;
  if (body.contains("tools") && !body["tools"].is_array()) return 0;
  if (body.contains("chat_template_kwargs") && !body["chat_template_kwargs"].is_object()) return 0;
  const bool with_tools = body.contains("tools") && !body["tools"].empty();
  // continue_final_message as the body says (the route's rule: then no generation prompt).
  const bool continue_final = body.value("continue_final_message", false) == true;
  (void)nibble::server::render_chat_request(qwen3_template(), body, !continue_final, with_tools, continue_final);
  return 0;
}

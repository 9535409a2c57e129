// Test helper for the chat-template differential tests: renders one request per input line.
// Usage: chat_tool MODEL_DIR < requests.jsonl > out.jsonl   (out: {"prompt": ...} or {"error": ...})
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "text/chat.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: chat_tool MODEL_DIR\n";
    return 2;
  }
  auto chat = nibble::text::ChatTemplate::load(argv[1]);
  if (!chat) {
    std::cerr << chat.status().message() << "\n";
    return 1;
  }
  std::string line;
  while (std::getline(std::cin, line)) {
    auto prompt = (*chat)->render(nlohmann::ordered_json::parse(line));
    nlohmann::json out;
    if (prompt) out["prompt"] = *prompt;
    else out["error"] = prompt.status().message();
    std::cout << out.dump() << "\n";
  }
  return 0;
}

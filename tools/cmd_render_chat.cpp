// `nibble render-chat`: prints the prompt the server would build for an OpenAI-style chat request.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "text/chat.h"
#include "tools/command.h"

namespace nibble::tools {

CommandRunner register_render_chat(CLI::App& root) {
  auto* cmd = root.add_subcommand("render-chat", "Render a chat request with the model's chat template");
  struct Options {
    std::string model, request;
  };
  auto o = std::make_shared<Options>();
  cmd->add_option("--model", o->model, "Folder with tokenizer_config.json (or chat_template.jinja)")->required();
  cmd->add_option("--request", o->request,
                  "JSON request body: messages, tools, chat_template_kwargs, "
                  "add_generation_prompt (default true)")
      ->required();
  return [o] {
    std::ifstream in(o->request);
    if (!in) {
      std::fprintf(stderr, "nibble render-chat: %s: cannot open\n", o->request.c_str());
      return 1;
    }
    const auto request = nlohmann::ordered_json::parse(in, nullptr, false);
    if (request.is_discarded()) {
      std::fprintf(stderr, "nibble render-chat: %s: not valid JSON\n", o->request.c_str());
      return 1;
    }
    auto chat = text::ChatTemplate::load(o->model);
    if (!chat) {
      std::fprintf(stderr, "nibble render-chat: %s\n", chat.status().message().c_str());
      return 1;
    }
    auto prompt = (*chat)->render(request);
    if (!prompt) {
      std::fprintf(stderr, "nibble render-chat: %s\n", prompt.status().message().c_str());
      return 1;
    }
    std::fwrite(prompt->data(), 1, prompt->size(), stdout);
    return 0;
  };
}

}  // namespace nibble::tools

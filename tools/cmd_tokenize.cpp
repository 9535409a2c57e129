// `nibble tokenize` and `nibble detokenize`: the model's tokenizer on the command line.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "text/tokenizer.h"
#include "tools/command.h"
#include "tools/token_ids.h"

namespace nibble::tools {

CommandRunner register_tokenize(CLI::App& root) {
  auto* cmd = root.add_subcommand("tokenize", "Print the token ids of a text as a JSON array");
  struct Options {
    std::string model, text, file;
    bool no_special = false;
  };
  auto o = std::make_shared<Options>();
  cmd->add_option("--model", o->model, "Folder with tokenizer.json (or the file itself)")->required();
  auto* text = cmd->add_option("--text", o->text, "Text to encode");
  auto* file = cmd->add_option("--file", o->file, "File whose contents to encode");
  text->excludes(file);
  cmd->add_flag("--no-special", o->no_special, "Encode special tokens written in the text as plain text");
  return [o, text, file] {
    if (!*text && !*file) {
      std::fprintf(stderr, "nibble tokenize: give --text or --file\n");
      return 2;
    }
    auto tok = text::Tokenizer::load(o->model);
    if (!tok) {
      std::fprintf(stderr, "nibble tokenize: %s\n", tok.status().message().c_str());
      return 1;
    }
    std::string input = o->text;
    if (*file) {
      std::ifstream in(o->file, std::ios::binary);
      if (!in) {
        std::fprintf(stderr, "nibble tokenize: %s: cannot open\n", o->file.c_str());
        return 1;
      }
      std::stringstream buf;
      buf << in.rdbuf();
      input = buf.str();
    }
    const auto ids = (*tok)->encode(input, !o->no_special);
    std::printf("[");
    for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? ", " : "", ids[i]);
    std::printf("]\n");
    return 0;
  };
}

CommandRunner register_detokenize(CLI::App& root) {
  auto* cmd = root.add_subcommand("detokenize", "Print the text of comma-separated token ids");
  struct Options {
    std::string model, ids;
    bool skip_special = false;
  };
  auto o = std::make_shared<Options>();
  cmd->add_option("--model", o->model, "Folder with tokenizer.json (or the file itself)")->required();
  cmd->add_option("--ids", o->ids, "Token ids, e.g. 1,2,3")->required();
  cmd->add_flag("--skip-special", o->skip_special, "Leave special tokens out");
  return [o] {
    auto ids = parse_token_ids(o->ids, "--ids");
    if (!ids) {
      std::fprintf(stderr, "nibble detokenize: %s\n", ids.status().message().c_str());
      return 2;
    }
    auto tok = text::Tokenizer::load(o->model);
    if (!tok) {
      std::fprintf(stderr, "nibble detokenize: %s\n", tok.status().message().c_str());
      return 1;
    }
    for (int32_t id : *ids) {
      if (static_cast<size_t>(id) >= (*tok)->vocab_size()) {
        std::fprintf(stderr, "nibble detokenize: token id %d is outside the vocabulary (%zu)\n", id,
                     (*tok)->vocab_size());
        return 1;
      }
    }
    const std::string out = (*tok)->decode(*ids, o->skip_special);
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::printf("\n");
    return 0;
  };
}

}  // namespace nibble::tools

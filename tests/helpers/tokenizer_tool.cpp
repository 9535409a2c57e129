// Test helper for the tokenizer differential tests: one JSON value per input line, one per output
// line, so thousands of cases run in one process.
// Usage: tokenizer_tool TOKENIZER encode|encode-nospecial|encode-add-special|decode|decode-skip|stream
//   < in > out
//   encode*: line = JSON string → JSON id list (add-special: with the post-processor's tokens);  decode*: JSON id list → JSON string;
//   stream: JSON id list → JSON list of the pieces the incremental detokenizer emits (finish() last).
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "text/detokenizer.h"
#include "text/tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s TOKENIZER encode|encode-nospecial|encode-add-special|decode|decode-skip|stream\n", argv[0]);
    return 2;
  }
  auto tok = nibble::text::Tokenizer::load(argv[1]);
  if (!tok) {
    std::fprintf(stderr, "%s\n", tok.status().message().c_str());
    return 1;
  }
  const std::string mode = argv[2];
  std::string line;
  while (std::getline(std::cin, line)) {
    const nlohmann::json in = nlohmann::json::parse(line);
    nlohmann::json out;
    if (mode == "encode" || mode == "encode-nospecial" || mode == "encode-add-special") {
      out = (*tok)->encode(in.get<std::string>(), mode != "encode-nospecial", mode == "encode-add-special");
    } else if (mode == "stream") {
      nibble::text::IncrementalDetokenizer detok(**tok, /*skip_special_tokens=*/false);
      out = nlohmann::json::array();
      for (int32_t id : in.get<std::vector<int32_t>>()) out.push_back(detok.add(id));
      out.push_back(detok.finish());
    } else {
      out = (*tok)->decode(in.get<std::vector<int32_t>>(), mode == "decode-skip");
    }
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  return 0;
}

// How a nibble subcommand plugs into the CLI: it adds its options to a CLI11 subcommand and returns
// the function that runs it once parsed (exit status: 0 ok, 1 failure, 2 usage error).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace nibble::tools {

using CommandRunner = std::function<int()>;

// Each subcommand's registration, defined in its own cmd_<name>.cpp.
using Registration = CommandRunner (*)(CLI::App& root);

CommandRunner register_serve(CLI::App& root);
CommandRunner register_bench(CLI::App& root);
CommandRunner register_eval(CLI::App& root);
CommandRunner register_generate(CLI::App& root);
CommandRunner register_inspect(CLI::App& root);
CommandRunner register_quantize(CLI::App& root);
CommandRunner register_synth(CLI::App& root);
CommandRunner register_tokenize(CLI::App& root);
CommandRunner register_detokenize(CLI::App& root);
CommandRunner register_render_chat(CLI::App& root);

// Every subcommand, in the order `nibble --help` lists them.
inline constexpr Registration ALL_COMMANDS[] = {
    &register_serve, &register_bench,   &register_eval,     &register_generate,   &register_quantize,
    &register_synth, &register_inspect, &register_tokenize, &register_detokenize, &register_render_chat};

}  // namespace nibble::tools

// The `nibble` binary: parses the command line and runs one subcommand.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <string>

#include "core/env.h"
#include "tools/command.h"
#include "tools/version.h"

int main(int argc, char** argv) {
  using namespace nibble::tools;
  CLI::App app{"nibble: NVFP4 Mixture-of-Experts inference server (ModelOpt checkpoints, Hopper)", "nibble"};
  app.set_version_flag("-V,--version", std::string("nibble ") + NIBBLE_VERSION_STRING);
  app.add_flag_callback(
      "--help-env",
      [] {
        std::fputs(nibble::env_help().c_str(), stdout);
        throw CLI::Success();
      },
      "List the environment variables nibble reads, with their defaults");
  app.require_subcommand(0, 1);

  std::map<std::string, CommandRunner> runners;
  for (Registration registration : ALL_COMMANDS) {
    CommandRunner runner = registration(app);
    runners[app.get_subcommands({}).back()->get_name()] = std::move(runner);
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (CLI::App* sub : app.get_subcommands()) return runners.at(sub->get_name())();
  std::fputs(app.help().c_str(), stdout);
  return 0;
}

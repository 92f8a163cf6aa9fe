#pragma once

#include <CLI/CLI.hpp>

#include <map>
#include <string>
#include <vector>

namespace goodput {
// A torchrun command line (what follows `torchrun`) read as torchrun reads it: hyphen or underscore
// spellings, --opt=value or --opt value, -m; the options by hyphen spelling ("" for a flag), then
// the program and its arguments. No PET_ environment defaults. Throws std::runtime_error on an
// option torchrun does not have or one missing its value.
struct TorchrunLine {
  std::map<std::string, std::string> options;
  std::vector<std::string> program;
};
TorchrunLine parse_torchrun_line(const std::vector<std::string>& argv);

// `goodput torchrun [torchrun options] SCRIPT [ARGS]`: torchrun's command line, under Goodput.
void add_torchrun_command(CLI::App& app, int& rc);
}  // namespace goodput

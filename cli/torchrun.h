#pragma once

#include <CLI/CLI.hpp>

namespace goodput {
// `goodput torchrun [torchrun options] SCRIPT [ARGS]`: torchrun's command line, under Goodput.
void add_torchrun_command(CLI::App& app, int& rc);
}  // namespace goodput

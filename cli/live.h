#pragma once

#include <CLI/CLI.hpp>

namespace goodput {
// `goodput run | master | agent | inject`: supervise a real job.
void add_live_commands(CLI::App& app, int& rc);
}  // namespace goodput

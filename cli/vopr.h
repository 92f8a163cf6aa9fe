#pragma once

#include <CLI/CLI.hpp>

namespace goodput {
// `goodput vopr`: the live master under seeded simulation (vopr/vopr.h).
void add_vopr_command(CLI::App& app, int& rc);
}  // namespace goodput
